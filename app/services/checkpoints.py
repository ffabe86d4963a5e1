"""Checkpoints: read them, and publish one to the Hugging Face Hub on the worker holding it."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Checkpoint, Job, Secret, Worker, utcnow
from app.errors import APIError, not_found
from app.schemas.jobs import PublishRequest
from app.services.dispatch import send
from app.services.scheduling import MISSED_HEARTBEATS
from app.services.secrets import HF_TOKEN
from app.settings import Settings

PUBLISH_TASK = "specdeck.publish_checkpoint"


def get_checkpoint(session: Session, project_id: str, checkpoint_id: str) -> Checkpoint:
    checkpoint = session.scalars(
        select(Checkpoint).join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Job.project_id == project_id)).first()
    if checkpoint is None:
        raise not_found("checkpoint", checkpoint_id)
    return checkpoint


def request_publish(session: Session, project_id: str, checkpoint_id: str, body: PublishRequest,
                    settings: Settings) -> Checkpoint:
    """Mark the checkpoint as publishing and send the upload to the worker that holds it."""
    checkpoint = get_checkpoint(session, project_id, checkpoint_id)
    if checkpoint.publish_status == "publishing":
        raise APIError(409, f"checkpoint {checkpoint.id} is being published already",
                       code="publish_in_progress")
    if session.scalar(select(Secret.id).where(Secret.project_id == project_id,
                                              Secret.name == HF_TOKEN)) is None:
        raise APIError(422, "the project has no HF_TOKEN secret: PUT /api/secrets/HF_TOKEN first",
                       code="missing_secret", param=HF_TOKEN)
    worker = session.get(Worker, checkpoint.worker_id) if checkpoint.worker_id else None
    cutoff = utcnow() - timedelta(seconds=settings.reconcile_seconds * MISSED_HEARTBEATS)
    if worker is None or worker.last_heartbeat_at < cutoff:
        raise APIError(409, f"the worker holding checkpoint {checkpoint.id} "
                       f"({checkpoint.worker_id}) is offline", code="checkpoint_offline")
    checkpoint.publish_status, checkpoint.publish_error = "publishing", None
    args, queue = [checkpoint.id, body.repo_id, body.private], worker.queue
    after_commit(session, lambda: send(PUBLISH_TASK, args, queue))
    return checkpoint
