"""From a job to /v1/chat/completions on the CPU: a demo job trains a drafter (everything
tests/e2e/test_pipeline.py's ``assert_demo_job`` asks of it: checkpoints, metrics, the served
evaluation), a local-runtime deployment serves it with the verifier, and the real `openai` SDK talks to the gateway of a
real `specdeck api` server. The text must be token-identical to the verifier's own greedy
decoding, and the engine's speculative-decoding counters must show an acceptance length > 1.
A Hub drafter id (a directory laid out as a Hub snapshot) deploys through the same path."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import Api, Stack
from tests.e2e.conftest import DemoDrafter, engine_processes, first_loss, job_processes
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE, assert_demo_job, submit
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
PROMPTS = ["Tell me about the river and the old mill.", "What does the blue lantern do at night?"]
MAX_TOKENS = 48


def greedy_reference(model_dir: Path, prompt: str) -> str:
    """The verifier decoding alone, greedily: what speculative decoding must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                        add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def counters(upstream: str) -> dict[str, float]:
    text = httpx.get(f"{upstream}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def running(upstream: str) -> float:
    text = httpx.get(f"{upstream}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def requests_cut_by_a_crash(client: openai.OpenAI, upstream: str, deployment_id: str
                            ) -> dict[str, object]:
    """A long plain and a long streamed request on the engine; SIGKILL of the engine's processes
    once both run. Returns what each got (an exception, or "completed")."""
    outcomes: dict[str, object] = {}
    long = {"model": "demo-dflash", "max_tokens": 1500, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "extra_body": {"ignore_eos": True}}

    def send(kind: str) -> None:
        try:
            if kind == "stream":
                for _ in client.chat.completions.create(**long, stream=True):
                    pass
            else:
                client.chat.completions.create(**long)
            outcomes[kind] = "completed"
        except openai.APIError as exc:
            outcomes[kind] = exc

    threads = [threading.Thread(target=send, args=(kind,)) for kind in ("plain", "stream")]
    for thread in threads:
        thread.start()
    wait_for(lambda: running(upstream) >= 2, 60, "both requests on the engine")
    for pid in engine_processes(deployment_id):
        os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a request hung"
    return outcomes


def deploy(api: Api, body: dict) -> dict:
    created = api.post("/api/deployments", json=body)
    assert created.status_code == 201, created.text
    return wait_for(lambda: (d := api.get(f"/api/deployments/{created.json()['id']}").json())
                    ["status"] in ("ready", "failed") and d, 300, "the deployment to be ready")


def test_train_deploy_and_chat_through_the_gateway(pg_api: Api, pg_stack: Stack, demo, gateway,
                                                   demo_assets, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   demo_drafter: DemoDrafter) -> None:
    from huggingface_hub import constants

    hub_cache = tmp_path / "hub"  # where huggingface_hub finds Hub drafters (offline here)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE, HF_HUB_CACHE=str(hub_cache), HF_HUB_OFFLINE="1")
    job = submit(pg_api, demo, epochs=2)
    pg_api.wait_status(job["id"], {"succeeded", "failed", "cancelled"}, timeout=900)
    best = assert_demo_job(pg_api, pg_stack, job["id"])

    deployment = deploy(pg_api, {"name": "demo-dflash", "checkpoint_id": best["id"], "runtime": "local"})
    assert deployment["status"] == "ready", deployment
    assert deployment["num_speculative_tokens"] == CPU_SPECULATOR["block_size"] - 1

    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=pg_api.key, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["demo-dflash"]
    upstream = pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=deployment["id"])
    before = counters(upstream)
    model_dir = demo_assets[0]
    for prompt in PROMPTS:
        expected = greedy_reference(model_dir, prompt)
        messages = [{"role": "user", "content": prompt}]
        reply = client.chat.completions.create(model="demo-dflash", messages=messages,
                                               max_tokens=MAX_TOKENS, temperature=0)
        assert reply.choices[0].message.content == expected
        assert reply.usage.completion_tokens > 0
        stream = client.chat.completions.create(model="demo-dflash", messages=messages,
                                                max_tokens=MAX_TOKENS, temperature=0, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected
    after = counters(upstream)
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before.get("vllm:spec_decode_num_accepted_tokens_total", 0))
    assert drafts > 0
    assert 1 + accepted / drafts > 1.0, (accepted, drafts)
    # The session's demo drafter, for tests that serve one or retrain from it.
    demo_drafter.keep(best["path"], pg_stack.scalar("SELECT spec FROM jobs WHERE id = :id", id=job["id"]),
                      first_loss(pg_api, job["id"]))
    # Usage is written in batches (SPECDECK_GATEWAY_USAGE_FLUSH_SECONDS): wait for the flush.
    wait_for(lambda: (pg_stack.scalar("SELECT sum(completion_tokens) FROM usage") or 0) > 0, 60,
             "the usage rows")

    # A crash mid-request: the engine dies with a plain and a streamed request on it; each gets
    # an OpenAI-shaped error, never a hang; the worker restarts it with backoff; it serves again.
    outcomes = requests_cut_by_a_crash(client, upstream, deployment["id"])
    plain, streamed = outcomes["plain"], outcomes["stream"]
    assert isinstance(plain, openai.APIStatusError) and plain.status_code in (502, 503), plain
    assert plain.body["code"] in ("upstream_error", "upstream_unavailable"), plain.body
    assert isinstance(streamed, openai.APIError) and streamed.body["code"] == "upstream_error", streamed
    restarted = wait_for(lambda: (d := pg_api.get(f"/api/deployments/{deployment['id']}").json())
                         ["restarts"] == 1 and d["status"] == "ready" and d, 180, "the restart")
    events = pg_stack.scalar("SELECT count(*) FROM deployment_events WHERE deployment_id = :id "
                             "AND status = 'starting' AND message LIKE '%restart 1 in 2 s'",
                             id=deployment["id"])
    assert events == 1, restarted
    reply = client.chat.completions.create(model="demo-dflash", max_tokens=MAX_TOKENS, temperature=0,
                                           messages=[{"role": "user", "content": PROMPTS[0]}])
    assert reply.choices[0].message.content == greedy_reference(model_dir, PROMPTS[0])

    # Delete: the engine stops, its slot is freed, the model disappears from the gateway.
    pg_api.delete(f"/api/deployments/{deployment['id']}")
    wait_for(lambda: pg_api.get(f"/api/deployments/{deployment['id']}").json()["status"] == "stopped",
             60, "the deployment to stop")
    wait_for(lambda: job_processes(deployment["id"]) == [], 30, "the engine to exit")
    wait_for(lambda: client.models.list().data == [], 60, "the model to leave /v1/models")

    # The no-training path: the same drafter under a Hub id (a directory laid out as a Hub
    # snapshot), resolved by huggingface_hub and served through the same worker code.
    revision = "b" * 40
    repo = hub_cache / "models--z-lab--demo-dflash"
    shutil.copytree(best["path"], repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    hub = deploy(pg_api, {"name": "hub-drafter", "drafter": "z-lab/demo-dflash", "verifier": "demo",
                          "runtime": "local"})
    assert hub["status"] == "ready", hub
    assert hub["source"]["kind"] == "hub" and hub["drafter"] == "z-lab/demo-dflash"
    reply = client.chat.completions.create(model="hub-drafter", max_tokens=MAX_TOKENS, temperature=0,
                                           messages=[{"role": "user", "content": PROMPTS[0]}])
    assert reply.choices[0].message.content == greedy_reference(model_dir, PROMPTS[0])
    pg_api.delete(f"/api/deployments/{hub['id']}")
    wait_for(lambda: job_processes(hub["id"]) == [], 60, "the engine to exit")
