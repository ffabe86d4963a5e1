"""The periodic reconciler, run by every worker: re-queue jobs (and re-place deployments) whose
worker died (lease expired) and reap their orphaned processes, fail publishes whose worker
died, schedule what waits, re-kick lost messages, purge captured traffic and live acceptance
points past their retention, and heartbeat the worker."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import select

from app.db import session_scope
from app.db.models import Checkpoint, Deployment, Job, Worker, utcnow
from app.services import capture, live_metrics
from app.services import workers as registry
from app.services.dispatch import kick
from app.services.scheduling import MISSED_HEARTBEATS, schedule, unplace_from_dead_workers
from app.services.state import LEASED, MACHINES, DeploymentStatus, JobStatus, StaleJob, transition
from app.settings import Settings
from workers.supervisor import reap

log = logging.getLogger(__name__)
BATCH = 100


def reap_job_processes(job: Job | Deployment, host: str) -> None:
    if job.pgid_host == host:
        for pgid in job.pgids or []:
            reap(pgid, job.id)


def expire_deployment_leases(settings: Settings, host: str) -> int:
    """Deployments whose worker died: back to pending (placed again), or stopped if deleted."""
    leased = [DeploymentStatus.STARTING.value, DeploymentStatus.READY.value,
              DeploymentStatus.STOPPING.value]
    with session_scope() as session:
        expired = session.scalars(
            select(Deployment).where(Deployment.status.in_(leased), Deployment.lock_expires_at < utcnow())
            .limit(BATCH).with_for_update(skip_locked=True)).all()
        for deployment in expired:
            reap_job_processes(deployment, host)
            lost = f"worker {deployment.lock_owner} stopped heartbeating"
            try:
                if deployment.status == DeploymentStatus.STOPPING:
                    transition(session, deployment, DeploymentStatus.STOPPED, reason="deleted by user",
                               message=f"{lost}; stop completed", columns={"upstream_url": None})
                else:
                    transition(session, deployment, DeploymentStatus.PENDING,
                               reason="re-placed after its worker was lost", message=lost,
                               columns={"upstream_url": None})
            except StaleJob:
                continue
        return len(expired)


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


def fail_orphaned_publishes(settings: Settings) -> int:
    """Publishes whose worker stopped heartbeating (it died mid-upload, or went with the task's
    message): failed, so the checkpoint can be published again."""
    cutoff = utcnow() - timedelta(seconds=settings.reconcile_seconds * MISSED_HEARTBEATS)
    with session_scope() as session:
        orphaned = session.scalars(
            select(Checkpoint).outerjoin(Worker, Worker.id == Checkpoint.worker_id)
            .where(Checkpoint.publish_status == "publishing",
                   Worker.id.is_(None) | (Worker.last_heartbeat_at < cutoff))
            .limit(BATCH).with_for_update(of=Checkpoint, skip_locked=True)).all()
        for checkpoint in orphaned:
            checkpoint.publish_status = "failed"
            checkpoint.publish_error = (f"worker {checkpoint.worker_id} stopped heartbeating "
                                        "while publishing; publish again once it is back")
        return len(orphaned)


def rekick_queued(settings: Settings) -> int:
    """Placed jobs (and deployments) still waiting ``rekick_after_seconds`` after their kick:
    the message was lost."""
    cutoff = utcnow() - timedelta(seconds=settings.rekick_after_seconds)
    count = 0
    with session_scope() as session:
        for model in (Job, Deployment):
            stale = session.execute(
                select(model, Worker.queue).join(Worker, Worker.id == model.worker_id)
                .where(model.status == MACHINES[model].waiting.value,
                       (model.kicked_at.is_(None)) | (model.kicked_at < cutoff))
                .order_by(model.id).limit(BATCH).with_for_update(of=model, skip_locked=True)
            ).all()
            for row, queue in stale:
                log.info("re-kicking %s on %s (its message was lost)", row.id, queue)
                kick(session, row, queue=queue)
            count += len(stale)
    return count


def reap_own_orphans(worker_id: str, host: str) -> None:
    """At start-up: a previous incarnation of this worker died; kill what it left running."""
    with session_scope() as session:
        for model in (Job, Deployment):
            for row in session.scalars(select(model).where(model.lock_owner == worker_id,
                                                           model.pgid_host == host)):
                reap_job_processes(row, host)


def reconcile_once(settings: Settings, worker_id: str, host: str) -> None:
    with session_scope() as session:
        registry.heartbeat(session, worker_id)
    expire_leases(settings, host)
    expire_deployment_leases(settings, host)
    fail_orphaned_publishes(settings)
    with session_scope() as session:
        capture.purge_expired(session)  # traffic capture's retention
        live_metrics.purge_expired(session, settings.live_metrics_retention_days)
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
