"""Waiting for an OpenAI-compatible server (vLLM, or ours) to be ready: `/health` answers 200
and `/v1/models` lists the served name. Until then the gateway answers 503."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from app.logtail import tail
from workers.runner import JobContext, StageFailed
from workers.supervisor import ManagedProcess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports, for servers started together (each binds its port only once
    it has started, so two picks in a row could otherwise be the same port)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def is_ready(client: httpx.Client, base_url: str, served_name: str) -> bool:
    try:
        if client.get(f"{base_url}/health").status_code != 200:
            return False
        models = client.get(f"{base_url}/v1/models").json()
    except (httpx.TransportError, ValueError):
        return False  # not listening yet, or not answering JSON yet
    return any(m.get("id") == served_name for m in models.get("data", []))


class NotReady(StageFailed):
    """The server itself failed to start: it exited, or was not ready in time."""


def wait_ready(ctx: JobContext, proc: ManagedProcess, base_url: str, served_name: str, *,
               what: str, log_path: Path, timeout: float, headers: dict[str, str] | None = None) -> None:
    """Poll until ready; fail (NotReady) with the server's log tail if it exits or the deadline
    passes."""
    deadline = time.monotonic() + timeout
    code = f"{what.replace(' ', '_')}_failed"
    with httpx.Client(timeout=5, headers=headers) as client:
        while time.monotonic() < deadline:
            ctx.check()
            if proc.poll() is not None:
                raise NotReady(f"the {what} exited with code {proc.poll()} while starting",
                               code=code, log_tail=tail(log_path))
            if is_ready(client, base_url, served_name):
                return
            time.sleep(0.5)
    raise NotReady(f"the {what} was not ready after {timeout:.0f} s", code=code,
                   log_tail=tail(log_path))
