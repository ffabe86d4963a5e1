"""GPU scheduling: place queued jobs and deployments on a worker with enough free GPUs (for the
local runtime: a free CPU slot, a training slot for a job, a serving slot for a deployment),
record the allocation, and route the work to that worker's own queue.

Oldest first, per kind of resource: a job that does not fit holds back the younger jobs that
need the same kind, so a large job is never starved by a stream of small ones. Training and
serving slots are two kinds, so a deployment (which holds its slot until deleted) never starves
the jobs, nor a busy training slot the deployments. What waits gets a reason naming what holds
the resource. Allocations are released by ``state.transition`` whenever a job leaves running (any
outcome, a lost worker too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import Allocation, Deployment, Job, Worker
from app.runtimes import trainer_gpu_count
from app.schemas.job_spec import JobSpec
from app.services.dispatch import kick
from app.services.state import MACHINES, record_event
from app.services.workers import heartbeat_cutoff
from app.settings import Settings

BATCH = 200


class _AlreadyPlaced(Exception):
    pass


@dataclass(frozen=True)
class Need:
    resource: str  # "gpu"; for the local runtime "slot" (a job's) or "serving" (a deployment's)
    verifier: int
    trainer: int

    @property
    def count(self) -> int:
        return self.verifier + self.trainer if self.resource == "gpu" else 1

    @property
    def unit(self) -> str:
        return {"gpu": "GPU", "slot": "training slot", "serving": "serving slot"}[self.resource]

    def describe(self) -> str:
        if self.resource == "gpu":
            return f"{self.count} free GPUs on one worker"
        return f"a free {self.unit}"


def need(obj: Job | Deployment) -> Need:
    if obj.spec["runtime"] != "vllm":
        return Need("serving" if isinstance(obj, Deployment) else "slot", 0, 0)
    if isinstance(obj, Deployment):
        return Need("gpu", obj.spec["resources"]["tensor_parallel_size"], 0)
    spec = JobSpec.load(obj.spec)
    # Sharing the verifier's GPUs (one GPU, a memory split), the trainer needs none of its own;
    # a bake-off trained side by side, one set per candidate.
    return Need("gpu", spec.verifier_gpu_count, trainer_gpu_count(spec))


def alive_workers(session: Session, settings: Settings) -> list[Worker]:
    cutoff = heartbeat_cutoff(settings.reconcile_seconds)
    return list(session.scalars(select(Worker).where(Worker.last_heartbeat_at >= cutoff)
                                .order_by(Worker.id)))


def units(worker: Worker, resource: str) -> list[int]:
    if resource == "gpu":
        return [int(g["index"]) for g in worker.gpus]
    return list(range(worker.serving_slots if resource == "serving" else worker.capacity))


def free_units(session: Session, worker: Worker, resource: str) -> list[int]:
    used = set(session.scalars(select(Allocation.idx).where(Allocation.worker_id == worker.id,
                                                            Allocation.resource == resource)))
    return [i for i in units(worker, resource) if i not in used]


def _place(session: Session, job: Job | Deployment, n: Need, worker: Worker, free: list[int]) -> bool:
    model, machine = type(job), MACHINES[type(job)]
    taken = free[:n.count]
    allocation = ({"verifier": taken[:n.verifier], "trainer": taken[n.verifier:]}
                  if n.resource == "gpu" else {n.resource: taken})
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
    if n.resource != "gpu":
        where = f"{n.unit} {taken[0]}"
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
    blocked: dict[str, Job | Deployment] = {}
    placed = 0
    for job in jobs:
        n = need(job)
        if n.resource in blocked:
            _waiting(session, job, f"waiting for {n.describe()}; {_name(blocked[n.resource], job)} "
                     "is older and first in line")
            continue
        candidates = [(w, free_units(session, w, n.resource)) for w in workers]
        fits = [(w, free) for w, free in candidates if len(free) >= n.count]
        if isinstance(job, Deployment):
            fits = _spread(session, job, fits)
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
            blocked[n.resource] = job
            reason = f"waiting for {n.describe()}: {_in_use(session, candidates, n.resource, job)}"
        _waiting(session, job, reason)
    return placed


def _spread(session: Session, deployment: Deployment, fits: list[tuple[Worker, list[int]]]
            ) -> list[tuple[Worker, list[int]]]:
    """A deployment's replicas apart: workers on a host that serves none of its other replicas
    first, then workers that serve none, then the rest (a slot of its own is all a replica
    needs, on one machine too)."""
    group = deployment.replica_of or deployment.id
    placed = session.execute(select(Worker.id, Worker.host).join(
        Deployment, Deployment.worker_id == Worker.id).where(
        (Deployment.id == group) | (Deployment.replica_of == group),
        Deployment.id != deployment.id)).all()
    if not placed:
        return fits
    workers, hosts = {row.id for row in placed}, {row.host for row in placed}
    return sorted(fits, key=lambda fit: (fit[0].host in hosts, fit[0].id in workers))


def _name(owner: Job | Deployment, viewer: Job | Deployment) -> str:
    """An owner as ``viewer`` may see it: by id in its own project, only its kind in another."""
    if owner.project_id == viewer.project_id:
        if isinstance(owner, Deployment) and owner.replica_of is not None:
            return f"{owner.replica_of} (replica {owner.replica})"
        return owner.id
    return f"another project's {'job' if isinstance(owner, Job) else 'deployment'}"


def _in_use(session: Session, candidates: list[tuple[Worker, list[int]]], resource: str,
            viewer: Job | Deployment) -> str:
    """What each worker offering ``resource`` has free, and who holds the rest: "laptop has 0
    of 1 free (used by job_...)"."""
    rows = session.execute(select(Allocation.worker_id, Job, Deployment)
                           .outerjoin(Job, Job.id == Allocation.job_id)
                           .outerjoin(Deployment, Deployment.id == Allocation.deployment_id)
                           .where(Allocation.resource == resource).order_by(Allocation.id))
    holders: dict[str, list[str]] = {}
    for worker_id, owned_job, owned_deployment in rows:
        names = holders.setdefault(worker_id, [])
        name = _name(owned_job or owned_deployment, viewer)
        if name not in names:
            names.append(name)
    parts = []
    for worker, free in candidates:
        total = len(units(worker, resource))
        if total:
            used = f" (used by {', '.join(holders[worker.id])})" if worker.id in holders else ""
            parts.append(f"{worker.id} has {len(free)} of {total} free{used}")
    return "; ".join(parts)


def _unplaced(session: Session, model: type[Job] | type[Deployment]) -> list[Any]:
    return list(session.scalars(
        select(model).where(model.status == MACHINES[model].waiting.value, model.worker_id.is_(None))
        .order_by(model.id).limit(BATCH).with_for_update(skip_locked=True)))


def unplace_from_dead_workers(session: Session, settings: Settings) -> int:
    """Jobs and deployments placed on a worker that died before claiming them go back."""
    alive = {w.id for w in alive_workers(session, settings)}
    # Only the dead workers' rows are locked: a live worker claims its own at any moment.
    stranded = [row for model in (Job, Deployment) for row in session.scalars(
        select(model).where(model.status == MACHINES[model].waiting.value,
                            model.worker_id.is_not(None), model.worker_id.not_in(alive))
        .with_for_update(skip_locked=True))]
    for job in stranded:
        gone = job.worker_id  # the update below clears it on the object too
        model, owner = type(job), MACHINES[type(job)].owner
        session.execute(delete(Allocation).where(getattr(Allocation, owner) == job.id))
        session.execute(update(model).where(model.id == job.id).values(worker_id=None, allocation=None))
        record_event(session, job, "unscheduled", f"worker {gone} went away before starting "
                     "it; scheduling it again", {"worker": gone})
    return len(stranded)
