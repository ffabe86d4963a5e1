"""End-to-end helpers and fixtures."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Api, Stack
from tests.support.api_server import start_api, stop_api


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_processes(job_id: str) -> list[int]:
    """Live processes that carry this job's id in their environment (the supervisor sets it)."""
    from app.supervise import live_processes
    from workers.supervisor import belongs_to

    return [pid for pid in live_processes() if belongs_to(pid, job_id)]


def engine_processes(deployment_id: str) -> list[int]:
    """A deployment's engine: its processes but its preloader (the local runtime's deployments
    fork each engine from one, which serves the engine's restarts): the launchers, the servers
    forked for them and their engine cores. Killing these is an engine crash."""
    from app.supervise import live_processes

    table = live_processes()

    def preloader(pid: int) -> bool:  # forked servers keep their preloader's command line
        return PRELOADER in cmdline(pid) and PRELOADER not in cmdline(table[pid][0])

    return [pid for pid in job_processes(deployment_id) if pid in table and not preloader(pid)]


PRELOADER = b"workers.runtimes.local.preload\0preloader\0"  # its command line (preload.py)


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


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


class DemoDrafter:
    """The demo drafter, trained once a session. tests/e2e/test_serving.py trains it (a demo
    job, asserted whole) and keeps a copy here, with its job's settings and first logged loss; a
    test that only needs "a trained drafter" and carries the ``uses_demo_drafter`` mark runs after
    it (tests/conftest.py orders them, and keeps them on one pytest-xdist worker) and serves that
    copy instead of training its own (see ``demo_checkpoint``). Run without it (alone), such a
    test trains its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kept: Path | None = None
        self.spec: dict[str, Any] = {}
        self.first_loss = 0.0

    def keep(self, checkpoint: str | Path, spec: dict[str, Any], first_loss: float) -> None:
        if self.kept is None:
            self.kept = Path(shutil.copytree(checkpoint, self.root / "demo-drafter"))
            self.spec, self.first_loss = spec, first_loss

    def copy_for(self, verifier: Path, out: Path) -> Path | None:
        """A copy of the kept drafter whose config names ``verifier`` (a copy of the same demo
        verifier); None when none was kept."""
        if self.kept is None:
            return None
        shutil.copytree(self.kept, out, dirs_exist_ok=True)
        config = json.loads((out / "config.json").read_text())
        config["speculators_config"]["verifier"]["name_or_path"] = str(verifier)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        return out


def checkpoint_row(api: Api, verifier: str, drafter: Path, name: str,
                   spec: dict[str, Any] | None = None) -> str:
    """A checkpoint row for a drafter on disk, as if a job of this project had trained it for
    ``verifier`` with ``spec``'s settings (deployments, promotions and retrains take
    checkpoints). The job row is written as ended, so that no worker ever runs it."""
    from app.db import session_scope
    from app.db.models import Checkpoint, Job

    project_id = api.get("/api/me").json()["project"]["id"]
    spec = spec or {}
    with session_scope() as session:
        job = Job(project_id=project_id, status="succeeded", name=name,
                  spec={**spec, "verifier_info": {**spec.get("verifier_info", {}),
                                                  "reference": verifier}})
        session.add(job)
        session.flush()
        row = Checkpoint(job_id=job.id, epoch=0, path=str(drafter))
        session.add(row)
        session.flush()
        return row.id


def first_loss(api: Api, job_id: str) -> float:
    """The first training loss the job logged."""
    return api.get(f"/api/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["data"][0]["value"]


def demo_checkpoint(api: Api, stack: Stack, demo: dict[str, str], session: DemoDrafter
                    ) -> tuple[dict[str, str], float]:
    """A trained demo drafter's checkpoint (its ``id`` and ``path``) and the first loss its
    training logged: the session's (trained by tests/e2e/test_serving.py), or when there is
    none a demo job of two epochs, trained on the running workers without the served
    evaluation."""
    from tests.e2e.test_pipeline import submit

    verifier = (stack.models_root / demo["verifier"]).resolve()
    if (kept := session.copy_for(verifier, stack.models_root / "demo-drafter")) is not None:
        row = checkpoint_row(api, str(verifier), kept, "the session's demo drafter", session.spec)
        return {"id": row, "path": str(kept)}, session.first_loss
    job = submit(api, demo, epochs=2, evaluate=False)
    done = api.wait_status(job["id"], {"succeeded", "failed", "cancelled"}, timeout=900)
    assert done["status"] == "succeeded", (done, api.get(f"/api/jobs/{job['id']}/logs").text)
    checkpoints = api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
    [best] = [c for c in checkpoints if c["is_best"]]
    return {"id": best["id"], "path": best["path"]}, first_loss(api, job["id"])


@pytest.fixture(scope="session")
def demo_drafter(tmp_path_factory: pytest.TempPathFactory) -> DemoDrafter:
    return DemoDrafter(tmp_path_factory.mktemp("session-drafter"))


@pytest.fixture
def gateway(pg_stack: Stack, tmp_path: Path):
    """A real `specdeck api` server (uvicorn) on the stack's database. Its per-key rate limit
    is off: these tests send as fast as the engine answers, which on a fast machine is faster
    than the default limit allows (tests/integration/test_gateway.py tests the limiter)."""
    env = {**os.environ, **pg_stack.env, "SPECDECK_GATEWAY_RATE_LIMIT_RPM": "0"}
    url, proc = start_api(env, tmp_path / "api.log")
    try:
        yield url
    finally:
        stop_api(proc)
