"""Leases on jobs and deployments: claim with SKIP LOCKED, heartbeat while working, guard
every write with the lease token."""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import session_scope
from app.db.models import Deployment, Job, utcnow
from app.services.state import MACHINES, DeploymentStatus, JobStatus, StaleJob, transition

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Zero rows matched our token: another worker owns the job now. Stop and discard."""


Leased = Job | Deployment
# What a claim moves each kind to, and the status that asks its worker to stop.
CLAIMED: dict[type, StrEnum] = {Job: JobStatus.RUNNING, Deployment: DeploymentStatus.STARTING}
STOP_REQUESTED: dict[type, StrEnum] = {Job: JobStatus.CANCELLING, Deployment: DeploymentStatus.STOPPING}


@dataclass(frozen=True)
class Lease:
    job_id: str  # the job's or deployment's id
    token: str
    owner: str
    attempt: int
    model: type[Leased] = Job

    def load(self, session: Session) -> Any:
        row = session.scalars(select(self.model).where(self.model.id == self.job_id,
                                                       self.model.lock_token == self.token)).first()
        if row is None:
            raise LeaseLost(self.job_id)
        return row

    def update(self, session: Session, **values: Any) -> None:
        """A guarded write: applies only while the lease is ours."""
        stmt = update(self.model).where(self.model.id == self.job_id,
                                        self.model.lock_token == self.token)
        if session.execute(stmt.values(**values)).rowcount != 1:
            raise LeaseLost(self.job_id)


def claim(job_id: str, owner: str, lease_seconds: float, model: type[Leased] = Job,
          columns: dict[str, Any] | None = None) -> Lease | None:
    """Take a queued job (or pending deployment) placed on this worker. None when it is not: a
    duplicate or stale message, or it was placed elsewhere since."""
    waiting = MACHINES[model].waiting
    with session_scope() as session:
        # Waits for a transaction that holds the row (a cancel, a reconciler's round) rather than
        # skipping it: a skipped row would drop this message, and the job would wait for a
        # re-kick. A duplicate message waits for the first claim, then finds the row running.
        row = session.scalars(
            select(model).where(model.id == job_id, model.status == waiting.value,
                                model.worker_id == owner)
            .with_for_update()
        ).first()
        if row is None:
            return None
        token = secrets.token_hex(16)
        attempt = row.attempt + 1
        extra = {"stage": None} if model is Job else {}
        try:
            transition(session, row, CLAIMED[model], message=f"claimed by {owner} (attempt {attempt})",
                       columns={"lock_owner": owner, "lock_token": token, "attempt": attempt,
                                "lock_expires_at": utcnow() + timedelta(seconds=lease_seconds),
                                **(columns or {})}, **extra)
        except StaleJob:
            return None
        return Lease(job_id=job_id, token=token, owner=owner, attempt=attempt, model=model)


class Heartbeat(threading.Thread):
    """Renews the lease every ``interval`` seconds and notices stop requests (a job's cancel, a
    deployment's delete) and takeovers."""

    def __init__(self, lease: Lease, *, interval: float, lease_seconds: float) -> None:
        super().__init__(name=f"heartbeat-{lease.job_id}", daemon=True)
        self.lease, self.interval, self.lease_seconds = lease, interval, lease_seconds
        self.cancel_requested = threading.Event()
        self.lost = threading.Event()
        self._stop_event = threading.Event()

    def renew(self) -> None:
        with session_scope() as session:
            try:
                self.lease.update(session, lock_expires_at=utcnow() + timedelta(seconds=self.lease_seconds))
            except LeaseLost:
                log.warning("lease on %s lost", self.lease.job_id)
                self.lost.set()
                return
            model = self.lease.model
            status = session.scalar(select(model.status).where(model.id == self.lease.job_id))
            if status == STOP_REQUESTED[model].value:
                self.cancel_requested.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.renew()
            except Exception:  # a database blip: keep trying until the lease itself expires
                log.exception("heartbeat for %s failed", self.lease.job_id)

    def __enter__(self) -> "Heartbeat":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join(timeout=self.interval + 5)
