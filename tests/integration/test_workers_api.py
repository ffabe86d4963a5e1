"""GET /api/workers: each worker with what is placed on it, per GPU (or local-runtime slot),
in full for the caller's project and only as "busy" for another project's work."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.conftest import Api, Stack
from tests.integration.test_datasets_api import project_of


def add_worker(worker_id: str, gpus: int) -> None:
    from app.db import session_scope
    from app.db.models import Worker, utcnow

    with session_scope() as session:
        session.add(Worker(id=worker_id, host="box", queue=f"q-{worker_id}",
                           gpus=[{"index": i, "name": "H100", "memory_total_mib": 81559}
                                 for i in range(gpus)],
                           capacity=1, serving_slots=1,
                           last_heartbeat_at=utcnow() + timedelta(hours=1)))


def add_row(model: Any, project_id: str, status: str, worker_id: str | None,
            allocation: dict[str, list[int]] | None, **extra: Any) -> str:
    """A job or deployment row placed directly (the scheduler is not what is tested here)."""
    from app.db import session_scope

    with session_scope() as session:
        row = model(project_id=project_id, spec={}, status=status, worker_id=worker_id,
                    allocation=allocation, **extra)
        session.add(row)
        session.flush()
        return row.id


def test_workers_list_what_runs_on_each_gpu(api: Api, make_api, stack: Stack) -> None:
    from app.db.models import Deployment, Job

    other = make_api(api)
    mine, theirs = project_of(stack, api), project_of(stack, other)
    add_worker("gpu-box", gpus=4)
    add_worker("laptop", gpus=0)
    job = add_row(Job, mine, "running", "gpu-box", {"verifier": [0], "trainer": [1]})
    deployment = add_row(Deployment, mine, "ready", "gpu-box", {"verifier": [2]}, name="fast")
    add_row(Job, theirs, "running", "gpu-box", {"verifier": [3], "trainer": []})
    # Placed but not yet claimed: it holds its slot already.
    queued = add_row(Job, mine, "queued", "laptop", {"slot": [0]})
    # Finished, or never placed: on no worker's list.
    add_row(Job, mine, "succeeded", "gpu-box", {"verifier": [0], "trainer": [1]})
    add_row(Job, mine, "queued", None, None)

    response = api.get("/api/workers")
    assert response.status_code == 200, response.text
    workers = {w["id"]: w for w in response.json()["data"]}
    assert [g["index"] for g in workers["gpu-box"]["gpus"]] == [0, 1, 2, 3]
    assert workers["gpu-box"]["running"] == [
        {"kind": "job", "id": job, "name": None, "replica": None, "status": "running", "gpus": [0, 1], "slots": []},
        {"kind": "deployment", "id": deployment, "name": "fast", "replica": 0, "status": "ready", "gpus": [2],
         "slots": []},
        {"kind": "job", "id": None, "name": None, "replica": None, "status": "busy", "gpus": [3], "slots": []},
    ]
    assert workers["laptop"]["running"] == [
        {"kind": "job", "id": queued, "name": None, "replica": None, "status": "queued", "gpus": [], "slots": [0]}]

    # The other project sees the same workers, with only its own work named.
    theirs_view = {w["id"]: w for w in other.get("/api/workers").json()["data"]}
    assert [(r["id"], r["status"]) for r in theirs_view["gpu-box"]["running"]] == [
        (None, "busy"), (None, "busy"), (theirs_view["gpu-box"]["running"][2]["id"], "running")]
    assert theirs_view["gpu-box"]["running"][2]["id"] is not None
    assert theirs_view["laptop"]["running"][0]["id"] is None
