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
from app.schemas.drafters import KINDS
from app.schemas.job_spec import JobSpec
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


@dataclass(frozen=True)
class DrafterConfig:
    """What a speculators-format drafter's config.json says of how it is served."""

    kind: str  # speculators_model_type: a key of app.schemas.drafters.KINDS
    num_speculative_tokens: int  # what it drafts per step
    block_size: int | None  # the DFlash family's block

    def serving(self) -> dict[str, Any]:
        """The fields a deployment's spec records of its drafter."""
        return {"kind": self.kind, "block_size": self.block_size,
                "num_speculative_tokens": self.num_speculative_tokens}


def _positive(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def read_drafter(config: dict[str, Any], param: str) -> DrafterConfig:
    """The kind and draft length of a speculators-format drafter's config: its
    ``speculators_model_type``, and its proposal's ``speculative_tokens`` (for DFlash, whose
    block_size says it, block_size - 1 when the config has no proposal); 422 for anything else."""
    kind, block_size = config.get("speculators_model_type"), config.get("block_size")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    if kind == "dflash":
        if not _positive(block_size, 2):
            raise APIError(422, "the drafter is not a speculators-format DFlash checkpoint (its "
                           "config.json needs speculators_model_type 'dflash' and an integer "
                           "block_size)", code="invalid_drafter", param=param)
        return DrafterConfig("dflash", tokens if _positive(tokens, 1) else block_size - 1,
                             block_size)
    if kind not in KINDS or not _positive(tokens, 1):
        raise APIError(422, "the drafter is not a speculators-format checkpoint of a kind SpecDeck "
                       f"serves ({', '.join(KINDS)}): its config.json needs "
                       "speculators_model_type and speculators_config.proposal_methods[0]."
                       "speculative_tokens", code="invalid_drafter", param=param)
    return DrafterConfig(kind, tokens, block_size if _positive(block_size, 2) else None)


@dataclass(frozen=True)
class CheckpointDrafter:
    """A job's checkpoint as a drafter: what deployments serve, promotions switch to and warm
    starts (``init_from``) load."""

    checkpoint: Checkpoint
    job: Job
    config: dict[str, Any]
    drafter: DrafterConfig

    @property
    def spec(self) -> JobSpec:
        return JobSpec.load(self.job.spec)

    @property
    def verifier(self) -> str:
        """The verifier it was trained for, as resolved when its job was created."""
        return self.job.spec["verifier_info"]["reference"]

    def source(self) -> dict[str, Any]:
        return {"kind": "checkpoint", "checkpoint_id": self.checkpoint.id, "job_id": self.job.id}


def checkpoint_drafter(session: Session, project_id: str, checkpoint_id: str, *,
                       param: str) -> CheckpointDrafter:
    """The project's checkpoint ``checkpoint_id`` with its config read from disk; a 422 naming
    ``param`` when there is no such checkpoint, its files are gone or it is no drafter."""
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
    return CheckpointDrafter(checkpoint, job, config, read_drafter(config, param))


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
