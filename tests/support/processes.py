"""Which processes this test session (and each test) started, so that none outlives its owner.

Every process the suite starts inherits pytest's environment, and so two markers: one for the
session, set once, and one for the running test, set while it runs. A process is found by its
marker in /proc/<pid>/environ, however deep it sits in the tree (a worker's engine, vLLM's
EngineCore) and whatever session or process group it moved to. The names do not start with
SPECDECK_: `specdeck run` tests start their stack without the SPECDECK_ settings of the suite.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

SESSION_ENV = "PYTEST_SESSION_MARK"  # "<pid of pytest>-<random>"
TEST_ENV = "PYTEST_TEST_MARK"
# How long a process gets to exit once its owner asked it to: a worker's SIGTERM stops its
# jobs' processes (SIGTERM, the cancel grace, SIGKILL) and hands the jobs back first.
EXIT_GRACE = 30.0


def begin_session() -> str:
    os.environ[SESSION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return os.environ[SESSION_ENV]


def marked(name: str, value: str | None = None) -> list[psutil.Process]:
    """Live processes (zombies aside, this one aside) whose environment sets ``name`` (to
    ``value``, if given)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            mark = proc.environ().get(name)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if mark is not None and (value is None or mark == value):
            found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            continue
    return "\n".join(lines)


def wait_gone(name: str, value: str, timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for the marked processes to exit; returns those still running."""
    _, alive = psutil.wait_procs(marked(name, value), timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def stop(procs: list[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM each process, then SIGKILL what is left after ``grace`` seconds (by PID: they
    are all marked, so each is found; a process group could hold pytest itself)."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


def orphans_of_dead_sessions() -> list[psutil.Process]:
    """Processes left by an earlier test session whose pytest no longer runs (it was killed)."""
    orphans = []
    for proc in marked(SESSION_ENV):
        try:
            owner = int(proc.environ()[SESSION_ENV].split("-", 1)[0])
        except (psutil.Error, KeyError, ValueError):
            continue
        if not psutil.pid_exists(owner):
            orphans.append(proc)
    return orphans


@contextmanager
def without_test_marker() -> Iterator[None]:
    """For a process that outlives the test that happens to start it (a session's database
    cluster): it belongs to the session, not to the test."""
    mark = os.environ.pop(TEST_ENV, None)
    try:
        yield
    finally:
        if mark is not None:
            os.environ[TEST_ENV] = mark
