"""The worker registry: each worker records its host and GPUs and heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Deployment, Job, Worker, utcnow
from app.schemas.workers import RunningOut, WorkerOut
from app.services.state import MACHINES

# A worker that missed this many heartbeats counts as gone: shown as not alive, given no new
# work, its leases and checkpoints taken back.
MISSED_HEARTBEATS = 3


def heartbeat_cutoff(heartbeat_seconds: float) -> datetime:
    """A worker whose last heartbeat is older than this is gone (``heartbeat_seconds``: how often
    workers heartbeat, their reconcile interval)."""
    return utcnow() - timedelta(seconds=heartbeat_seconds * MISSED_HEARTBEATS)


def register(session: Session, *, worker_id: str, host: str, queue: str,
             gpus: list[dict[str, Any]], capacity: int, serving_slots: int) -> Worker:
    worker = session.get(Worker, worker_id) or Worker(id=worker_id)
    worker.host, worker.queue, worker.gpus = host, queue, gpus
    worker.capacity, worker.serving_slots = capacity, serving_slots
    worker.started_at = worker.last_heartbeat_at = utcnow()
    session.add(worker)
    return worker


def retire(session: Session, worker_id: str) -> None:
    """A worker shutting down: no longer alive, so the scheduler places nothing more on it."""
    worker = session.get(Worker, worker_id)
    if worker is not None:
        worker.last_heartbeat_at = utcnow() - timedelta(days=1)


def heartbeat(session: Session, worker_id: str) -> None:
    worker = session.get(Worker, worker_id)
    if worker is not None:
        worker.last_heartbeat_at = utcnow()


def _running(session: Session, worker_ids: list[str], project_id: str) -> dict[str, list[RunningOut]]:
    """What is placed on each worker (status not final: queued-but-placed counts too, since it
    holds its GPUs), oldest first; another project's work without its id, name or status."""
    running: dict[str, list[RunningOut]] = {w: [] for w in worker_ids}
    rows: list[Job | Deployment] = []
    for model in (Job, Deployment):
        terminal = [s.value for s in MACHINES[model].terminal]
        rows += session.scalars(select(model).where(model.worker_id.in_(worker_ids),
                                                    model.status.not_in(terminal)))
    for row in sorted(rows, key=lambda r: (r.created_at, r.id)):
        allocation = row.allocation or {}
        gpus = sorted(allocation.get("verifier", []) + allocation.get("trainer", []))
        slots = allocation.get("slot", []) + allocation.get("serving", [])
        kind = "job" if isinstance(row, Job) else "deployment"
        if row.project_id == project_id:
            deployment = isinstance(row, Deployment)
            item = RunningOut(kind=kind, id=(row.replica_of or row.id) if deployment else row.id,
                              name=row.name if deployment else None,
                              replica=row.replica if deployment else None, status=row.status,
                              gpus=gpus, slots=slots)
        else:
            item = RunningOut(kind=kind, id=None, name=None, status="busy", gpus=gpus, slots=slots)
        running[row.worker_id].append(item)  # type: ignore[index]
    return running


def list_workers(session: Session, heartbeat_seconds: float, project_id: str) -> list[WorkerOut]:
    """``heartbeat_seconds``: how often workers heartbeat (their reconcile interval); what runs
    on them is shown in full for ``project_id``'s work only."""
    cutoff = heartbeat_cutoff(heartbeat_seconds)
    workers = list(session.scalars(select(Worker).order_by(Worker.id)))
    running = _running(session, [w.id for w in workers], project_id)
    return [WorkerOut(id=w.id, host=w.host, queue=w.queue, gpus=w.gpus, capacity=w.capacity,
                      serving_slots=w.serving_slots,
                      started_at=w.started_at, last_heartbeat_at=w.last_heartbeat_at,
                      alive=w.last_heartbeat_at >= cutoff, running=running[w.id])
            for w in workers]
