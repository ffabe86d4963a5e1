"""Stage: the speculators trainer, its progress turned into metrics, checkpoints and events."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, JobMetric
from workers.pipeline.trainer_output import (
    BestCheckpointUpdated,
    CheckpointSaved,
    EpochEvent,
    Metric,
    TrainingInterrupted,
    TrainingResumed,
    parse_line,
)
from workers.runner import JobContext


def saved_epochs(save_path: Path) -> list[int]:
    return sorted(int(p.name) for p in save_path.glob("[0-9]*")
                  if p.name.isdigit() and (p / "config.json").is_file())


def latest_epoch(save_path: Path) -> int | None:
    epochs = saved_epochs(save_path)
    return epochs[-1] if epochs else None


def upsert_checkpoint(session: Session, job_id: str, epoch: int, path: str, worker_id: str,
                      best: bool | None = None) -> None:
    row = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id,
                                                   Checkpoint.epoch == epoch)).first()
    if row is None:
        row = Checkpoint(job_id=job_id, epoch=epoch, path=path)
        session.add(row)
    row.worker_id = worker_id
    metrics_file = Path(path) / "val_metrics.json"
    if metrics_file.is_file():
        row.metrics = json.loads(metrics_file.read_text())
    else:  # the trainer writes val_metrics.json only into a checkpoint that became the best
        logged = session.execute(select(JobMetric.name, JobMetric.value).where(
            JobMetric.job_id == job_id, JobMetric.epoch == epoch, JobMetric.name.like("val/%")))
        row.metrics = {name.removeprefix("val/"): value for name, value in logged} or None
    if best:
        session.execute(update(Checkpoint).where(Checkpoint.job_id == job_id).values(is_best=False))
        row.is_best = True


class ProgressRecorder:
    """Feeds each trainer line through the parser and records what it means."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def __call__(self, line: str) -> None:
        records = parse_line(line)
        metrics = [r for r in records if isinstance(r, Metric)]
        if metrics:
            self.ctx.write(lambda s: s.add_all(
                JobMetric(job_id=self.ctx.job_id, step=m.step, epoch=m.epoch, name=m.name,
                          value=m.value) for m in metrics))
        for record in records:
            self.record(record)

    def record(self, record: object) -> None:
        ctx, job_id, owner = self.ctx, self.ctx.job_id, self.ctx.lease.owner
        save_path = ctx.paths.checkpoints
        match record:
            case EpochEvent(phase="train", status=status, epoch=epoch, num_epochs=total):
                # Epochs are numbered from 0, as the checkpoints are (their directories, the API).
                ctx.event("epoch", f"training epoch {epoch} ({epoch + 1} of {total}) {status}",
                          {"epoch": epoch, "status": status})
            case CheckpointSaved(path=path) if record.epoch is not None:
                ctx.write(lambda s: upsert_checkpoint(s, job_id, record.epoch, path, owner))
                ctx.event("checkpoint", f"checkpoint for epoch {record.epoch} saved", {"path": path})
            case BestCheckpointUpdated(epoch=epoch, val_loss=loss):
                path = str(save_path / str(epoch))
                ctx.write(lambda s: upsert_checkpoint(s, job_id, epoch, path, owner, best=True))
                ctx.event("checkpoint", f"best checkpoint is now epoch {epoch} "
                          f"(val loss {loss:.4f})", {"epoch": epoch, "val_loss": loss})
            case TrainingResumed(epoch=epoch):
                ctx.event("resumed", f"training resumed from the epoch {epoch - 1} checkpoint "
                          f"(continuing with epoch {epoch})", {"epoch": epoch})
            case TrainingInterrupted(signal=sig):
                ctx.event("interrupted", f"trainer received {sig}; saving before it exits")


def sync_checkpoints(ctx: JobContext) -> None:
    """Record every epoch checkpoint in the save path, with its validation metrics, and the one
    ``checkpoint_best`` points to. The trainer writes val_metrics.json after it logs the save,
    so the rows made from the log lines are completed here."""
    save_path = ctx.paths.checkpoints
    best_link = save_path / "checkpoint_best"
    best = int(best_link.resolve().name) if best_link.is_symlink() else None
    epochs = saved_epochs(save_path)

    def write(session: Session) -> None:
        for epoch in epochs:
            upsert_checkpoint(session, ctx.job_id, epoch, str(save_path / str(epoch)),
                              ctx.lease.owner, best=epoch == best)

    ctx.write(write)


def train(ctx: JobContext) -> None:
    assert ctx.plan is not None, "the verifier stage sets the plan"
    epochs = ctx.spec["speculator"]["epochs"]
    done = latest_epoch(ctx.paths.checkpoints)
    if done is not None and done >= epochs - 1:
        ctx.event("skipped", f"all {epochs} epochs already trained; reusing the checkpoints")
        sync_checkpoints(ctx)
        return
    if done is not None:
        ctx.event("resuming", f"found the epoch {done} checkpoint; the trainer resumes after it",
                  {"epoch": done})
    ctx.run(ctx.plan.stage("training"), on_line=ProgressRecorder(ctx))
    sync_checkpoints(ctx)
