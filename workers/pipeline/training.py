"""Stage: the speculators trainer, its progress turned into metrics, checkpoints and events."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import UNAVAILABLE
from app.db.models import Checkpoint, JobMetric
from app.services.state import record_event
from workers.pipeline.trainer_output import (
    BestCheckpointUpdated,
    CheckpointSaved,
    EpochEvent,
    Metric,
    Record,
    TrainingInterrupted,
    TrainingResumed,
    parse_line,
)
from workers.runner import JobContext

log = logging.getLogger(__name__)


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
    row.path, row.partial = path, False  # the epoch's own checkpoint replaces a partial one
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


def record_partial(session: Session, job_id: str, epoch: int, path: str, worker_id: str) -> bool:
    """The checkpoint the trainer saved when it was stopped during ``epoch``, marked partial;
    nothing when that epoch's own checkpoint is there already (stopped before the next epoch's
    first step: the same weights). Whether it was recorded."""
    row = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id,
                                                   Checkpoint.epoch == epoch)).first()
    if row is not None and not row.partial:
        return False
    if row is None:
        row = Checkpoint(job_id=job_id, epoch=epoch, path=path, partial=True)
        session.add(row)
    row.path, row.worker_id = path, worker_id
    return True


class ProgressRecorder:
    """Feeds each trainer line through the parser and records what it means, one transaction
    per line. While the database is unreachable the records wait in a backlog (the trainer's
    output is never held up), retried every ``RETRY_SECONDS`` and drained, with retries, once
    the trainer has exited: an outage loses no metric, checkpoint row or event."""

    RETRY_SECONDS = 1.0

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.backlog: deque[list[Record]] = deque()
        self.held_back = 0  # records that waited out an outage
        self._next_try = 0.0
        self.last_step: int | None = None  # the trainer's global step, counted from 0
        self.last_epoch: int | None = None  # the epoch of the latest training step (from 0)

    def __call__(self, line: str) -> None:
        records = parse_line(line)
        if records:
            self.backlog.append(records)
        if self.backlog and time.monotonic() >= self._next_try:
            self._flush(retry=False)

    def drain(self) -> None:
        """Write what an outage held back, retrying while the database is still down."""
        self._flush(retry=True)
        if self.held_back:
            self.ctx.event("progress", f"{self.held_back} trainer records were held back by a "
                           "database outage and recorded after it", {"records": self.held_back})

    def _flush(self, *, retry: bool) -> None:
        while self.backlog:
            try:
                self.ctx.write(lambda session: self.apply(session, self.backlog[0]), retry=retry)
            except UNAVAILABLE:
                if retry:
                    raise
                log.warning("job %s: database unavailable; %d trainer records held back",
                            self.ctx.job_id, len(self.backlog))
                self.held_back = max(self.held_back, len(self.backlog))
                self._next_try = time.monotonic() + self.RETRY_SECONDS
                return
            self.backlog.popleft()

    def apply(self, session: Session, records: list[Record]) -> None:
        ctx, job_id, owner = self.ctx, self.ctx.job_id, self.ctx.lease.owner
        save_path = ctx.paths.checkpoints
        job = ctx.lease.load(session)

        def event(kind: str, message: str, data: dict | None = None) -> None:
            record_event(session, job, kind, message, data)

        metrics = [m for m in records if isinstance(m, Metric)]
        session.add_all(JobMetric(job_id=job_id, step=m.step, epoch=m.epoch, name=m.name,
                                  value=m.value) for m in metrics)
        self.last_step = max((m.step for m in metrics if m.step is not None),
                             default=self.last_step)
        self.last_epoch = max((m.epoch for m in metrics if m.step is not None
                               and m.epoch is not None), default=self.last_epoch)
        session.flush()  # the metrics first: a checkpoint row reads its epoch's val/ metrics
        for record in records:
            match record:
                case EpochEvent(phase="train", status=status, epoch=epoch, num_epochs=total):
                    # Epochs are numbered from 0, as the checkpoints are (directories, the API).
                    event("epoch", f"training epoch {epoch} ({epoch + 1} of {total}) {status}",
                          {"epoch": epoch, "status": status})
                    if (status == "completed" and job.steps_per_epoch is None
                            and self.last_step is not None):
                        # Global steps count from 0 over all epochs, resumed ones included.
                        job.steps_per_epoch = (self.last_step + 1) // (epoch + 1)
                case CheckpointSaved(path=path, label="interrupted"):
                    epoch = self.last_epoch
                    if epoch is not None and record_partial(session, job_id, epoch, path, owner):
                        event("checkpoint", f"partial checkpoint of epoch {epoch} saved when "
                              "the trainer was stopped", {"path": path, "epoch": epoch,
                                                          "partial": True})
                case CheckpointSaved(path=path) if record.epoch is not None:
                    upsert_checkpoint(session, job_id, record.epoch, path, owner)
                    event("checkpoint", f"checkpoint for epoch {record.epoch} saved",
                          {"path": path})
                case BestCheckpointUpdated(epoch=epoch, val_loss=loss):
                    upsert_checkpoint(session, job_id, epoch, str(save_path / str(epoch)), owner,
                                      best=True)
                    event("checkpoint", f"best checkpoint is now epoch {epoch} "
                          f"(val loss {loss:.4f})", {"epoch": epoch, "val_loss": loss})
                case TrainingResumed(epoch=epoch):
                    event("resumed", f"training resumed from the epoch {epoch - 1} checkpoint "
                          f"(continuing with epoch {epoch})", {"epoch": epoch})
                case TrainingInterrupted(signal=sig):
                    event("interrupted", f"trainer received {sig}; saving before it exits")


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
    recorder = ProgressRecorder(ctx)
    try:
        ctx.run(ctx.plan.stage("training"), on_line=recorder)
    finally:
        recorder.drain()  # also when training failed: its progress until then is shown
    sync_checkpoints(ctx)
