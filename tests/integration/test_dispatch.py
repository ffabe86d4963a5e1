"""Dispatch, leases, cancel and the reaper, with real `specdeck worker` processes running a
test-only stage (a real long-running Python child, tests/support/child.py)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import Api, Stack
from tests.support.waiting import wait_for
from workers.supervisor import group_alive


def pid_files(directory: Path, job_id: str) -> dict[int, tuple[int, int]]:
    """attempt -> (pid, pgid) of the child each attempt started."""
    found = {}
    for path in directory.glob(f"{job_id}-*.pid"):
        pid, pgid = map(int, path.read_text().split())
        found[int(path.stem.rsplit("-", 1)[1])] = (pid, pgid)
    return found


def claims(api: Api, job_id: str) -> list[dict]:
    return [e for e in api.events(job_id) if e["message"].startswith("claimed by")]


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_worker_claims_a_created_job_from_its_redis_message(pg_api: Api, pg_job_body,
                                                              pg_stack: Stack) -> None:
    """The API's kick reaches the worker through Redis: with the reconciler's re-kick out of
    the way, that message is the only way the job can be claimed. (How fast: timings never go
    into pass/fail tests; benchmarks/dispatch.py measures the claim latency.)"""
    worker = pg_stack.start_worker(SPECDECK_REKICK_AFTER_SECONDS="3600")
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "0.5"})).json()
    done = pg_api.wait_status(job["id"], {"succeeded"}, timeout=60)
    claim = claims(pg_api, job["id"])
    assert len(claim) == 1
    assert f"re-kicking {job['id']}" not in worker.log.read_text()
    assert done["attempt"] == 1
    assert [e["status"] for e in pg_api.events(job["id"]) if e["kind"] == "status"] == \
        ["queued", "running", "running", "succeeded"]


def placed_job(api: Api, stack: Stack, job_body) -> str:
    """A queued job placed on a worker registered as alive (no process runs it); its id."""
    from app.db import session_scope
    from app.services.workers import register

    with session_scope() as session:
        register(session, worker_id="w-held", host="h", queue=f"{stack.env['SPECDECK_QUEUE']}.w-held",
                 gpus=[], capacity=1, serving_slots=0)
    job = api.post("/api/jobs", json=job_body()).json()
    assert job["worker"] == "w-held" and job["status"] == "queued", job
    return job["id"]


def test_a_claim_waits_for_a_transaction_that_holds_its_job(pg_api: Api, pg_job_body,
                                                           pg_stack: Stack) -> None:
    """A worker's claim while another transaction holds its job's row (a cancel, a reconciler's
    round) waits for it, then takes the job. Skipping the row dropped the message, and the job
    waited for a re-kick: a clean CI run lost the test above that way, to a reconciler's round."""
    import threading

    from sqlalchemy import select

    from app.db import get_sessionmaker
    from app.db.models import Job
    from workers.lease import claim

    job_id = placed_job(pg_api, pg_stack, pg_job_body)
    claimed: dict[str, object] = {}
    claimer = threading.Thread(target=lambda: claimed.update(lease=claim(job_id, "w-held", 30)))
    with get_sessionmaker()() as holder:
        holder.scalars(select(Job).where(Job.id == job_id).with_for_update()).one()
        claimer.start()
        wait_for(lambda: not claimer.is_alive() or pg_stack.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"), 60, "the claim to wait or end")
        assert claimer.is_alive(), claimed  # it waits for the row
        holder.commit()
    claimer.join(60)
    assert claimed["lease"] is not None, claimed
    assert pg_api.job(job_id)["status"] == "running"


def test_the_dead_worker_scan_holds_no_live_workers_job(pg_api: Api, pg_job_body,
                                                       pg_stack: Stack) -> None:
    """The reconciler's scan for jobs placed on dead workers locks only theirs: a live worker's
    job stays free to claim while the round's transaction is open."""
    from sqlalchemy import select

    from app.db import get_sessionmaker
    from app.db.models import Job
    from app.services.scheduling import unplace_from_dead_workers
    from app.settings import get_settings

    job_id = placed_job(pg_api, pg_stack, pg_job_body)
    with get_sessionmaker()() as round_, get_sessionmaker()() as other:
        assert unplace_from_dead_workers(round_, get_settings()) == 0
        other.scalars(select(Job).where(Job.id == job_id).with_for_update(nowait=True)).one()


def test_b_the_same_message_delivered_twice_runs_once(pg_api: Api, pg_job_body,
                                                      pg_stack: Stack, tmp_path: Path) -> None:
    from app.services.dispatch import send_run_job

    # Two worker processes, each able to run two tasks at once: the duplicates race for real.
    # No re-kicks: a job still queued after REKICK_AFTER (3 s) on a busy machine would get one
    # more message, and one more no-op than the three counted below.
    for _ in range(2):
        pg_stack.start_worker(SPECDECK_WORKER_CONCURRENCY="2", SPECDECK_REKICK_AFTER_SECONDS="3600")
    job = pg_api.post("/api/jobs", json=pg_job_body(
        metadata={"test_seconds": "1.5", "test_pid_dir": str(tmp_path)})).json()
    queue = f"{pg_stack.env['SPECDECK_QUEUE']}.{job['worker']}"
    other = next(w.name for w in pg_stack.workers if w.name != job["worker"])
    for _ in range(2):
        send_run_job(job["id"], queue)
    send_run_job(job["id"], f"{pg_stack.env['SPECDECK_QUEUE']}.{other}")  # and to the wrong worker
    done = pg_api.wait_status(job["id"], {"succeeded"}, timeout=60)
    # Every one of the three duplicates was consumed, and each found the job taken.
    no_ops = f"job {job['id']} is not queued (duplicate or stale message): nothing to do"
    wait_for(lambda: sum(w.log.read_text().count(no_ops) for w in pg_stack.workers) == 3, 60,
             "the duplicates to be consumed")
    assert done["attempt"] == 1
    assert len(claims(pg_api, job["id"])) == 1
    assert list(pid_files(tmp_path, job["id"])) == [1]


def test_c_sigkilled_worker_job_is_requeued_and_finished_by_another(pg_api: Api, pg_job_body,
                                                                    pg_stack: Stack, tmp_path: Path) -> None:
    first = pg_stack.start_worker("first")
    # The child runs until released (at most 120 s): it still runs when the worker is killed,
    # however slow the machine, and the second attempt's ends once it has started.
    release = tmp_path / "release"
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={
        "test_seconds": "120", "test_until": str(release), "test_pid_dir": str(tmp_path)})).json()
    orphan_pid, orphan_pgid = wait_for(lambda: pid_files(tmp_path, job["id"]).get(1), 30,
                                       "the first attempt's child")
    first.kill()  # SIGKILL: no cleanup, the child lives on in its own session
    assert group_alive(orphan_pgid)

    pg_stack.start_worker("second")
    wait_for(lambda: pid_files(tmp_path, job["id"]).get(2), 120, "the second attempt's child")
    # Not released yet, so only the reaper can have ended it.
    wait_for(lambda: not group_alive(orphan_pgid), 60, "the dead worker's child to be reaped")
    release.touch()
    done = pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=120)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2
    messages = [e["message"] for e in pg_api.events(job["id"])]
    assert any(m == "claimed by first (attempt 1)" for m in messages), messages
    assert any("lease expired" in m and "re-queued for attempt 2" in m for m in messages), messages
    assert any(m == "claimed by second (attempt 2)" for m in messages), messages
    assert sorted(pid_files(tmp_path, job["id"])) == [1, 2]
    assert not group_alive(orphan_pgid), "the dead worker's child was not reaped"


def test_retry_limit_fails_the_job_with_a_reason(pg_api: Api, pg_job_body, pg_stack: Stack,
                                                 tmp_path: Path) -> None:
    worker = pg_stack.start_worker("doomed", SPECDECK_MAX_ATTEMPTS="1")
    job = pg_api.post("/api/jobs", json=pg_job_body(
        metadata={"test_seconds": "30", "test_pid_dir": str(tmp_path)})).json()
    _, pgid = wait_for(lambda: pid_files(tmp_path, job["id"]).get(1), 30, "the child")
    worker.kill()
    pg_stack.start_worker("reaper", SPECDECK_MAX_ATTEMPTS="1")
    failed = pg_api.wait_status(job["id"], {"failed", "succeeded"}, timeout=60)
    assert failed["status"] == "failed"
    assert failed["error_code"] == "worker_lost"
    assert "retry limit of 1 attempts reached" in failed["status_reason"]
    assert not group_alive(pgid)


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["sigterm", "sigkill-after-grace"])
def test_d_cancel_stops_the_process_group(pg_api: Api, pg_job_body, pg_stack: Stack,
                                         tmp_path: Path, ignore_sigterm: bool) -> None:
    pg_stack.start_worker()
    meta = {"test_seconds": "120", "test_pid_dir": str(tmp_path)}
    if ignore_sigterm:
        meta["test_ignore_sigterm"] = "1"
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata=meta)).json()
    pid, pgid = wait_for(lambda: pid_files(tmp_path, job["id"]).get(1), 30, "the child")
    assert pg_api.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "cancelling"
    # The child runs 120 s: only the cancel (SIGTERM, or SIGKILL after the 2 s grace) ends it
    # within these deadlines, which are generous for a busy machine (no timing is asserted).
    done = pg_api.wait_status(job["id"], {"cancelled"}, timeout=60)
    wait_for(lambda: not group_alive(pgid), 60, "the group to go")
    assert done["status"] == "cancelled" and done["finished_at"]
    statuses = [e["status"] for e in pg_api.events(job["id"]) if e["kind"] == "status"]
    assert statuses[-2:] == ["cancelling", "cancelled"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_lost_message_is_rekicked_by_the_reconciler(pg_api: Api, pg_job_body, pg_stack: Stack) -> None:
    from tests.conftest import configure

    pg_stack.start_worker()
    # The broker is unreachable when the API sends the kick: the row is committed, the message
    # is lost (and logged). The worker's reconciler sends it again.
    configure({"SPECDECK_BROKER_URL": "redis://127.0.0.1:1/0"})
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "0.2"})).json()
    configure({"SPECDECK_BROKER_URL": pg_stack.env["SPECDECK_BROKER_URL"]})
    assert job["status"] == "queued" and job["worker"]
    done = pg_api.wait_status(job["id"], {"succeeded"}, timeout=60)
    assert done["attempt"] == 1
    assert any(f"re-kicking {job['id']}" in w.log.read_text() for w in pg_stack.workers)


def test_stage_failure_fails_the_job_with_the_log_tail(pg_api: Api, pg_job_body, pg_stack: Stack) -> None:
    pg_stack.start_worker()
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "not-a-number"})).json()
    failed = pg_api.wait_status(job["id"], {"failed"}, timeout=60)
    assert failed["error_code"] == "bad_configuration"
    assert failed["status_reason"] == ("test child exited with code 2: the command line or "
                                       "configuration was rejected")
    final = pg_api.events(job["id"])[-1]
    assert "invalid float value" in final["data"]["log_tail"]
    logs = pg_api.get(f"/api/jobs/{job['id']}/logs", params={"tail": 3})
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
    assert "invalid float value" in logs.text and len(logs.text.splitlines()) <= 3


def test_workers_are_listed_with_heartbeats(pg_api: Api, pg_stack: Stack) -> None:
    worker = pg_stack.start_worker("gpu-host", SPECDECK_WORKER_GPUS="0,1,2,3")
    listed = {w["id"]: w for w in pg_api.get("/api/workers").json()["data"]}
    assert [g["index"] for g in listed["gpu-host"]["gpus"]] == [0, 1, 2, 3]
    assert listed["gpu-host"]["alive"] is True
    first_beat = ts(listed["gpu-host"]["last_heartbeat_at"])
    wait_for(lambda: ts({w["id"]: w for w in pg_api.get("/api/workers").json()["data"]}
                        ["gpu-host"]["last_heartbeat_at"]) > first_beat, 60, "a heartbeat")
    assert worker.proc.poll() is None
