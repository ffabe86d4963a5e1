"""Subprocess helpers for the local-runtime tests: every process gets its own group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def child_env(**extra: str) -> dict[str, str]:
    """Environment for children: the repo importable, no Hub access, wide rich output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "1000"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it outlives the grace period."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Children that outlived their leader (torchrun workers) are in the same group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_logged(
    argv: Sequence[str], log_path: Path, *, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run a command to completion in its own process group; return (rc, output)."""
    with background(argv, log_path, env) as proc:
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{argv[:4]} did not finish in {timeout_s}s; log: {log_path}"
            ) from None
    return rc, log_path.read_text(errors="replace")


@contextmanager
def background(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a long-running command in its own process group; stop the group on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            env=env or child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_group(proc)


def wait_until_ready(
    base_url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 120.0
) -> None:
    """Poll ``/health`` until it answers 200; fail early if the server exits."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(
                    f"server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}"
                )
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.2)
    raise AssertionError(
        f"server not ready after {timeout_s}s:\n{log_path.read_text(errors='replace')}"
    )
