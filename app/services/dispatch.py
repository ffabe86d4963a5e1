"""Kicking workers: a Celery message that carries only an id, sent after commit."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Deployment, Job, utcnow

log = logging.getLogger(__name__)

RUN_JOB_TASK = "specdeck.run_job"
RUN_DEPLOYMENT_TASK = "specdeck.run_deployment"
TASKS: dict[type, str] = {Job: RUN_JOB_TASK, Deployment: RUN_DEPLOYMENT_TASK}
# A restarted worker watches again the engine it left serving (workers/adoption.py).
ADOPT_DEPLOYMENT_TASK = "specdeck.adopt_deployment"


def kick(session: Session, obj: Job | Deployment, queue: str) -> None:
    """Record the kick and send it to ``queue`` (the worker the job or deployment was placed
    on) once the transaction commits; never on rollback."""
    model = type(obj)
    session.execute(update(model).where(model.id == obj.id).values(kicked_at=utcnow()))
    task, ident = TASKS[model], obj.id
    after_commit(session, lambda: send_run_job(ident, queue, task))


def send_run_job(ident: str, queue: str, task: str = RUN_JOB_TASK) -> None:
    send(task, [ident], queue)


def send(task: str, args: list[Any], queue: str) -> None:
    from app.celery_app import get_celery

    try:
        get_celery().send_task(task, args=args, queue=queue)
    except Exception:  # the broker is down: the row is committed and the reconciler re-kicks it
        log.warning("could not send %s%s; the reconciler will re-kick it", task, args,
                    exc_info=True)
