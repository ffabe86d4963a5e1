"""Kicking workers: a Celery message that carries only the job id, sent after commit."""

from __future__ import annotations

import logging

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Job, utcnow

log = logging.getLogger(__name__)

RUN_JOB_TASK = "specdeck.run_job"


def kick(session: Session, job: Job, queue: str) -> None:
    """Record the kick and send it to ``queue`` (the worker the job was placed on) once the
    transaction commits; never on rollback."""
    session.execute(update(Job).where(Job.id == job.id).values(kicked_at=utcnow()))
    job_id = job.id
    after_commit(session, lambda: send_run_job(job_id, queue))


def send_run_job(job_id: str, queue: str) -> None:
    from workers.celery_app import get_celery

    try:
        get_celery().send_task(RUN_JOB_TASK, args=[job_id], queue=queue)
    except Exception:  # the broker is down: the row is committed and the reconciler re-kicks it
        log.warning("could not send %s for %s; the reconciler will re-kick it", RUN_JOB_TASK,
                    job_id, exc_info=True)
