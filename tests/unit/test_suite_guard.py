"""The suite's own guard against processes that outlive it (tests/conftest.py): a run stopped
with SIGTERM, as `kill`, `timeout` and CI runners stop one, still tears its fixtures down and
stops what its tests started, even a process in a session of its own (as the engines are)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import ROOT
from tests.support.waiting import wait_for

INNER = '''
import os, subprocess, sys, time
from pathlib import Path

import pytest


@pytest.fixture
def server():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True, stdout=subprocess.DEVNULL)
    Path(os.environ["SERVER_PID_FILE"]).write_text(str(proc.pid))
    yield proc
    proc.terminate()
    proc.wait(30)


def test_serves_until_stopped(server):
    Path(os.environ["SERVER_PID_FILE"] + ".running").touch()
    time.sleep(600)
'''


def test_a_sigterm_to_pytest_stops_what_its_tests_started(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pid_file = tmp_path / "server.pid"
    # The suite's conftest as a plugin of a suite of one test.
    log = tmp_path / "pytest.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
             "-s", str(tmp_path / "test_inner.py")], cwd=tmp_path, stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "SERVER_PID_FILE": str(pid_file)})
    server = None
    try:
        wait_for(lambda: Path(f"{pid_file}.running").exists() or run.poll() is not None, 120,
                 "the inner test to run")
        assert run.poll() is None, log.read_text()
        server = psutil.Process(int(pid_file.read_text()))
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
        output = log.read_text()
        assert "KeyboardInterrupt: signal 15" in output, output
        assert run.returncode == 2, output  # pytest's "interrupted", not death by the signal
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, output
    finally:
        run.kill()
        if server is not None and server.is_running():
            server.kill()
