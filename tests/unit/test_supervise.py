"""What `specdeck run` does with the API and the worker (app/supervise.py), with real processes:
a stop signal stops every child and what they started (SIGKILL after the timeout, said so); a
child that dies is restarted while the other keeps running; one that keeps dying makes the
supervisor give up; the children die with a SIGKILLed supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.supervise import Child, Supervisor, die_with_parent, signal_group
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

# Each child appends "pid [grandchild pid]" to the file it is given, then sleeps.
SLEEPER = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)"
PARENT = ("import os, subprocess, sys, time\n"
          "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          "open(sys.argv[1], 'a').write(f'{os.getpid()} {g.pid}\\n'); time.sleep(60)")
STUBBORN = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)")

# The supervisor as `specdeck run` runs it: its own process, its exit status run()'s answer.
SUPERVISOR = """
import json, sys
from app.supervise import Child, Supervisor
spec = json.loads(sys.argv[1])
children = [Child(name, argv) for name, argv in spec.pop("children")]
sys.exit(0 if Supervisor(children, **spec).run() else 1)
"""


def gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def pids(path: Path) -> list[list[int]]:
    """The lines a child wrote, one per start."""
    if not path.is_file():
        return []
    return [[int(p) for p in line.split()] for line in path.read_text().splitlines()
            if line.endswith(tuple("0123456789"))]


class Run:
    """A supervisor process over ``children`` (name -> script), output in a log file."""

    def __init__(self, tmp: Path, children: dict[str, str], **options: object) -> None:
        self.tmp = tmp
        self.files = {name: tmp / f"{name}.pids" for name in children}
        spec = {"children": [(name, [sys.executable, "-c", script, str(self.files[name])])
                             for name, script in children.items()],
                "env": {**os.environ, "PYTHONPATH": str(ROOT)}, **options}
        self.log = tmp / "supervisor.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, json.dumps(spec)],
                                         cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=die_with_parent)

    def output(self) -> str:
        return self.log.read_text()

    def started(self, name: str, times: int = 1) -> list[int]:
        wait_for(lambda: len(pids(self.files[name])) >= times, 10, f"{name} to start {times}x\n"
                 f"{self.output()}")
        return pids(self.files[name])[-1]

    def all_pids(self) -> list[int]:
        return [pid for path in self.files.values() for line in pids(path) for pid in line]

    def cleanup(self) -> None:
        """Everything it started goes, whatever the test did."""
        if self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for path in self.files.values():
            for line in pids(path):
                if not gone(line[0]):
                    signal_group(line[0], signal.SIGKILL)  # each child leads its own group
                for pid in line:
                    if not gone(pid):
                        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(children: dict[str, str], **options: object) -> Run:
        runs.append(Run(tmp_path, children, **options))
        return runs[-1]

    yield start
    for run in runs:
        run.cleanup()
    wait_for(lambda: all(gone(pid) for run in runs for pid in run.all_pids()), 5,
             "everything the supervisors started to be gone")


def test_sigterm_stops_both_children_and_what_they_started(supervise) -> None:
    run = supervise({"api": SLEEPER, "worker": PARENT}, stop_timeout=10)
    api = run.started("api")
    worker, grandchild = run.started("worker")
    assert os.getpgid(grandchild) == worker  # the child leads a group (and session) of its own
    assert os.getsid(worker) == worker

    run.proc.send_signal(signal.SIGTERM)  # to the supervisor alone, as docker stop does
    assert run.proc.wait(timeout=10) == 0
    assert all(gone(pid) for pid in (api, worker, grandchild))
    output = run.output()
    assert "got SIGTERM: stopping api, worker" in output
    assert output.rstrip().endswith("stopped")
    assert "killed" not in output


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout(supervise) -> None:
    run = supervise({"api": SLEEPER, "worker": STUBBORN}, stop_timeout=1)
    api, worker = run.started("api")[0], run.started("worker")[0]

    started = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(timeout=10) == 0
    assert time.monotonic() - started >= 1  # the timeout, then the kill the log names
    assert gone(api) and gone(worker)
    output = run.output()
    assert "got SIGINT: stopping" in output
    assert "worker did not stop within 1 s: killed" in output
    assert "api did not stop" not in output


def test_a_killed_child_is_restarted_and_the_other_keeps_running(supervise) -> None:
    run = supervise({"api": SLEEPER, "worker": SLEEPER}, stop_timeout=10, backoff=0.2)
    api, worker = run.started("api")[0], run.started("worker")[0]

    os.kill(worker, signal.SIGKILL)
    restarted = run.started("worker", times=2)[0]
    assert restarted != worker and not gone(restarted)
    assert "worker exited with code -9; restarting in 0.2 s" in run.output()
    assert pids(run.files["api"]) == [[api]] and not gone(api)

    run.proc.send_signal(signal.SIGHUP)
    assert run.proc.wait(timeout=10) == 0
    assert gone(api) and gone(restarted)


def test_the_children_die_with_a_killed_supervisor(supervise) -> None:
    run = supervise({"api": SLEEPER, "worker": SLEEPER})
    api, worker = run.started("api")[0], run.started("worker")[0]
    run.proc.kill()
    run.proc.wait(timeout=10)
    wait_for(lambda: gone(api) and gone(worker), 5, "the children to get SIGTERM")


def test_a_child_that_keeps_exiting_makes_it_give_up(tmp_path: Path) -> None:
    """In this process: run() says False, the other child is stopped, the handlers are back."""
    marker = tmp_path / "other.pids"
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    lines: list[str] = []
    supervisor = Supervisor([Child("worker", [sys.executable, "-c", "import sys; sys.exit(3)"]),
                             Child("api", [sys.executable, "-c", SLEEPER, str(marker)])],
                            stop_timeout=5, backoff=0.01, max_backoff=0.05, tick=0.02,
                            say=lines.append)
    try:
        assert supervisor.run() is False
    finally:
        for line in pids(marker):
            if not gone(line[0]):
                os.kill(line[0], signal.SIGKILL)
    restarts = [line for line in lines if line.startswith("worker exited with code 3; restarting")]
    assert len(restarts) == 5
    assert "worker exited with code 3, 6 times within 60 s: giving up" in lines[5]
    assert lines[-1] == "stopped"
    assert pids(marker) and all(gone(line[0]) for line in pids(marker))
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_specdeck_run_gives_up_with_exit_status_1(supervise) -> None:
    run = supervise({"api": SLEEPER, "worker": "import sys; sys.exit(3)"}, backoff=0.01,
                    max_backoff=0.05, stop_timeout=5, tick=0.02)
    assert run.proc.wait(timeout=10) == 1
    assert "giving up" in run.output()
