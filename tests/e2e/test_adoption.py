"""Engines outlive their worker (workers/adoption.py): under `specdeck run`, a deployment answers a
loop of chat requests through the gateway while its worker is SIGKILLed; `specdeck run` starts
another worker, which adopts the engine still serving instead of killing it. The engine's
processes are the same afterwards, and at most 2 % of the requests fail."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.e2e.conftest import engine_processes, free_port, job_processes
from tests.e2e.test_make_run import all_events, worker_of
from tests.support.drafters import write_untrained_drafter
from tests.support.specdeck_run import seed_demo, start
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REQUESTS = 100
KILL_AFTER = 15  # requests answered before the worker is killed


def test_a_killed_workers_engine_is_adopted_and_serves_on(tmp_path: Path, demo_assets) -> None:
    seed_demo(tmp_path, demo_assets)
    verifier = tmp_path / "var" / "models" / "demo"
    drafter = write_untrained_drafter(verifier, tmp_path / "var" / "models" / "untrained")
    run = start(tmp_path, free_port(), args=("--no-demo",))
    answered: list[float] = []
    failed: list[str] = []
    try:
        run.wait_ready()
        api = httpx.Client(base_url=run.url, headers={"Authorization": f"Bearer {run.key}"},
                           timeout=30)
        created = api.post("/api/deployments", json={
            "name": "adoptee", "drafter": str(drafter), "verifier": str(verifier),
            "runtime": "local", "num_speculative_tokens": 3})
        assert created.status_code == 201, created.text
        deployment = created.json()["id"]
        wait_for(lambda: api.get(f"/api/deployments/{deployment}").json()["status"] == "ready",
                 300, "the deployment to be ready")
        engine = sorted(engine_processes(deployment))
        everything = sorted(job_processes(deployment))
        assert engine, "no engine process found"

        client = openai.OpenAI(base_url=f"{run.url}/v1", api_key=run.key, max_retries=0,
                               timeout=60)

        def chat() -> None:
            for i in range(REQUESTS):
                try:
                    reply = client.chat.completions.create(
                        model="adoptee", max_tokens=6, temperature=0,
                        messages=[{"role": "user", "content": f"Count to {i % 7 + 3}."}])
                    assert reply.choices[0].message.content is not None
                    answered.append(time.monotonic())
                except Exception as exc:  # what a client would see
                    failed.append(f"request {i}: {type(exc).__name__}: {exc}")

        loop = threading.Thread(target=chat, name="chat-loop", daemon=True)
        loop.start()
        wait_for(lambda: len(answered) >= KILL_AFTER, 120, f"{KILL_AFTER} answers")
        worker = worker_of(run)
        assert worker is not None
        os.kill(worker.pid, signal.SIGKILL)
        wait_for(lambda: "worker exited with code -9; restarting" in run.output(), 30,
                 "the supervisor's restart line")
        wait_for(lambda: (w := worker_of(run)) is not None and w.pid != worker.pid, 30,
                 "a new worker")
        events = wait_for(lambda: (e := all_events(api, f"/api/deployments/{deployment}/events"))
                          and any(x["kind"] == "adopted" for x in e) and e, 120,
                          "the new worker to adopt the engine")
        loop.join(timeout=600)
        assert not loop.is_alive()

        # Adopted: the same processes serve, the deployment never left "ready".
        assert sorted(engine_processes(deployment)) == engine, (engine, engine_processes(deployment))
        assert sorted(job_processes(deployment)) == everything
        row = api.get(f"/api/deployments/{deployment}").json()
        assert row["status"] == "ready", row
        adopted = next(x for x in events if x["kind"] == "adopted")
        assert adopted["data"]["pid"] in engine, adopted
        assert not [x for x in events if x["kind"] == "orphans_stopped"], events
        assert len(failed) <= REQUESTS * 0.02, failed
        assert len(answered) + len(failed) == REQUESTS

        # The adopted engine is this worker's to stop: a delete stops every process it had.
        stopped = api.delete(f"/api/deployments/{deployment}")
        assert stopped.status_code == 200, stopped.text
        wait_for(lambda: api.get(f"/api/deployments/{deployment}").json()["status"] == "stopped",
                 120, "the deployment to stop")
        wait_for(lambda: job_processes(deployment) == [], 60, "its processes to be gone")
        api.close()
    finally:
        run.interrupt()
        run.kill()
    left = [p for p in everything if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, left
