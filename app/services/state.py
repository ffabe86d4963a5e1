"""The state machines of jobs and deployments: a table of transitions each, and one function
that changes status.

Nothing else assigns ``status`` (or a job's ``stage``). Every change is a compare-and-set on the
status the caller saw (and, for a worker, on its lease token), and writes an event row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import (
    Allocation,
    Deployment,
    DeploymentEvent,
    Job,
    JobCandidate,
    JobEvent,
    Promotion,
    utcnow,
)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Stage(StrEnum):
    REGENERATING_DATA = "regenerating_data"
    PREPARING_DATA = "preparing_data"
    STARTING_VERIFIER = "starting_verifier"
    TRAINING = "training"
    EVALUATING = "evaluating"
    PUBLISHING = "publishing"
    DEPLOYING = "deploying"  # the "deploy" option: the evaluated checkpoint promoted


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
LEASED = frozenset({JobStatus.RUNNING, JobStatus.CANCELLING})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED}),
    # running -> running is a stage change; running -> queued is a re-queue after a lost lease.
    JobStatus.RUNNING: frozenset({JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.SUCCEEDED,
                                  JobStatus.FAILED, JobStatus.CANCELLING}),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class CandidateStatus(StrEnum):
    """Where one of a job's drafters is: trained one after another (or side by side), then
    served together in the evaluation."""

    PENDING = "pending"  # not trained yet
    TRAINING = "training"
    TRAINED = "trained"  # its checkpoints are saved; the evaluation serves it next
    EVALUATED = "evaluated"  # served: its figures and rank are in ``evaluation``
    FAILED = "failed"  # its trainer or its engine failed: the reason and log tail say why
    STOPPED = "stopped"  # the job ended before it was done (cancelled, or the job failed)


CANDIDATE_TRANSITIONS: dict[CandidateStatus, frozenset[CandidateStatus]] = {
    # pending -> trained: its checkpoints were all saved already (an earlier attempt's).
    CandidateStatus.PENDING: frozenset({CandidateStatus.TRAINING, CandidateStatus.TRAINED,
                                        CandidateStatus.FAILED, CandidateStatus.STOPPED}),
    # training -> training: another attempt resumes it (a lost worker); -> pending: handed back.
    CandidateStatus.TRAINING: frozenset({CandidateStatus.TRAINING, CandidateStatus.PENDING,
                                         CandidateStatus.TRAINED, CandidateStatus.FAILED,
                                         CandidateStatus.STOPPED}),
    # trained -> trained: its checkpoints synced again by another attempt.
    CandidateStatus.TRAINED: frozenset({CandidateStatus.TRAINED, CandidateStatus.EVALUATED,
                                        CandidateStatus.FAILED, CandidateStatus.STOPPED}),
    CandidateStatus.EVALUATED: frozenset({CandidateStatus.EVALUATED}),
    CandidateStatus.FAILED: frozenset(),
    CandidateStatus.STOPPED: frozenset(),
}
CANDIDATE_FINAL = frozenset({CandidateStatus.EVALUATED, CandidateStatus.FAILED,
                             CandidateStatus.STOPPED})


def move_candidate(session: Session, job: Job, candidate: JobCandidate, to: CandidateStatus,
                   message: str, *, reason: str | None = None, error_code: str | None = None,
                   columns: dict[str, Any] | None = None, data: dict[str, Any] | None = None
                   ) -> None:
    """Move one of the job's candidates to ``to``, checking the table (compare-and-set on the
    status the caller saw), and record it as an event of the job (kind ``candidate``)."""
    current = CandidateStatus(candidate.status)
    if to not in CANDIDATE_TRANSITIONS[current]:
        raise IllegalTransition(f"{candidate.id}: {current} -> {to} is not allowed")
    values: dict[str, Any] = {"status": to.value, "updated_at": utcnow(), "status_reason": reason,
                              "error_code": error_code, **(columns or {})}
    stmt = update(JobCandidate).where(JobCandidate.id == candidate.id,
                                      JobCandidate.status == current.value)
    if session.execute(stmt.values(**values)).rowcount != 1:
        raise StaleJob(f"{candidate.id} changed (expected status {current})")
    for name, value in values.items():
        set_committed_value(candidate, name, value)
    record_event(session, job, "candidate", message,
                 {"candidate": candidate.name, "index": candidate.idx, "kind": candidate.kind,
                  "status": to.value, **({"reason": reason} if reason else {}), **(data or {})})


class DeploymentStatus(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


DEPLOYMENT_TRANSITIONS: dict[DeploymentStatus, frozenset[DeploymentStatus]] = {
    DeploymentStatus.PENDING: frozenset({DeploymentStatus.STARTING, DeploymentStatus.STOPPED,
                                         DeploymentStatus.FAILED}),
    # starting -> starting and ready -> starting are restarts after a crash (with backoff);
    # -> pending hands the deployment back when its worker is lost or shuts down.
    DeploymentStatus.STARTING: frozenset({DeploymentStatus.STARTING, DeploymentStatus.READY,
                                          DeploymentStatus.PENDING, DeploymentStatus.FAILED,
                                          DeploymentStatus.STOPPING}),
    DeploymentStatus.READY: frozenset({DeploymentStatus.STARTING, DeploymentStatus.PENDING,
                                       DeploymentStatus.FAILED, DeploymentStatus.STOPPING}),
    DeploymentStatus.STOPPING: frozenset({DeploymentStatus.STOPPED}),
    DeploymentStatus.STOPPED: frozenset(),
    DeploymentStatus.FAILED: frozenset(),
}


@dataclass(frozen=True)
class Machine:
    """The statuses of one kind of resource and what entering each one implies."""

    status: type[StrEnum]
    transitions: Mapping[Any, frozenset[Any]]
    terminal: frozenset[Any]
    waiting: Any  # the status of a resource handed back to the scheduler
    started: frozenset[Any]  # entering one of these stamps started_at
    event: type[JobEvent] | type[DeploymentEvent]
    owner: str  # the event's and allocation's column that points at the resource
    webhooks: Mapping[Any, str]  # entering one of these statuses sends this webhook event


MACHINES: dict[type, Machine] = {
    Job: Machine(JobStatus, TRANSITIONS, TERMINAL, JobStatus.QUEUED,
                 frozenset({JobStatus.RUNNING}), JobEvent, "job_id",
                 {s: f"job.{s.value}" for s in TERMINAL}),
    Deployment: Machine(DeploymentStatus, DEPLOYMENT_TRANSITIONS,
                        frozenset({DeploymentStatus.STOPPED, DeploymentStatus.FAILED}),
                        DeploymentStatus.PENDING, frozenset({DeploymentStatus.STARTING}),
                        DeploymentEvent, "deployment_id",
                        {s: f"deployment.{s.value}" for s in (DeploymentStatus.READY,
                                                              DeploymentStatus.FAILED)}),
}

# Going back to the scheduler or ending gives back the lease, the processes and the GPUs.
_RELEASED = {"lock_owner": None, "lock_token": None, "lock_expires_at": None,
             "pgids": None, "pgid_host": None, "worker_id": None, "allocation": None}
_UNCHANGED: Any = object()


class IllegalTransition(Exception):
    """The table does not allow this change."""


class StaleJob(Exception):
    """The row changed under us (another status, or the lease token is no longer ours)."""


def transition(
    session: Session,
    obj: Job | Deployment,
    to: StrEnum,
    *,
    stage: Stage | None = _UNCHANGED,
    reason: str | None = None,
    error_code: str | None = None,
    token: str | None = None,
    message: str | None = None,
    data: dict[str, Any] | None = None,
    columns: dict[str, Any] | None = None,
) -> None:
    """Move a job or a deployment to ``to`` (a job also to ``stage``), checking its table, and
    write an event, and the webhook event it implies to the outbox (same transaction).

    ``token`` guards a worker's write with its lease; ``columns`` carries the other columns that
    change with the status (lease fields on a claim, the attempt counter). Raises
    IllegalTransition, or StaleJob when zero rows matched.
    """
    machine = MACHINES[type(obj)]
    model = type(obj)
    current = machine.status(obj.status)
    if to not in machine.transitions[current]:
        raise IllegalTransition(f"{obj.id}: {current} -> {to} is not allowed")
    now = utcnow()
    values: dict[str, Any] = {"status": to.value, "updated_at": now, "status_reason": reason,
                              **(columns or {})}
    if isinstance(obj, Job):
        values["error_code"] = error_code
        if stage is not _UNCHANGED:
            values["stage"] = stage.value if stage else None
    if to in machine.started and obj.started_at is None:
        values["started_at"] = now
    if to in machine.terminal:
        values["finished_at"] = now
    releases = to in machine.terminal or to == machine.waiting
    if releases:
        values = {**_RELEASED, **values}

    stmt = update(model).where(model.id == obj.id, model.status == current.value)
    if token is not None:
        stmt = stmt.where(model.lock_token == token)
    if session.execute(stmt.values(**values)).rowcount != 1:
        raise StaleJob(f"{obj.id} changed (expected status {current})")
    if releases:
        session.execute(delete(Allocation).where(getattr(Allocation, machine.owner) == obj.id))
    if isinstance(obj, Job) and to in (JobStatus.FAILED, JobStatus.CANCELLED):
        # Its drafters still waiting or training stop with it (a trained one stays trained).
        session.execute(update(JobCandidate).where(
            JobCandidate.job_id == obj.id,
            JobCandidate.status.in_([CandidateStatus.PENDING.value, CandidateStatus.TRAINING.value]))
            .values(status=CandidateStatus.STOPPED.value, updated_at=now,
                    status_reason=f"the job {to.value}" + (f": {reason}" if reason else "")))
    for name, value in values.items():
        set_committed_value(obj, name, value)

    new_stage = getattr(obj, "stage", None)
    default = f"{current} -> {to}" + (f" ({new_stage})" if new_stage and to == current else "")
    session.add(machine.event(**{machine.owner: obj.id}, kind="status", attempt=obj.attempt,
                              status=to.value, stage=new_stage,
                              message=message or reason or default, data=data))
    session.flush()
    # A replica's status is its deployment's business (replica_states), not a webhook's.
    if (webhook_event := machine.webhooks.get(to)) and getattr(obj, "replica_of", None) is None:
        from app.services.webhooks import enqueue  # it reads jobs and deployments, which import us

        enqueue(session, obj.project_id, webhook_event, obj)


def record_event(session: Session, obj: Job | Deployment, kind: str, message: str,
                 data: dict[str, Any] | None = None) -> None:
    """An event that does not change status (progress, resume points, log excerpts)."""
    machine = MACHINES[type(obj)]
    session.add(machine.event(**{machine.owner: obj.id}, kind=kind, attempt=obj.attempt,
                              status=obj.status, stage=getattr(obj, "stage", None),
                              message=message, data=data))


def initialize(session: Session, obj: Job | Deployment, message: str = "created") -> None:
    """Give a new job or deployment its first status (queued, pending); the only place a status
    is set without a transition."""
    machine = MACHINES[type(obj)]
    obj.status = machine.waiting.value
    session.add(obj)
    session.flush()
    session.add(machine.event(**{machine.owner: obj.id}, kind="status", attempt=0,
                              status=obj.status, stage=None, message=message))


class PromotionStatus(StrEnum):
    """The steps of a switch of drafter; the deployment itself stays ``ready`` throughout."""

    PENDING = "pending"  # asked for; the deployment's worker picks it up on its next check
    STARTING = "starting"  # the new engine starts beside the old one
    DRAINING = "draining"  # the route points at the new engine; the old one finishes its requests
    SUCCEEDED = "succeeded"  # the old engine is stopped
    FAILED = "failed"  # the new engine never became ready (or the deployment ended): the old serves


PROMOTION_TRANSITIONS: dict[PromotionStatus, frozenset[PromotionStatus]] = {
    PromotionStatus.PENDING: frozenset({PromotionStatus.STARTING, PromotionStatus.FAILED}),
    PromotionStatus.STARTING: frozenset({PromotionStatus.DRAINING, PromotionStatus.FAILED}),
    # Once the route has switched there is no going back: the new drafter serves.
    PromotionStatus.DRAINING: frozenset({PromotionStatus.SUCCEEDED}),
    PromotionStatus.SUCCEEDED: frozenset(),
    PromotionStatus.FAILED: frozenset(),
}
PROMOTION_ACTIVE = frozenset({PromotionStatus.PENDING, PromotionStatus.STARTING,
                              PromotionStatus.DRAINING})


def move_promotion(session: Session, promotion: Promotion, deployment: Deployment,
                   to: PromotionStatus, message: str, *, reason: str | None = None,
                   data: dict[str, Any] | None = None) -> None:
    """Move a promotion to its next step, checking the table (compare-and-set on the step the
    caller saw), and record the step as an event of the deployment (kind ``promotion``)."""
    current = PromotionStatus(promotion.status)
    if to not in PROMOTION_TRANSITIONS[current]:
        raise IllegalTransition(f"{promotion.id}: {current} -> {to} is not allowed")
    now = utcnow()
    values: dict[str, Any] = {"status": to.value, "updated_at": now, "status_reason": reason}
    if not PROMOTION_TRANSITIONS[to]:
        values["finished_at"] = now
    stmt = update(Promotion).where(Promotion.id == promotion.id, Promotion.status == current.value)
    if session.execute(stmt.values(**values)).rowcount != 1:
        raise StaleJob(f"{promotion.id} changed (expected status {current})")
    for name, value in values.items():
        set_committed_value(promotion, name, value)
    record_event(session, deployment, "promotion", message,
                 {"promotion": promotion.id, "kind": promotion.kind, "step": to.value, **(data or {})})
    session.flush()
    if not PROMOTION_TRANSITIONS[to]:
        from app.services.promotions import announce_if_ended  # it imports this module

        announce_if_ended(session, promotion)
