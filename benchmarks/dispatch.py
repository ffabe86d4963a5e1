"""Dispatch latency: from just before ``POST /api/jobs`` to the worker's claim (status running).

Real processes over real HTTP: ``specdeck api`` (uvicorn) and ``specdeck worker`` (Celery) as
subprocesses, the worker running a pipeline with no stages so that only dispatch is measured.
Two backends side by side in one run:

* postgres+redis: a fresh Postgres database (migrated by ``specdeck db upgrade``) and Redis with
  a queue of its own;
* embedded: the default SQLite file and kombu's ``sqla+sqlite`` broker (polled every 0.1 s).

Jobs are posted one at a time; the next is posted once the previous one has finished and the
worker is idle. Dispatch latency = ``created_at`` of the job's "claimed by" event (written by
the worker in the claim transaction) minus the wall time just before the POST. Also shown: the
bare POST round trip and when the API wrote the "job created" event.

    .venv/bin/python benchmarks/dispatch.py [--quick] [--jobs N]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stack import (  # noqa: E402
    REDIS_URL,
    Processes,
    Summary,
    base_env,
    clean_redis_queue,
    create_key,
    exit_on_sigterm,
    load,
    machine,
    ms,
    postgres_database,
    ratio,
    roots,
    specdeck,
    table,
    write_dataset,
    write_verifier,
)

TARGET_P50 = 0.5  # seconds, POST -> running
TERMINAL = {"succeeded", "failed", "cancelled"}
POLL = 0.025  # seconds between status polls (the latency comes from the event, not the poll)
JOB_TIMEOUT = 30.0
BACKENDS = ("postgres+redis", "embedded")


@dataclass(frozen=True)
class Sample:
    post: float  # POST round trip
    created: float  # POST start -> "job created" event (the API inserting the row, before commit)
    dispatch: float  # POST start -> "claimed by" event (worker claim: status running)
    first_get_404: bool  # GET /api/jobs/{id} sent right after the 201 did not find the job


@dataclass
class Result:
    backend: str
    samples: list[Sample]

    def summary(self, field: str) -> Summary:
        return Summary.of([getattr(s, field) for s in self.samples])


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _get(client, path: str, **params: object) -> dict | None:  # noqa: ANN001 (httpx.Client)
    """The JSON body, or None for a 404 (the POST's transaction may not be committed yet)."""
    response = client.get(path, params=params)
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise RuntimeError(f"GET {path} answered {response.status_code}: {response.text}")
    return response.json()


def measure_one(client, body: dict) -> Sample:  # noqa: ANN001 (httpx.Client)
    t0 = time.time()
    response = client.post("/api/jobs", json=body)
    post = time.time() - t0
    if response.status_code != 201:
        raise RuntimeError(f"POST /api/jobs answered {response.status_code}: {response.text}")
    job_id = response.json()["id"]
    deadline = time.monotonic() + JOB_TIMEOUT
    # The first GET goes out at once: a 404 there means the 201 arrived before the commit.
    first_get_404 = None
    while True:
        job = _get(client, f"/api/jobs/{job_id}")
        if first_get_404 is None:
            first_get_404 = job is None
        if job is not None and job["status"] in TERMINAL:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{job_id} still {job and job['status']} after {JOB_TIMEOUT} s")
        time.sleep(POLL)
    events = _get(client, f"/api/jobs/{job_id}/events", limit=100)["data"]
    if job["status"] != "succeeded":
        raise RuntimeError(f"{job_id} ended {job['status']}: {events}")
    created = next(e for e in events if e["message"] == "job created")
    claimed = next(e for e in events if e["message"].startswith("claimed by"))
    return Sample(post=post, created=_ts(created["created_at"]) - t0,
                  dispatch=_ts(claimed["created_at"]) - t0, first_get_404=first_get_404)


def run_backend(backend: str, base: Path, jobs: int, warmup: int, rng: random.Random) -> Result:
    import httpx

    base.mkdir(parents=True)
    queue = f"specdeck-bench-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        if backend == "postgres+redis":
            db_url = stack.enter_context(postgres_database("specdeck_bench_dispatch"))
            broker_url = REDIS_URL
            stack.callback(clean_redis_queue, queue)
        else:
            db_url = f"sqlite:///{base}/specdeck.db"
            broker_url = f"sqla+sqlite:///{base}/broker.db"
        env = base_env(
            SPECDECK_DATABASE_URL=db_url, SPECDECK_BROKER_URL=broker_url, SPECDECK_QUEUE=queue,
            SPECDECK_PIPELINE="benchmarks._stack:EMPTY_PIPELINE", SPECDECK_WORKER_GPUS="",
            SPECDECK_WORKER_NAME=f"bench-{uuid.uuid4().hex[:6]}", SPECDECK_DEFAULT_RUNTIME="local",
            **roots(base))
        specdeck(env, "db", "upgrade")
        key = create_key(env, "bench")
        body = {"verifier": write_verifier(base / "models"),
                "dataset": write_dataset(base / "data"), "runtime": "local"}
        procs = stack.enter_context(Processes(base))
        api_url = procs.api("api", env)
        procs.worker("worker", env)
        samples = []
        with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as client:
            for i in range(warmup + jobs):
                sample = measure_one(client, body)
                if i >= warmup:
                    samples.append(sample)
                # Let the worker ack and go back to waiting; vary the phase against broker polls.
                time.sleep(rng.uniform(0.05, 0.15))
        return Result(backend, samples)


def report(results: dict[str, Result], command: str, load_before: float) -> None:
    print(f"\n## Dispatch latency\n\nmachine: {machine()}\ncommand: `{command}`\n"
          f"1-minute load average: {load_before:.2f} before, {load():.2f} after\n")
    rows = []
    for name, result in results.items():
        for label, field in (("POST round trip", "post"),
                             ("POST -> job row inserted (API)", "created"),
                             ("POST -> running (dispatch)", "dispatch")):
            s = result.summary(field)
            rows.append([name, label, s.n, ms(s.p50), ms(s.p95), ms(s.max)])
    print(table(["backend", "measure", "n", "p50 ms", "p95 ms", "max ms"], rows))
    print()
    ratio_rows = []
    for name, result in results.items():
        ratio_rows.append([f"{name}: dispatch p50 / POST p50",
                           ratio(result.summary("dispatch").p50, result.summary("post").p50)])
    if len(results) == 2:
        pg, emb = results["postgres+redis"], results["embedded"]
        ratio_rows.append(["embedded / postgres+redis: dispatch p50",
                           ratio(emb.summary("dispatch").p50, pg.summary("dispatch").p50)])
        ratio_rows.append(["embedded / postgres+redis: POST p50",
                           ratio(emb.summary("post").p50, pg.summary("post").p50)])
    print(table(["ratio", "value"], ratio_rows))
    print()
    for name, result in results.items():
        misses = sum(s.first_get_404 for s in result.samples)
        print(f"{name}: GET /api/jobs/{{id}} sent right after the 201 answered 404 for "
              f"{misses} of {len(result.samples)} jobs "
              "(a 404 means the 201 went out before the commit)")
    print()
    for name, result in results.items():
        p50 = result.summary("dispatch").p50
        verdict = "met" if p50 <= TARGET_P50 else "MISSED"
        print(f"target dispatch p50 <= {TARGET_P50 * 1000:.0f} ms on {name}: "
              f"{ms(p50)} ms -> {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10 jobs per backend instead of 50")
    parser.add_argument("--jobs", type=int, help="measured jobs per backend")
    parser.add_argument("--backend", choices=BACKENDS, action="append",
                        help="only this backend (repeatable; default both)")
    args = parser.parse_args(argv)
    jobs = args.jobs or (10 if args.quick else 50)
    warmup = 2 if args.quick else 3
    exit_on_sigterm()
    rng = random.Random(1234)
    load_before = load()
    started = time.monotonic()
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-dispatch-") as tmp:
        for backend in args.backend or BACKENDS:
            print(f"[{time.monotonic() - started:5.1f} s] {backend}: {warmup} warm-up + {jobs} jobs",
                  flush=True)
            results[backend] = run_backend(backend, Path(tmp) / backend.replace("+", "-"),
                                           jobs, warmup, rng)
    command = " ".join([".venv/bin/python", "benchmarks/dispatch.py", *(argv or sys.argv[1:])])
    report(results, command, load_before)
    print(f"\n(total {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
