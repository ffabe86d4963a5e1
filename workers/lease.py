"""Leases on jobs: claim with SKIP LOCKED, heartbeat while working, guard every write."""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import session_scope
from app.db.models import Job, utcnow
from app.services.state import JobStatus, StaleJob, transition

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Zero rows matched our token: another worker owns the job now. Stop and discard."""


@dataclass(frozen=True)
class Lease:
    job_id: str
    token: str
    owner: str
    attempt: int

    def load(self, session: Session) -> Job:
        job = session.scalars(select(Job).where(Job.id == self.job_id,
                                                Job.lock_token == self.token)).first()
        if job is None:
            raise LeaseLost(self.job_id)
        return job

    def update(self, session: Session, **values: Any) -> None:
        """A guarded write: applies only while the lease is ours."""
        stmt = update(Job).where(Job.id == self.job_id, Job.lock_token == self.token)
        if session.execute(stmt.values(**values)).rowcount != 1:
            raise LeaseLost(self.job_id)


def claim(job_id: str, owner: str, lease_seconds: float) -> Lease | None:
    """Take a queued job placed on this worker. None when it is not (a duplicate or stale
    message, or the job was re-placed elsewhere)."""
    with session_scope() as session:
        job = session.scalars(
            select(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value,
                              Job.worker_id == owner)
            .with_for_update(skip_locked=True)
        ).first()
        if job is None:
            return None
        token = secrets.token_hex(16)
        attempt = job.attempt + 1
        try:
            transition(session, job, JobStatus.RUNNING, stage=None,
                       message=f"claimed by {owner} (attempt {attempt})",
                       columns={"lock_owner": owner, "lock_token": token, "attempt": attempt,
                                "lock_expires_at": utcnow() + timedelta(seconds=lease_seconds)})
        except StaleJob:
            return None
        return Lease(job_id=job_id, token=token, owner=owner, attempt=attempt)


class Heartbeat(threading.Thread):
    """Renews the lease every ``interval`` seconds and notices cancel requests and takeovers."""

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
            status = session.scalar(select(Job.status).where(Job.id == self.lease.job_id))
            if status == JobStatus.CANCELLING.value:
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
