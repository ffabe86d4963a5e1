"""The flywheel's second half on the CPU, with a real worker, the real local engine and a real
`specdeck api` gateway: a deployment serves drafter A (a demo job's checkpoint); a retrain
(POST /api/deployments/{id}/retrain) warm-starts from A (init_from, speculators'
--from-pretrained), trains one epoch on regenerated data, passes its gate and, with "deploy",
promotes its checkpoint B while a client streams through the gateway without pause (the real
`openai` SDK, no retries): no request fails, B serves, A's engine is gone. A rollback brings A
back the same way, and a promotion to a broken drafter leaves A serving."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import Api, Stack
from tests.e2e.conftest import job_processes
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE
from tests.e2e.test_regeneration import SMALL_EVALUATION
from tests.e2e.test_serving import MAX_TOKENS, PROMPTS, deploy, gateway, greedy_reference  # noqa: F401
from tests.integration.test_dispatch import wait_for

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(1500),
    # Not yet seen passing end to end (issue 12 is open): its first run found the warm start's
    # dtype bug (fixed) and a gate the retrain missed (now relative to the served drafter's
    # AL); the promotion, rollback and broken-drafter steps have not run yet. Until they have,
    # it runs only when asked: SPECDECK_E2E_PROMOTION=1.
    pytest.mark.skipif(not os.environ.get("SPECDECK_E2E_PROMOTION"),
                       reason="unverified end to end; set SPECDECK_E2E_PROMOTION=1 to run it"),
]
NAME = "demo-live"


class Streamer(threading.Thread):
    """Streams the same chat request through the gateway back to back until stopped; every
    reply and every failure is kept."""

    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(daemon=True)
        self.client, self.halt = client, threading.Event()
        self.texts: list[str] = []
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                stream = self.client.chat.completions.create(
                    model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                    max_tokens=MAX_TOKENS, temperature=0, stream=True)
                self.texts.append("".join(c.choices[0].delta.content or "" for c in stream
                                          if c.choices))
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                self.failures.append(repr(exc))

    def finish(self) -> None:
        self.halt.set()
        self.join(timeout=120)


def engine_drafters(deployment_id: str) -> list[str]:
    """The drafter of each live engine process of the deployment (from its command line)."""
    drafters = []
    for pid in job_processes(deployment_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except FileNotFoundError:
            continue
        if "workers.runtimes.local.engine" in argv:
            drafters.append(json.loads(argv[argv.index("--speculative-config") + 1])["model"])
    return drafters


def promotion_done(api: Api, deployment_id: str, promotion_id: str) -> dict | None:
    rows = api.get(f"/api/deployments/{deployment_id}/promotions").json()["data"]
    [row] = [p for p in rows if p["id"] == promotion_id]
    return row if row["status"] in ("succeeded", "failed") else None


def switch_while_streaming(api: Api, client: openai.OpenAI, deployment_id: str,
                           job_id: str | None = None) -> tuple[dict, Streamer]:
    """Stream while the deployment's next promotion runs (the one ``job_id``'s deploy stage
    asks for, if given); returns it once it ended."""
    streamer = Streamer(client)
    streamer.start()
    try:
        def newest() -> dict | None:
            rows = api.get(f"/api/deployments/{deployment_id}/promotions").json()["data"]
            if job_id is not None and not rows:  # a job that ended without promoting: say why
                job = api.job(job_id)
                assert job["status"] in ("queued", "running"), job
            return rows[0] if rows and rows[0]["status"] in ("succeeded", "failed") else None

        done = wait_for(newest, 900, "the promotion to end")
        seen = len(streamer.texts)
        # A few more requests after the switch: the new engine answers them.
        wait_for(lambda: len(streamer.texts) >= seen + 2, 120, "requests after the switch")
    finally:
        streamer.finish()
    return done, streamer


def test_retrain_promote_while_streaming_rollback_and_a_broken_drafter(
        pg_api: Api, pg_stack: Stack, demo, gateway, demo_assets) -> None:  # noqa: F811
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE, SPECDECK_HEALTH_CHECK_SECONDS="0.5",
                          SPECDECK_PROMOTION_DRAIN_GRACE_SECONDS="1")
    first = pg_api.post("/api/jobs", json={**demo, "runtime": "local", "evaluate": SMALL_EVALUATION,
                                           "speculator": {**CPU_SPECULATOR, "epochs": 1}}).json()
    first = pg_api.wait_status(first["id"], {"succeeded", "failed"}, timeout=900)
    assert first["status"] == "succeeded", first
    [drafter_a] = pg_api.get(f"/api/jobs/{first['id']}/checkpoints").json()["data"]
    deployment = deploy(pg_api, {"name": NAME, "checkpoint_id": drafter_a["id"], "runtime": "local"})
    assert deployment["status"] == "ready", deployment
    dep_id, path = deployment["id"], f"/api/deployments/{deployment['id']}"
    assert engine_drafters(dep_id) == [drafter_a["path"]]
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=pg_api.key, max_retries=0)
    expected = greedy_reference(demo_assets[0], PROMPTS[0])

    # Retrain from the deployment: warm start from A, regenerated data, the gate, deploy.
    retrain = pg_api.post(path + "/retrain", json={
        "dataset": demo["dataset"], "speculator": {"epochs": 1},
        "data": {"max_samples": 40, "max_tokens": 96}, "evaluate": SMALL_EVALUATION,
        # The gate: at least as good as the drafter it replaces (within the evaluation's noise
        # on a few prompts).
        "gate": {"min_acceptance_length": round(first["evaluation"]["mean_acceptance_length"] - 0.05, 2)},
        "deploy": True})
    assert retrain.status_code == 201, retrain.text
    job = retrain.json()
    assert job["init_from"] == drafter_a["id"] and job["data"]["regenerate"] is True
    assert job["deploy"] == {"deployment": NAME, "deployment_id": dep_id}
    # The stream starts before the job's deploy stage, so that it spans the switch.
    wait_for(lambda: pg_api.job(job["id"])["stage"] in ("evaluating", "deploying")
             or pg_api.job(job["id"])["status"] != "running", 900, "the retrain's evaluation")
    promoted, streamer = switch_while_streaming(pg_api, client, dep_id, job["id"])
    done = pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=60)
    assert done["status"] == "succeeded", (done, pg_api.get(f"/api/jobs/{job['id']}/logs").text[-3000:])
    assert done["evaluation"]["gate"]["passed"] is True
    [drafter_b] = [c for c in pg_api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
                   if c["id"] == done["evaluation"]["checkpoint_id"]]

    # The warm start: the trainer was handed A's weights and its very first step already
    # predicts far better than the cold start's first step did.
    argv = [e for e in pg_api.events(job["id"]) if e["kind"] == "process"
            and "--from-pretrained" in (e["data"] or {}).get("argv", [])]
    assert argv and argv[0]["data"]["argv"][argv[0]["data"]["argv"].index("--from-pretrained") + 1] \
        == drafter_a["path"]
    first_loss = {j: pg_api.get(f"/api/jobs/{j}/metrics", params={"name": "train/loss"}).json()["data"][0]["value"]
                  for j in (first["id"], job["id"])}
    assert first_loss[job["id"]] < 0.5 * first_loss[first["id"]], first_loss

    assert promoted["status"] == "succeeded", promoted
    assert promoted["job_id"] == job["id"] and promoted["kind"] == "promote"
    assert streamer.failures == [], streamer.failures
    assert len(streamer.texts) >= 3 and set(streamer.texts) == {expected}  # lossless on A and B
    row = pg_api.get(path).json()
    assert row["status"] == "ready" and row["drafter"] == drafter_b["path"]
    assert row["source"]["checkpoint_id"] == drafter_b["id"]
    wait_for(lambda: engine_drafters(dep_id) == [drafter_b["path"]], 30, "A's engine to be gone")
    b_upstream = pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=dep_id)
    steps = [e["data"]["step"] for e in pg_api.get(path + "/events", params={"limit": 100}).json()["data"]
             if e["kind"] == "promotion" and e["data"]["promotion"] == promoted["id"]]
    assert steps == ["pending", "starting", "ready", "draining", "succeeded"], steps
    # The deployment never left ready: no status event since it first became ready.
    statuses = [e["status"] for e in pg_api.get(path + "/events", params={"limit": 100}).json()["data"]
                if e["kind"] == "status"]
    assert statuses[-1] == "ready" and statuses.count("ready") == 1, statuses

    # Rollback: back to A the same way, streaming throughout.
    rollback = pg_api.post(path + "/rollback")
    assert rollback.status_code == 202, rollback.text
    assert rollback.json()["target"]["drafter"] == drafter_a["path"]
    rolled, streamer = switch_while_streaming(pg_api, client, dep_id)
    assert rolled["id"] == rollback.json()["id"] and rolled["status"] == "succeeded", rolled
    assert streamer.failures == [] and set(streamer.texts) == {expected}
    assert pg_api.get(path).json()["drafter"] == drafter_a["path"]
    wait_for(lambda: engine_drafters(dep_id) == [drafter_a["path"]], 30, "B's engine to be gone")
    assert pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=dep_id) != b_upstream

    # A broken drafter (its weights are garbage): the new engine never becomes ready, the
    # promotion fails, and A serves on without a pause.
    broken = broken_checkpoint(pg_stack, first["id"], Path(drafter_a["path"]))
    upstream = pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=dep_id)
    promote = pg_api.post(path + "/promote", json={"checkpoint_id": broken})
    assert promote.status_code == 202, promote.text
    failed, streamer = switch_while_streaming(pg_api, client, dep_id)
    assert failed["status"] == "failed" and "did not become ready" in failed["status_reason"], failed
    assert streamer.failures == [] and set(streamer.texts) == {expected}
    after = pg_api.get(path).json()
    assert after["status"] == "ready" and after["drafter"] == drafter_a["path"]
    assert pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=dep_id) == upstream
    assert engine_drafters(dep_id) == [drafter_a["path"]]
    assert httpx.get(f"{upstream}/health", timeout=5).status_code == 200


def broken_checkpoint(stack: Stack, job_id: str, good: Path) -> str:
    """A checkpoint row whose directory has a valid DFlash config.json and garbage weights."""
    from app.db import session_scope
    from app.db.models import Checkpoint

    directory = Path(stack.env["SPECDECK_WORK_ROOT"]) / "broken-drafter"
    shutil.copytree(good, directory)
    (directory / "model.safetensors").write_bytes(b"not safetensors at all")
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job_id, epoch=99, path=str(directory))
        session.add(checkpoint)
        session.flush()
        return checkpoint.id
