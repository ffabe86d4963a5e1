"""GPU scheduling: place queued jobs on a worker with enough free GPUs (or a free CPU slot for
the local runtime), record the allocation, and route the job to that worker's own queue.

Oldest first, per kind of resource: a job that does not fit holds back the younger jobs that
need the same kind, so a large job is never starved by a stream of small ones. Allocations are
released by ``state.transition`` whenever a job leaves running (any outcome, a lost worker too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import Allocation, Deployment, Job, Worker, utcnow
from app.services.dispatch import kick
from app.services.state import MACHINES, record_event
from app.settings import Settings

BATCH = 200
MISSED_HEARTBEATS = 3


class _AlreadyPlaced(Exception):
    pass


@dataclass(frozen=True)
class Need:
    resource: str  # "gpu" or "slot"
    verifier: int
    trainer: int

    @property
    def count(self) -> int:
        return self.verifier + self.trainer if self.resource == "gpu" else 1

    def describe(self) -> str:
        if self.resource == "gpu":
            return f"{self.count} free GPUs on one worker"
        return "a free CPU slot on a worker"


def need(obj: Job | Deployment) -> Need:
    spec = obj.spec
    if spec["runtime"] != "vllm":
        return Need("slot", 0, 0)
    res = spec["resources"]
    if isinstance(obj, Deployment):
        return Need("gpu", res["tensor_parallel_size"], 0)
    verifier = res["verifier"]["tensor_parallel_size"] * res["verifier"]["data_parallel_size"]
    return Need("gpu", verifier, res["trainer_gpus"])


def alive_workers(session: Session, settings: Settings) -> list[Worker]:
    cutoff = utcnow() - timedelta(seconds=settings.reconcile_seconds * MISSED_HEARTBEATS)
    return list(session.scalars(select(Worker).where(Worker.last_heartbeat_at >= cutoff)
                                .order_by(Worker.id)))


def units(worker: Worker, resource: str) -> list[int]:
    if resource == "gpu":
        return [int(g["index"]) for g in worker.gpus]
    return list(range(worker.capacity))


def free_units(session: Session, worker: Worker, resource: str) -> list[int]:
    used = set(session.scalars(select(Allocation.idx).where(Allocation.worker_id == worker.id,
                                                            Allocation.resource == resource)))
    return [i for i in units(worker, resource) if i not in used]


def _place(session: Session, job: Job | Deployment, n: Need, worker: Worker, free: list[int]) -> bool:
    model, machine = type(job), MACHINES[type(job)]
    taken = free[:n.count]
    allocation = ({"verifier": taken[:n.verifier], "trainer": taken[n.verifier:]}
                  if n.resource == "gpu" else {"slot": taken})
    try:
        with session.begin_nested():
            session.add_all(Allocation(worker_id=worker.id, resource=n.resource, idx=i,
                                       **{machine.owner: job.id}) for i in taken)
            session.flush()
            placed = session.execute(
                update(model).where(model.id == job.id, model.status == machine.waiting.value,
                                    model.worker_id.is_(None))
                .values(worker_id=worker.id, allocation=allocation, status_reason=None)
            ).rowcount
            if placed != 1:
                raise _AlreadyPlaced
    except (IntegrityError, _AlreadyPlaced):
        return False  # another scheduler got there first
    session.refresh(job)
    if n.resource == "slot":
        where = "a CPU slot"
    elif n.trainer:
        where = f"GPUs {allocation['verifier']} (verifier) and {allocation['trainer']} (trainer)"
    else:
        where = f"GPUs {allocation['verifier']}"
    record_event(session, job, "scheduled", f"scheduled on {worker.id}: {where}",
                 {"worker": worker.id, "allocation": allocation})
    kick(session, job, queue=worker.queue)
    return True


def _waiting(session: Session, job: Job | Deployment, reason: str) -> None:
    if job.status_reason != reason:
        model = type(job)
        session.execute(update(model).where(model.id == job.id,
                                            model.status == MACHINES[model].waiting.value)
                        .values(status_reason=reason))
        set_committed_value(job, "status_reason", reason)
        record_event(session, job, "waiting", reason)


def schedule(session: Session, settings: Settings) -> int:
    """Place what fits, oldest first (jobs and deployments in one line); give everything that
    waits a visible reason."""
    jobs = sorted(_unplaced(session, Job) + _unplaced(session, Deployment),
                  key=lambda row: (row.created_at, row.id))
    if not jobs:
        return 0
    workers = alive_workers(session, settings)
    blocked: dict[str, str] = {}
    placed = 0
    for job in jobs:
        n = need(job)
        if n.resource in blocked:
            _waiting(session, job, f"waiting for {n.describe()}; an older job ({blocked[n.resource]}) "
                     "is first in line")
            continue
        candidates = [(w, free_units(session, w, n.resource)) for w in workers]
        fits = [(w, free) for w, free in candidates if len(free) >= n.count]
        if any(_place(session, job, n, w, free) for w, free in fits):
            placed += 1
            continue
        largest = max((len(units(w, n.resource)) for w in workers), default=0)
        if not workers:
            reason = "waiting for a worker to come online"
        elif largest < n.count:
            # It cannot fit even on an idle worker: it must not hold back the jobs that can.
            reason = f"waiting for {n.describe()}: the largest worker online has {largest}"
        else:
            blocked[n.resource] = job.id
            most = max((len(free) for _, free in candidates), default=0)
            reason = f"waiting for {n.describe()} (most free now: {most})"
        _waiting(session, job, reason)
    return placed


def _unplaced(session: Session, model: type[Job] | type[Deployment]) -> list[Any]:
    return list(session.scalars(
        select(model).where(model.status == MACHINES[model].waiting.value, model.worker_id.is_(None))
        .order_by(model.id).limit(BATCH).with_for_update(skip_locked=True)))


def unplace_from_dead_workers(session: Session, settings: Settings) -> int:
    """Jobs and deployments placed on a worker that died before claiming them go back."""
    alive = {w.id for w in alive_workers(session, settings)}
    stranded = [row for model in (Job, Deployment) for row in session.scalars(
        select(model).where(model.status == MACHINES[model].waiting.value,
                            model.worker_id.is_not(None)).with_for_update(skip_locked=True))]
    moved = 0
    for job in stranded:
        if job.worker_id not in alive:
            gone = job.worker_id  # the update below clears it on the object too
            model, owner = type(job), MACHINES[type(job)].owner
            session.execute(delete(Allocation).where(getattr(Allocation, owner) == job.id))
            session.execute(update(model).where(model.id == job.id).values(worker_id=None, allocation=None))
            record_event(session, job, "unscheduled", f"worker {gone} went away before starting "
                         "it; scheduling it again", {"worker": gone})
            moved += 1
    return moved
