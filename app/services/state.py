"""The job state machine: one table of transitions and one function that changes status.

Nothing else assigns ``Job.status`` or ``Job.stage``. Every change is a compare-and-set on the
status the caller saw (and, for a worker, on its lease token), and writes an event row.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import Allocation, Job, JobEvent, utcnow


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Stage(StrEnum):
    PREPARING_DATA = "preparing_data"
    STARTING_VERIFIER = "starting_verifier"
    TRAINING = "training"
    EVALUATING = "evaluating"
    PUBLISHING = "publishing"


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

# Leaving running (re-queued or finished) gives back the lease, the processes and the GPUs.
_RELEASED = {"lock_owner": None, "lock_token": None, "lock_expires_at": None,
             "pgids": None, "pgid_host": None, "worker_id": None, "allocation": None}
_UNCHANGED: Any = object()


class IllegalTransition(Exception):
    """The table does not allow this change."""


class StaleJob(Exception):
    """The row changed under us (another status, or the lease token is no longer ours)."""


def transition(
    session: Session,
    job: Job,
    to: JobStatus,
    *,
    stage: Stage | None = _UNCHANGED,
    reason: str | None = None,
    error_code: str | None = None,
    token: str | None = None,
    message: str | None = None,
    data: dict[str, Any] | None = None,
    columns: dict[str, Any] | None = None,
) -> None:
    """Move ``job`` to ``to`` (and ``stage``), checking the table, and write an event.

    ``token`` guards a worker's write with its lease; ``columns`` carries the other columns that
    change with the status (lease fields on a claim, the attempt counter). Raises
    IllegalTransition, or StaleJob when zero rows matched.
    """
    current = JobStatus(job.status)
    if to not in TRANSITIONS[current]:
        raise IllegalTransition(f"job {job.id}: {current} -> {to} is not allowed")
    now = utcnow()
    values: dict[str, Any] = {"status": to.value, "updated_at": now, "status_reason": reason,
                              "error_code": error_code, **(columns or {})}
    if stage is not _UNCHANGED:
        values["stage"] = stage.value if stage else None
    if to == JobStatus.RUNNING and job.started_at is None:
        values["started_at"] = now
    if to in TERMINAL:
        values["finished_at"] = now
    releases = to in TERMINAL or to == JobStatus.QUEUED
    if releases:
        values = {**_RELEASED, **values}

    stmt = update(Job).where(Job.id == job.id, Job.status == current.value)
    if token is not None:
        stmt = stmt.where(Job.lock_token == token)
    if session.execute(stmt.values(**values)).rowcount != 1:
        raise StaleJob(f"job {job.id} changed (expected status {current})")
    if releases:
        session.execute(delete(Allocation).where(Allocation.job_id == job.id))
    for name, value in values.items():
        set_committed_value(job, name, value)

    new_stage = values.get("stage", job.stage)
    default = f"{current} -> {to}" + (f" ({new_stage})" if new_stage and to == JobStatus.RUNNING else "")
    session.add(JobEvent(job_id=job.id, kind="status", attempt=job.attempt, status=to.value,
                         stage=new_stage, message=message or reason or default, data=data))
    session.flush()


def record_event(session: Session, job: Job, kind: str, message: str,
                 data: dict[str, Any] | None = None) -> None:
    """An event that does not change status (progress, resume points, log excerpts)."""
    session.add(JobEvent(job_id=job.id, kind=kind, attempt=job.attempt, status=job.status,
                         stage=job.stage, message=message, data=data))


def initialize(session: Session, job: Job, message: str = "job created") -> None:
    """Give a new job its first status; the only place a status is set without a transition."""
    job.status = JobStatus.QUEUED.value
    session.add(job)
    session.flush()
    session.add(JobEvent(job_id=job.id, kind="status", attempt=0, status=job.status,
                         stage=None, message=message))
