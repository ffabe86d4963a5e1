"""What adoption stands on (workers/adoption.py, tests/e2e/test_adoption.py for the whole): a
process that outlives its worker writes its own log; a group recorded by an earlier worker is
known again only while the process that led it runs; an adopted group is watched and stopped."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from app.db.models import Deployment
from workers.adoption import find
from workers.supervisor import EXIT_UNKNOWN, AdoptedProcess, Group, ManagedProcess, exit_words

SLEEPER = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(60)"]


def serving(log: Path) -> ManagedProcess:
    """The sleeper, once it has said it serves: until then the kernel may still be setting up
    the new program (Popen returns once exec has begun), and /proc shows no environment yet."""
    proc = ManagedProcess(SLEEPER, env={}, log_path=log, job_id="dep_x", outlives_worker=True)
    deadline = time.monotonic() + 10
    while "serving" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_a_process_that_outlives_its_worker_writes_its_own_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    proc = serving(log)
    try:
        assert log.read_text() == "serving\n"
        assert proc.proc.stdout is None  # nothing the worker must keep reading
    finally:
        proc.stop(5)


def test_an_adopted_group_is_watched_and_stopped(tmp_path: Path) -> None:
    proc = serving(tmp_path / "log")
    group = Group.of(proc.pgid)
    assert group.leads()
    adopted = AdoptedProcess(group, "serving engine (adopted)")
    assert adopted.poll() is None
    assert adopted.stop(5) == EXIT_UNKNOWN and adopted.stopped == "term"
    assert adopted.poll() == EXIT_UNKNOWN
    proc.proc.wait(5)  # reaped (the test is its parent; an adopted one's parent is init)
    assert not group.leads()
    assert "adopted" in exit_words(EXIT_UNKNOWN, None)


def test_a_recorded_group_whose_leader_changed_is_not_the_engine(tmp_path: Path) -> None:
    proc = serving(tmp_path / "log")
    try:
        group = Group.of(proc.pgid)
        later = Group(group.pgid, (group.started or 0) + 1, group.boot)  # a reused pid
        other_boot = Group(group.pgid, group.started, "another-boot")
        assert group.leads() and not later.leads() and not other_boot.leads()

        def row(groups: list[Group], **values: object) -> Deployment:
            fields = {"id": "dep_x", "name": "d", "status": "ready", "pgid_host": "here",
                      "upstream_url": "http://127.0.0.1:8123",
                      "pgids": [g.to_json() for g in groups], **values}
            return Deployment(**fields)

        found = find(row([group]), "here")
        assert found is not None and found.engine == group and found.port == 8123
        assert found.preloader is None
        assert find(row([later]), "here") is None
        assert find(row([group]), "elsewhere") is None
        assert find(row([group], status="starting"), "here") is None
        assert find(row([group], id="dep_other"), "here") is None  # it runs for dep_x
        assert find(row([group, group]), "here") is None  # two engines: mid-promotion
    finally:
        proc.stop(5)
