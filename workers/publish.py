"""Publishing a checkpoint to the Hugging Face Hub, as a supervised subprocess
(`python -m app.services.publishing`) that gets the token through its environment only.
Used by a job's publishing stage and by `POST /api/checkpoints/{id}/publish`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Job, utcnow
from app.runtimes import StageCommand
from app.schemas.job_spec import JobSpec
from app.services.publishing import checkpoint_card_fields, evaluation_card_rows, render_model_card
from app.services.secrets import HF_TOKEN, reveal
from app.services.webhooks import enqueue
from app.settings import Settings


class MissingToken(Exception):
    pass


def card(checkpoint: Checkpoint, job: Job, repo_id: str) -> str:
    fields = checkpoint_card_fields(checkpoint.path)
    spec = JobSpec.load(job.spec)
    fields["verifier"] = spec.verifier  # what the user named (a Hub id serves as is)
    dataset = {"dataset": spec.dataset, "format": spec.dataset_format, "mode": spec.mode}
    metrics = {**fields.pop("metrics"), **(checkpoint.metrics or {})}
    return render_model_card(repo_id=repo_id, dataset_summary=dataset, metrics=metrics,
                             evaluation=evaluation_card_rows(checkpoint.evaluation),
                             partial_epoch=checkpoint.epoch + 1 if checkpoint.partial else None,
                             **fields)


def publish_command(checkpoint: Checkpoint, repo_id: str, *, private: bool, token: str,
                    work_dir: Path, settings: Settings) -> StageCommand:
    argv = [sys.executable, "-m", "app.services.publishing", "--checkpoint", checkpoint.path,
            "--repo-id", repo_id, "--card-file", str(work_dir / "README.md"),
            "--result-file", str(work_dir / "publish-result.json")]
    if not private:
        argv.append("--public")
    if settings.hf_endpoint:
        argv += ["--endpoint", settings.hf_endpoint]
    return StageCommand("publishing", f"publish to the Hugging Face Hub ({repo_id})", argv,
                        {HF_TOKEN: token})


def prepare(session: Session, checkpoint: Checkpoint, repo_id: str, *, private: bool,
            work_dir: Path, settings: Settings) -> StageCommand:
    """Write the model card and return the command; the token comes from the project's
    HF_TOKEN secret."""
    job = session.get(Job, checkpoint.job_id)
    token = reveal(session, job.project_id, HF_TOKEN, settings)
    if not token:
        raise MissingToken("the project has no HF_TOKEN secret: PUT /api/secrets/HF_TOKEN first")
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "README.md").write_text(card(checkpoint, job, repo_id), encoding="utf-8")
    return publish_command(checkpoint, repo_id, private=private, token=token, work_dir=work_dir,
                           settings=settings)


def record(session: Session, checkpoint_id: str, work_dir: Path, repo_id: str) -> dict[str, Any]:
    """Mark the checkpoint published (the one place that does), and write the
    ``checkpoint.published`` webhook event in the same transaction."""
    result = json.loads((work_dir / "publish-result.json").read_text())
    checkpoint = session.get(Checkpoint, checkpoint_id)
    checkpoint.hub_repo, checkpoint.hub_commit = repo_id, result["commit_sha"]
    checkpoint.hub_url, checkpoint.published_at = result["repo_url"], utcnow()
    checkpoint.publish_status, checkpoint.publish_error = "published", None
    session.flush()
    enqueue(session, session.get(Job, checkpoint.job_id).project_id, "checkpoint.published",
            checkpoint)
    return result


def best_checkpoint(session: Session, job_id: str, candidate: int | None = None
                    ) -> Checkpoint | None:
    """The job's checkpoint (or its candidate's): the one its evaluation chose (the winner's;
    a candidate's highest served acceptance length among those served), else the trainer's
    best (lowest validation loss), else the latest; never a partial one (saved mid-epoch)."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.partial.is_(False))
    if candidate is None:
        job = session.get(Job, job_id)
        chosen = (job.evaluation or {}).get("checkpoint_id") if job is not None else None
        if chosen and (row := session.get(Checkpoint, chosen)) is not None:
            return row
    else:
        query = query.where(Checkpoint.candidate == candidate)
    rows = list(session.scalars(query.order_by(Checkpoint.is_best.desc(),
                                               Checkpoint.epoch.desc(), Checkpoint.candidate)))
    return next((c for c in rows if (c.evaluation or {}).get("selected")), rows[0] if rows else None)
