"""Pipeline overhead of the demo job: what SpecDeck adds around the real work.

Side by side in one run:
1. SpecDeck: a real `specdeck api` and `specdeck worker` (Postgres + Redis), the demo dataset
   uploaded, the demo job submitted over HTTP and followed to `succeeded`. From the job's events:
   wall time (created -> succeeded) and the time inside the work (hidden-states server start-up
   until ready, prepare-data, the trainer). Overhead = wall - inside, as a percentage.
2. Direct: the same three commands, taken from the job's own plan (`GET /plan`), run by hand one
   after the other with nothing around them.
It prints both, the overhead percentage, and the ratio SpecDeck wall / direct wall.

    .venv/bin/python benchmarks/pipeline_overhead.py [--quick] [--epochs N]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stack import (  # noqa: E402
    REDIS_URL,
    Processes,
    base_env,
    clean_redis_queue,
    create_key,
    exit_on_sigterm,
    free_port,
    load,
    machine,
    postgres_database,
    roots,
    specdeck,
    table,
)

CPU_SPECULATOR = {"block_size": 8, "max_anchors": 32, "total_seq_len": 512}


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def specdeck_run(base: Path, model: Path, data: Path, epochs: int) -> tuple[dict, list[dict]]:
    """Run the demo job through SpecDeck; return its plan and its events."""
    env_roots = {**roots(base / "specdeck"), "SPECDECK_MODELS_ROOT": str(model.parent)}
    queue = f"specdeck-bench-{os.getpid()}"
    with postgres_database("specdeck_bench_pipeline") as url, Processes(base) as procs:
        env = base_env(SPECDECK_DATABASE_URL=url, SPECDECK_BROKER_URL=REDIS_URL,
                       SPECDECK_QUEUE=queue, SPECDECK_WORKER_NAME="bench-worker", **env_roots)
        try:
            specdeck(env, "db", "upgrade")
            key = create_key(env, "bench")
            api = procs.api("api", env)
            procs.worker("worker", env)
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=api, headers=headers, timeout=30) as client:
                with data.open("rb") as f:
                    dataset = client.post("/api/datasets", files={"file": ("demo.jsonl", f)}).json()["id"]
                job = client.post("/api/jobs", json={
                    "verifier": model.name, "dataset": dataset, "runtime": "local",
                    "speculator": {**CPU_SPECULATOR, "epochs": epochs},
                    # The by-hand run has no evaluation: compare the same work.
                    "evaluate": False}).json()
                deadline = time.monotonic() + 1800
                while time.monotonic() < deadline:
                    status = client.get(f"/api/jobs/{job['id']}").json()["status"]
                    if status in ("succeeded", "failed", "cancelled"):
                        break
                    time.sleep(0.5)
                if status != "succeeded":
                    raise RuntimeError(f"the demo job ended {status}:\n"
                                       + client.get(f"/api/jobs/{job['id']}/logs").text[-3000:])
                events = client.get(f"/api/jobs/{job['id']}/events", params={"limit": 100}).json()["data"]
                plan = client.get(f"/api/jobs/{job['id']}/plan").json()
                return plan, events
        finally:
            clean_redis_queue(queue)


def inside_seconds(events: list[dict]) -> dict[str, float]:
    """Time inside the work, from the process events the supervisor records."""
    starts = [e for e in events if e["kind"] == "process" and e["message"].startswith("starting:")]
    server_start = ts(next(e["created_at"] for e in starts if "hidden-states server" in e["message"]))
    ready = ts(next(e["created_at"] for e in events if e["kind"] == "verifier_ready"))
    exited = {e["message"].split(" exited with", 1)[0]: e["data"]["seconds"]
              for e in events if e["kind"] == "process" and " exited with " in e["message"]}
    prepare = sum(s for name, s in exited.items() if "prepare-data" in name)
    trainer = sum(s for name, s in exited.items() if "trainer" in name)
    return {"server start-up": (ready - server_start).total_seconds(), "prepare-data": prepare,
            "trainer": trainer}


def direct_run(plan: dict, job_root: str, base: Path, *, directory: str = "direct",
               env_changes: Mapping[str, str | None] | None = None) -> dict[str, float]:
    """The same commands by hand: server, wait ready, prepare-data, trainer. Each runs in
    ``base / directory``, with the plan's environment and then ``env_changes`` (None unsets)."""
    root = base / directory
    root.mkdir()
    port = free_port()

    def argv(stage: dict) -> list[str]:
        return [a.replace("<port>", str(port)).replace(job_root, str(root)) for a in stage["argv"]]

    def env(stage: dict) -> dict[str, str]:
        merged = {**os.environ, **stage["env"], **(env_changes or {})}
        return {key: value for key, value in merged.items() if value is not None}

    by_stage = {s["stage"]: s for s in plan["stages"]}
    timings: dict[str, float] = {}
    start = time.monotonic()
    with (root / "server.log").open("wb") as log:
        server = subprocess.Popen(argv(by_stage["starting_verifier"]), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env=env(by_stage["starting_verifier"]))
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise RuntimeError("the server exited: " + (root / "server.log").read_text()[-2000:])
            time.sleep(0.5)
        timings["server start-up"] = time.monotonic() - start
        for name, stage in (("prepare-data", "preparing_data"), ("trainer", "training")):
            began = time.monotonic()
            with (root / f"{stage}.log").open("wb") as log:
                subprocess.run(argv(by_stage[stage]), stdout=log, stderr=subprocess.STDOUT,
                               env=env(by_stage[stage]), check=True)
            timings[name] = time.monotonic() - began
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    timings["wall"] = time.monotonic() - start
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one epoch")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    epochs = 1 if args.quick else args.epochs
    exit_on_sigterm()
    from workers.runtimes.local.demo import create_demo_model, write_demo_data

    with tempfile.TemporaryDirectory(prefix="specdeck-bench-pipeline-") as tmp:
        base = Path(tmp)
        model = create_demo_model(base / "models" / "demo")
        data = write_demo_data(model, base / "demo.jsonl")
        plan, events = specdeck_run(base, model, data, epochs)
        created = ts(events[0]["created_at"])
        finished = ts(next(e["created_at"] for e in events if e["status"] == "succeeded"))
        wall = (finished - created).total_seconds()
        inside = inside_seconds(events)
        training = next(s for s in plan["stages"] if s["stage"] == "training")["argv"]
        job_root = str(Path(training[training.index("--save-path") + 1]).parent)
        direct = direct_run(plan, job_root, base)

    overhead = wall - sum(inside.values())
    print(f"\n## Pipeline overhead of the demo job ({epochs} epoch(s)); {machine()}, load {load():.1f}\n")
    rows = [[name, f"{inside[name]:.1f} s", f"{direct[name]:.1f} s"] for name in inside]
    rows.append(["wall (job created -> succeeded / commands by hand)", f"{wall:.1f} s", f"{direct['wall']:.1f} s"])
    print(table(["", "SpecDeck", "direct"], rows))
    print(f"\noverhead: {overhead:.1f} s = {100 * overhead / wall:.1f}% of the job's wall time")
    print(f"ratio SpecDeck wall / direct wall: {wall / direct['wall']:.2f}x")


if __name__ == "__main__":
    main()
