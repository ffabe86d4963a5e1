"""A worker SIGKILLed while it serves leaves its engine running (the engine lives in a session of
its own). It is found and stopped, with the deployment's events saying so, by the reconciler of
another worker once the lease runs out, and by the same worker when it starts again if the
engine no longer answers (one that answers, it adopts: tests/e2e/test_adoption.py); the port
and the memory it held are free, and the deployment is served again."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.conftest import Api, Stack
from tests.e2e.conftest import job_processes
from tests.e2e.test_live_acceptance import ngram_deployment, wait_ready
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def engine_of(stack: Stack, deployment_id: str) -> tuple[int, list[int]]:
    """The engine's port and its live processes."""
    url = stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id", id=deployment_id)
    return int(url.rsplit(":", 1)[1].split("/")[0]), job_processes(deployment_id)


def listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN}


def orphans_stopped(api: Api, deployment_id: str) -> list[dict]:
    events = api.get(f"/api/deployments/{deployment_id}/events", params={"limit": 100}).json()["data"]
    return [e for e in events if e["kind"] == "orphans_stopped"]


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)


def test_a_killed_workers_engine_is_stopped_by_another_worker_and_by_its_restart(
        pg_api: Api, pg_stack: Stack, demo) -> None:
    first = pg_stack.start_worker("engine-host-1")
    deployment_id = ngram_deployment(pg_api, pg_stack, "orphan-demo")
    wait_ready(pg_api, deployment_id)
    port, engine = engine_of(pg_stack, deployment_id)
    assert engine and listeners(port) & set(engine)

    first.kill()  # SIGKILL: it cannot stop its engine
    assert not gone(engine), "the engine should have outlived its SIGKILLed worker"

    # Another worker's reconciler: at the lease's expiry it stops the engine (events say so)
    # and the deployment is placed again, here on the only worker alive.
    pg_stack.start_worker("engine-host-2")
    wait_for(lambda: gone(engine), 120, "the orphaned engine to be stopped by the other worker")
    assert not listeners(port) & set(engine)
    [event] = wait_for(lambda: orphans_stopped(pg_api, deployment_id), 30, "the event")
    assert "worker engine-host-1 stopped heartbeating" in event["message"], event
    assert set(event["data"]["pids"]) >= set(engine), (event, engine)
    wait_ready(pg_api, deployment_id)
    port, engine = engine_of(pg_stack, deployment_id)

    # The same worker started again would adopt an engine that answers; this one does not (it
    # is stopped with SIGSTOP), so it hands the deployment back at once and stops the engine its
    # earlier run left, without waiting for the lease to run out.
    pg_stack.workers[-1].kill()
    for pid in engine:
        os.kill(pid, signal.SIGSTOP)
    pg_stack.start_worker("engine-host-2")
    wait_for(lambda: gone(engine), 60, "the restarted worker to stop its earlier run's engine")
    assert not listeners(port) & set(engine)
    events = wait_for(lambda: len(found := orphans_stopped(pg_api, deployment_id)) == 2 and found,
                      30, "the second event")
    assert any("worker engine-host-2 restarted" in e["message"] for e in events), events
    assert wait_ready(pg_api, deployment_id)["restarts"] == 0  # handed back, not crashed

    deleted = pg_api.delete(f"/api/deployments/{deployment_id}")
    assert deleted.status_code == 200, deleted.text
    wait_for(lambda: pg_api.get(f"/api/deployments/{deployment_id}").json()["status"] == "stopped",
             60, "the deployment to stop")
    wait_for(lambda: not job_processes(deployment_id), 30, "the engine to exit")
