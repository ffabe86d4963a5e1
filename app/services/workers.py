"""The worker registry: each worker records its host and GPUs and heartbeats."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Worker, utcnow
from app.schemas.workers import WorkerOut

# A worker that missed this many heartbeats is shown as not alive.
MISSED_HEARTBEATS = 3


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


def list_workers(session: Session, heartbeat_seconds: float) -> list[WorkerOut]:
    """``heartbeat_seconds``: how often workers heartbeat (their reconcile interval)."""
    cutoff = utcnow() - timedelta(seconds=heartbeat_seconds * MISSED_HEARTBEATS)
    workers = session.scalars(select(Worker).order_by(Worker.id))
    return [WorkerOut(id=w.id, host=w.host, queue=w.queue, gpus=w.gpus, capacity=w.capacity,
                      serving_slots=w.serving_slots,
                      started_at=w.started_at, last_heartbeat_at=w.last_heartbeat_at,
                      alive=w.last_heartbeat_at >= cutoff) for w in workers]
