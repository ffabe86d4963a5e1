"""End-to-end helpers."""

from __future__ import annotations

import socket
from pathlib import Path



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_processes(job_id: str) -> list[int]:
    """Live processes that carry this job's id in their environment (the supervisor sets it)."""
    from workers.supervisor import JOB_ENV

    marker = f"{JOB_ENV}={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    status = (entry / "stat").read_text().split()[2]
                    if status != "Z":
                        found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return found
