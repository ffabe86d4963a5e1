"""End-to-end helpers and fixtures."""

from __future__ import annotations

import shutil
import socket

import pytest

from tests.conftest import Api, Stack



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_processes(job_id: str) -> list[int]:
    """Live processes that carry this job's id in their environment (the supervisor sets it)."""
    from app.supervise import live_processes
    from workers.supervisor import belongs_to

    return [pid for pid in live_processes() if belongs_to(pid, job_id)]


def upload_demo(stack: Stack, api: Api, demo_assets, conversations: int | None = None
                ) -> dict[str, str]:
    """The demo verifier under the models root and the demo conversations uploaded (the first
    ``conversations`` of them, if given)."""
    model, data = demo_assets
    shutil.copytree(model, stack.models_root / "demo", dirs_exist_ok=True)
    lines = data.read_bytes().splitlines(keepends=True)[:conversations]
    created = api.post("/api/datasets", files={"file": ("demo.jsonl", b"".join(lines), "application/jsonl")},
                       data={"name": "demo"})
    assert created.status_code in (200, 201), created.text
    return {"verifier": "demo", "dataset": created.json()["id"]}


@pytest.fixture
def demo(pg_stack: Stack, pg_api: Api, demo_assets) -> dict[str, str]:
    """The demo verifier and all the demo conversations: for tests that need a drafter
    trained well enough to be accepted."""
    return upload_demo(pg_stack, pg_api, demo_assets)


@pytest.fixture
def small_demo(pg_stack: Stack, pg_api: Api, demo_assets) -> dict[str, str]:
    """A third of the demo conversations: the same pipeline in a third of the time, for tests
    of how a job is stopped, resumed, gated or published, not of how well its drafter drafts."""
    return upload_demo(pg_stack, pg_api, demo_assets, conversations=80)
