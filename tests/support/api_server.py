"""A real `specdeck api` server (uvicorn) as tests start and stop it: in a session of its own,
its output in a log file, gone with pytest if pytest dies."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from app.supervise import die_with_parent
from tests.conftest import ROOT, SPECDECK
from tests.support.upstream import free_port


def start_api(env: dict[str, str], log: Path,
              timeout: float = 60) -> tuple[str, subprocess.Popen[bytes]]:
    """Start it on a free port with ``env`` (the whole environment) and wait until /healthz
    answers; returns its URL and process."""
    port = free_port()
    proc = subprocess.Popen([SPECDECK, "api", "--host", "127.0.0.1", "--port", str(port),
                             "--no-access-log"], env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"specdeck api exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_api(proc)
    raise AssertionError(f"specdeck api did not start within {timeout:.0f} s:\n{log.read_text()}")


def stop_api(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its group, then SIGKILL if it has not exited within 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
