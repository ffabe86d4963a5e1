"""The periodic reconciler, run by every worker: re-queue jobs whose worker died (lease
expired) and reap their orphaned processes, schedule what waits, re-kick lost messages, and
heartbeat the worker."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import select

from app.db import session_scope
from app.db.models import Job, Worker, utcnow
from app.services import workers as registry
from app.services.dispatch import kick
from app.services.scheduling import schedule, unplace_from_dead_workers
from app.services.state import LEASED, JobStatus, StaleJob, transition
from app.settings import Settings
from workers.supervisor import reap

log = logging.getLogger(__name__)
BATCH = 100


def reap_job_processes(job: Job, host: str) -> None:
    if job.pgid_host == host:
        for pgid in job.pgids or []:
            reap(pgid, job.id)


def expire_leases(settings: Settings, host: str) -> int:
    """Jobs whose lease ran out: re-queue (up to the retry limit), or fail, or finish a cancel."""
    handled = 0
    with session_scope() as session:
        expired = session.scalars(
            select(Job).where(Job.status.in_([s.value for s in LEASED]),
                              Job.lock_expires_at < utcnow())
            .order_by(Job.lock_expires_at).limit(BATCH).with_for_update(skip_locked=True)
        ).all()
        for job in expired:
            reap_job_processes(job, host)
            lost = f"worker {job.lock_owner} stopped heartbeating (attempt {job.attempt})"
            try:
                if job.status == JobStatus.CANCELLING:
                    transition(session, job, JobStatus.CANCELLED, reason="cancelled by user",
                               message=f"{lost}; cancel completed")
                elif job.attempt >= settings.max_attempts:
                    transition(session, job, JobStatus.FAILED, error_code="worker_lost",
                               reason=f"{lost}; retry limit of {settings.max_attempts} attempts reached")
                else:
                    transition(session, job, JobStatus.QUEUED, reason="re-queued after a worker was lost",
                               message=f"{lost}; lease expired, re-queued for attempt {job.attempt + 1}")
                handled += 1
            except StaleJob:
                continue
    return handled


def rekick_queued(settings: Settings) -> int:
    """Placed jobs still queued ``rekick_after_seconds`` after their kick: the message was lost."""
    cutoff = utcnow() - timedelta(seconds=settings.rekick_after_seconds)
    with session_scope() as session:
        stale = session.execute(
            select(Job, Worker.queue).join(Worker, Worker.id == Job.worker_id)
            .where(Job.status == JobStatus.QUEUED.value,
                   (Job.kicked_at.is_(None)) | (Job.kicked_at < cutoff))
            .order_by(Job.id).limit(BATCH).with_for_update(of=Job, skip_locked=True)
        ).all()
        for job, queue in stale:
            log.info("re-kicking %s on %s (its message was lost)", job.id, queue)
            kick(session, job, queue=queue)
        return len(stale)


def reap_own_orphans(worker_id: str, host: str) -> None:
    """At start-up: a previous incarnation of this worker died; kill what it left running."""
    with session_scope() as session:
        jobs = session.scalars(select(Job).where(Job.lock_owner == worker_id,
                                                 Job.pgid_host == host)).all()
        for job in jobs:
            reap_job_processes(job, host)


def reconcile_once(settings: Settings, worker_id: str, host: str) -> None:
    with session_scope() as session:
        registry.heartbeat(session, worker_id)
    expire_leases(settings, host)
    with session_scope() as session:
        unplace_from_dead_workers(session, settings)
        schedule(session, settings)
    rekick_queued(settings)


class Reconciler(threading.Thread):
    def __init__(self, settings: Settings, worker_id: str, host: str) -> None:
        super().__init__(name="reconciler", daemon=True)
        self.settings, self.worker_id, self.host = settings, worker_id, host
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.settings.reconcile_seconds):
            try:
                reconcile_once(self.settings, self.worker_id, self.host)
            except Exception:  # the database may blip; the next round tries again
                log.exception("reconcile round failed")
