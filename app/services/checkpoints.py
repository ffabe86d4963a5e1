"""Checkpoints: read them, and publish one to the Hugging Face Hub on the worker holding it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Checkpoint, Job, Secret, Worker
from app.errors import APIError, not_found
from app.schemas.jobs import PublishRequest
from app.services.dispatch import send
from app.services.secrets import HF_TOKEN
from app.services.verifier import load_config
from app.services.workers import heartbeat_cutoff
from app.settings import Settings

PUBLISH_TASK = "specdeck.publish_checkpoint"


def get_checkpoint(session: Session, project_id: str, checkpoint_id: str) -> Checkpoint:
    checkpoint = session.scalars(
        select(Checkpoint).join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Job.project_id == project_id)).first()
    if checkpoint is None:
        raise not_found("checkpoint", checkpoint_id)
    return checkpoint


def drafter_block_size(config: dict[str, Any], param: str) -> int:
    """The block size of a speculators-format DFlash drafter's config; 422 for anything else."""
    block_size = config.get("block_size")
    if (config.get("speculators_model_type") != "dflash" or not isinstance(block_size, int)
            or isinstance(block_size, bool) or block_size < 2):
        raise APIError(422, "the drafter is not a speculators-format DFlash checkpoint (its "
                       "config.json needs speculators_model_type 'dflash' and an integer block_size)",
                       code="invalid_drafter", param=param)
    return block_size


@dataclass(frozen=True)
class CheckpointDrafter:
    """A job's checkpoint as a drafter: what deployments serve, promotions switch to and warm
    starts (``init_from``) load."""

    checkpoint: Checkpoint
    job: Job
    config: dict[str, Any]
    block_size: int

    @property
    def verifier(self) -> str:
        """The verifier it was trained for, as resolved when its job was created."""
        return self.job.spec["verifier_info"]["reference"]

    def source(self) -> dict[str, Any]:
        return {"kind": "checkpoint", "checkpoint_id": self.checkpoint.id, "job_id": self.job.id}


def checkpoint_drafter(session: Session, project_id: str, checkpoint_id: str, *,
                       param: str) -> CheckpointDrafter:
    """The project's checkpoint ``checkpoint_id`` with its DFlash config read from disk; a 422
    naming ``param`` when there is no such checkpoint, its files are gone or it is no DFlash
    drafter."""
    row = session.execute(
        select(Checkpoint, Job).join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Job.project_id == project_id)).first()
    if row is None:
        raise APIError(422, f"no checkpoint with id '{checkpoint_id}'",
                       code="checkpoint_not_found", param=param)
    checkpoint, job = row
    config_file = Path(checkpoint.path) / "config.json"
    if not config_file.is_file():
        raise APIError(422, f"checkpoint {checkpoint.id} is no longer on disk",
                       code="checkpoint_not_found", param=param)
    config = load_config(config_file, checkpoint.id, param=param)
    return CheckpointDrafter(checkpoint, job, config, drafter_block_size(config, param))


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
    cutoff = heartbeat_cutoff(settings.reconcile_seconds)
    if worker is None or worker.last_heartbeat_at < cutoff:
        raise APIError(409, f"the worker holding checkpoint {checkpoint.id} "
                       f"({checkpoint.worker_id}) is offline", code="checkpoint_offline")
    checkpoint.publish_status, checkpoint.publish_error = "publishing", None
    args, queue = [checkpoint.id, body.repo_id, body.private], worker.queue
    after_commit(session, lambda: send(PUBLISH_TASK, args, queue))
    return checkpoint
