"""The periodic reconciler, run by every worker: re-queue jobs (and re-place deployments) whose
worker died (lease expired) and stop the processes it left on this host, fail publishes whose worker
died, schedule what waits, re-kick lost messages, purge captured traffic and live acceptance
points past their retention, and heartbeat the worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import session_scope
from app.db.models import Checkpoint, Deployment, Job, Worker, utcnow
from app.services import capture, live_metrics
from app.services import workers as registry
from app.services.dispatch import kick
from app.services.scheduling import schedule, unplace_from_dead_workers
from app.services.state import (LEASED, MACHINES, DeploymentStatus, JobStatus, StaleJob,
                                record_event, transition)
from app.settings import Settings, get_settings
from workers.adoption import adopt
from workers.supervisor import Group, reap

log = logging.getLogger(__name__)
BATCH = 100
# The statuses in which a worker holds the row's lease (and runs its processes).
HELD = {Job: LEASED, Deployment: frozenset({DeploymentStatus.STARTING, DeploymentStatus.READY,
                                             DeploymentStatus.STOPPING})}


def _lost(session: Session, row: Job | Deployment, why: str) -> None:
    """A job or deployment whose worker is gone goes back: a job re-queued for its next attempt
    (or failed at the retry limit), a deployment to pending (placed again); a cancel or a
    delete in progress completes."""
    if isinstance(row, Deployment):
        if row.status == DeploymentStatus.STOPPING:
            transition(session, row, DeploymentStatus.STOPPED, reason="deleted by user",
                       message=f"{why}; stop completed", columns={"upstream_url": None})
        else:
            transition(session, row, DeploymentStatus.PENDING,
                       reason="re-placed after its worker was lost", message=why,
                       columns={"upstream_url": None})
    elif row.status == JobStatus.CANCELLING:
        transition(session, row, JobStatus.CANCELLED, reason="cancelled by user",
                   message=f"{why}; cancel completed")
    elif row.attempt >= (limit := get_settings().max_attempts):
        transition(session, row, JobStatus.FAILED, error_code="worker_lost",
                   reason=f"{why} (attempt {row.attempt}); retry limit of {limit} attempts reached")
    else:
        transition(session, row, JobStatus.QUEUED, reason="re-queued after a worker was lost",
                   message=f"{why}; re-queued for attempt {row.attempt + 1}")


@dataclass(frozen=True)
class Orphans:
    """The process groups a lost worker recorded for one job or deployment on this host."""

    model: type[Job] | type[Deployment]
    row_id: str
    groups: list[Group]
    why: str


def _hand_back(rows: list[Job | Deployment], session: Session, why: Callable[[Job | Deployment], str],
               host: str) -> list[Orphans]:
    """Hand each row back (committed with the caller's session); returns the process groups
    its worker left on this host, to be stopped once the rows' locks are released."""
    orphans = []
    for row in rows:
        groups = [Group.from_json(g) for g in row.pgids or []] if row.pgid_host == host else []
        reason = why(row)  # before the hand-back clears the row's owner
        try:
            _lost(session, row, reason)
        except StaleJob:
            continue
        if groups:
            orphans.append(Orphans(type(row), row.id, groups, reason))
    return orphans


def stop_orphans(found: list[Orphans]) -> None:
    """Stop what a lost worker left running (only processes that are still the ones it
    started: same boot, same start time, the job's id in their environment) and say so on
    the job or deployment."""
    for orphans in found:
        pids = reap(orphans.groups, orphans.row_id)
        if not pids:
            continue
        with session_scope() as session:
            row = session.get(orphans.model, orphans.row_id)
            record_event(session, row, "orphans_stopped",
                         f"{orphans.why}: the processes it left running were stopped "
                         f"(pids {', '.join(map(str, sorted(pids)))})", {"pids": sorted(pids)})


def expire_leases(host: str) -> int:
    """Jobs and deployments whose lease ran out (their worker stopped heartbeating) go back,
    and what the worker left running on this host is stopped."""
    found: list[Orphans] = []
    handled = 0
    with session_scope() as session:
        for model in (Job, Deployment):
            expired = session.scalars(
                select(model).where(model.status.in_([s.value for s in HELD[model]]),
                                    model.lock_expires_at < utcnow())
                .order_by(model.lock_expires_at).limit(BATCH).with_for_update(skip_locked=True)
            ).all()
            found += _hand_back(list(expired), session,
                                lambda row: f"worker {row.lock_owner} stopped heartbeating (lease expired)",
                                host)
            handled += len(expired)
    stop_orphans(found)
    return handled


def fail_orphaned_publishes(settings: Settings) -> int:
    """Publishes whose worker stopped heartbeating (it died mid-upload, or went with the task's
    message): failed, so the checkpoint can be published again."""
    cutoff = registry.heartbeat_cutoff(settings.reconcile_seconds)
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


def recover_own(settings: Settings, host: str) -> int:
    """At start-up: an earlier run of this worker died (SIGKILL, OOM, power) holding jobs or
    deployments. The engines it left serving, still ready, are adopted (workers/adoption.py);
    the rest is handed back now rather than when the leases run out, and what it left running
    here is stopped. Returns how many were handed back."""
    worker_id = settings.worker_name
    found: list[Orphans] = []
    handed_back = 0
    with session_scope() as session:
        for model in (Job, Deployment):
            rows = session.scalars(
                select(model).where(model.status.in_([s.value for s in HELD[model]]),
                                    model.lock_owner == worker_id)
                .with_for_update(skip_locked=True)).all()
            lost = [row for row in rows
                    if not (isinstance(row, Deployment) and adopt(session, row, settings, host))]
            found += _hand_back(lost, session, lambda row: f"worker {worker_id} restarted", host)
            handed_back += len(lost)
    stop_orphans(found)
    return handed_back


def reconcile_once(settings: Settings, worker_id: str, host: str) -> None:
    with session_scope() as session:
        registry.heartbeat(session, worker_id)
    expire_leases(host)
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
        # The first round at once: a job created while this worker was starting (no worker had
        # a free slot when it was created) is placed now, not one interval later.
        while True:
            try:
                reconcile_once(self.settings, self.worker_id, self.host)
            except Exception:  # the database may blip; the next round tries again
                log.exception("reconcile round failed")
            if self.stopped.wait(self.settings.reconcile_seconds):
                return
