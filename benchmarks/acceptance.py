"""Does the drafter pay off? Served acceptance and speed, side by side with the baselines.

On held-out prompts the training never saw, in one run:

- served mean acceptance length (AL = 1 + accepted / drafts, greedy, vLLM's formula) of the
  trained drafter, of an untrained drafter of the same shape (random weights; the verifier's
  embeddings and head, as serving reloads them), and of n-gram (prompt lookup) drafting;
- the trainer's own estimate, its validation ``eal``, beside the served number;
- output tokens/s of the local engine with the drafter, with n-gram drafting, without
  speculation, and of ``transformers`` ``generate`` on the same verifier (same dtype, same
  threads); each prompt decoded ``--repeats`` times per mode, modes interleaved, the fastest
  run counts (the machine may be shared);
- whether every mode's output is token-identical to the verifier alone.

Given nothing, it is the new user's path: ``specdeck run`` in an empty directory (the embedded
default: SQLite, a real API and worker; it creates the demo verifier and data), the demo job it
prints submitted over HTTP and followed to ``succeeded``, then that job's chosen checkpoint
measured. The time from ``specdeck run`` to the job's success is printed too (the README's
"make run" promise, without the package install).

    .venv/bin/python benchmarks/acceptance.py [--json]
    .venv/bin/python benchmarks/acceptance.py --drafter CKPT_DIR --verifier DIR [--trainer-eal X]

``--json`` prints one JSON object as the last line: served_al, untrained_al, ngram_al,
trainer_eal, speedup_vs_nospec, nospec_vs_generate, identical, prompts (and more).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks._stack import free_port, load, machine, table  # noqa: E402

SPECDECK = str(Path(sys.executable).parent / "specdeck")


# --- the demo job, as a new user runs it --------------------------------------------------------

def run_demo_job(base: Path) -> dict[str, Any]:
    """``specdeck run`` in ``base``; submit the job it prints; wait for it. Returns the paths
    of the verifier and the chosen checkpoint, the trainer's eal and the timings."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    env.update(PYTHONUNBUFFERED="1", SPECDECK_DEFAULT_RUNTIME="local")
    log = base / "specdeck-run.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([SPECDECK, "run", "--port", str(port)], cwd=base, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        key, body = _printed_job(proc, log, timeout=600)
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            _wait(lambda: _healthy(client), 120, "the API")
            ready = time.monotonic()
            created = client.post("/api/jobs", json=body)
            created.raise_for_status()
            job_id = created.json()["id"]
            job = _wait(lambda: _ended(client, job_id), 1800, "the demo job")
            finished = time.monotonic()
            if job["status"] != "succeeded":
                raise RuntimeError(f"the demo job ended {job['status']}: {job['status_reason']}\n"
                                   + client.get(f"/api/jobs/{job_id}/logs").text[-3000:])
            checkpoints = client.get(f"/api/jobs/{job_id}/checkpoints").json()["data"]
            events = client.get(f"/api/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
    [chosen] = [c for c in checkpoints if c["id"] == job["evaluation"]["checkpoint_id"]]
    return {
        "job": job, "checkpoint": chosen, "events": events,
        "verifier": str(base / "var" / "models" / body["verifier"]),
        "drafter": chosen["path"],
        "trainer_eal": (chosen["metrics"] or {}).get("eal_epoch"),
        "seconds": {"specdeck_run_to_api_ready": round(ready - started, 1),
                    "job": round(finished - ready, 1),
                    "specdeck_run_to_job_succeeded": round(finished - started, 1)},
    }


def _printed_job(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[str, dict]:
    """The API key and the demo job body ``specdeck run`` prints once it is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        key = re.search(r"API key \(project '[^']+'\): (\S+)", text)
        body = re.search(r"-d '(\{.*\})'", text)
        if key and body:
            return key.group(1), json.loads(body.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"specdeck run exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"specdeck run printed no demo job within {timeout} s")


def _healthy(client: Any) -> bool:
    with contextlib.suppress(Exception):
        return client.get("/healthz").status_code == 200
    return False


def _ended(client: Any, job_id: str) -> dict | None:
    job = client.get(f"/api/jobs/{job_id}").json()
    return job if job["status"] in ("succeeded", "failed", "cancelled") else None


def _wait(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not done within {timeout} s")


# --- the measurement -----------------------------------------------------------------------------

def untrained_like(drafter: Path, out: Path) -> Path:
    """A drafter of the trained one's exact shape with fresh random weights (seeded); serving
    reloads the verifier's embeddings and head into it, as it does for the trained one."""
    import torch
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    from workers.runtimes.local.engine import resolve_drafter_dir

    config = DFlashSpeculatorConfig.from_pretrained(resolve_drafter_dir(drafter))
    torch.manual_seed(0)
    DFlashDraftModel(config).save_pretrained(out)
    return out


def measure_pair(verifier: Path, drafter: Path, prompts: list[list[dict[str, str]]],
                 max_tokens: int, repeats: int, work: Path) -> dict[str, Any]:
    import torch

    from benchmarks.local_engine import engine_generate, hf_generate, measure
    from app.runtimes import NGRAM_LOOKUP
    from workers.runtimes.local.speculation import LocalEngine

    trained = LocalEngine(verifier, {"method": "dflash", "model": str(drafter)})
    tokens = trained.num_speculative_tokens
    engines = {
        "dflash": trained,
        "untrained": LocalEngine(verifier, {"method": "dflash", "num_speculative_tokens": tokens,
                                            "model": str(untrained_like(drafter, work / "untrained"))}),
        "ngram": LocalEngine(verifier, {"method": "ngram", "num_speculative_tokens": tokens,
                                        **NGRAM_LOOKUP}),
        "no-spec": LocalEngine(verifier),
    }
    ids = [trained.render(messages) for messages in prompts]
    for engine in engines.values():
        engine.generate(ids[0], 8)  # warm-up
    modes = {"generate": lambda p: hf_generate(engines["no-spec"].verifier, p, max_tokens)}
    for name, engine in engines.items():
        modes[name] = lambda p, engine=engine: engine_generate(engine, p, max_tokens)
    results = {r.name: r for r in measure(modes, ids, repeats)}
    reference = results["no-spec"].outputs
    return {"results": results, "num_speculative_tokens": tokens,
            "identical": {name: sum(o == r for o, r in zip(res.outputs, reference, strict=True))
                          for name, res in results.items()},
            "threads": torch.get_num_threads()}


def report(measured: dict[str, Any], prompts: int, trainer_eal: float | None) -> dict[str, Any]:
    r = measured["results"]
    speed = {name: res.tokens_per_s for name, res in r.items()}
    figures = {
        "served_al": round(r["dflash"].acceptance_length, 3),
        "untrained_al": round(r["untrained"].acceptance_length, 3),
        "ngram_al": round(r["ngram"].acceptance_length, 3),
        "trainer_eal": trainer_eal,
        "speedup_vs_nospec": round(speed["dflash"] / speed["no-spec"], 3),
        "nospec_vs_generate": round(speed["no-spec"] / speed["generate"], 3),
        "ngram_speedup_vs_nospec": round(speed["ngram"] / speed["no-spec"], 3),
        "trained_vs_untrained_al": round(r["dflash"].acceptance_length
                                         / r["untrained"].acceptance_length, 3),
        "identical": min(measured["identical"].values()),
        "prompts": prompts,
        "tokens_per_s": {name: round(s, 1) for name, s in speed.items()},
        "num_speculative_tokens": measured["num_speculative_tokens"],
    }
    rows = [[name, res.tokens, f"{res.total_seconds:.2f}", f"{res.tokens_per_s:.1f}",
             f"{res.acceptance_length:.2f}" if name in ("dflash", "untrained", "ngram") else "-",
             f"{measured['identical'][name]}/{prompts}"] for name, res in r.items()]
    print(table(["mode", "tokens", "seconds", "tokens/s", "served AL", "identical"], rows))
    eal = f"{trainer_eal:.2f}" if trainer_eal is not None else "n/a"
    print(f"\nserved AL {figures['served_al']:.2f} (trained) vs {figures['untrained_al']:.2f} "
          f"(untrained, {figures['trained_vs_untrained_al']:.2f}x) vs {figures['ngram_al']:.2f} "
          f"(n-gram); the trainer's estimate: eal {eal}")
    print(f"speedup over no speculation: {figures['speedup_vs_nospec']:.2f}x "
          f"(n-gram {figures['ngram_speedup_vs_nospec']:.2f}x); no speculation vs "
          f"transformers generate: {figures['nospec_vs_generate']:.2f}x")
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
                  f"{seconds['specdeck_run_to_job_succeeded']} s\n")
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
