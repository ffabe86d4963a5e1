"""Stage: the speculators trainer for each of the job's drafters (one, or a bake-off's
candidates), its progress turned into metrics, checkpoints and events.

Candidates train one after another (on GPU hosts, side by side on GPUs of their own when the job
asks for it: ``resources.candidates_in_parallel``), against the one hidden-states server. A
candidate whose trainer fails is marked failed with its reason and its last lines, and the others
go on; the stage fails only when none is trained. A candidate already trained (by an earlier
attempt of the job) is not trained again, and one stopped half-way resumes from its last epoch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import UNAVAILABLE
from app.db.models import Checkpoint, JobCandidate, JobMetric
from app.schemas.job_spec import Candidate, JobSpec
from app.services.state import CandidateStatus, move_candidate, record_event
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
from workers.runner import JobContext, ProcessFailed, StageFailed
from workers.runtimes.cpu_time import CPU_SECONDS_LINE

log = logging.getLogger(__name__)
TAIL_LINES = 40  # a failed candidate's last trainer lines


def saved_epochs(save_path: Path) -> list[int]:
    return sorted(int(p.name) for p in save_path.glob("[0-9]*")
                  if p.name.isdigit() and (p / "config.json").is_file())


def latest_epoch(save_path: Path) -> int | None:
    epochs = saved_epochs(save_path)
    return epochs[-1] if epochs else None


def _checkpoint(session: Session, job_id: str, candidate: int, epoch: int) -> Checkpoint | None:
    return session.scalars(select(Checkpoint).where(
        Checkpoint.job_id == job_id, Checkpoint.candidate == candidate,
        Checkpoint.epoch == epoch)).first()


def upsert_checkpoint(session: Session, job_id: str, epoch: int, path: str, worker_id: str,
                      best: bool | None = None, *, candidate: int = 0, kind: str = "dflash") -> None:
    row = _checkpoint(session, job_id, candidate, epoch)
    if row is None:
        row = Checkpoint(job_id=job_id, candidate=candidate, kind=kind, epoch=epoch, path=path)
        session.add(row)
    row.path, row.partial = path, False  # the epoch's own checkpoint replaces a partial one
    row.worker_id = worker_id
    metrics_file = Path(path) / "val_metrics.json"
    if metrics_file.is_file():
        row.metrics = json.loads(metrics_file.read_text())
    else:  # the trainer writes val_metrics.json only into a checkpoint that became the best
        logged = session.execute(select(JobMetric.name, JobMetric.value).where(
            JobMetric.job_id == job_id, JobMetric.candidate == candidate,
            JobMetric.epoch == epoch, JobMetric.name.like("val/%")))
        row.metrics = {name.removeprefix("val/"): value for name, value in logged} or None
    if best:
        session.execute(update(Checkpoint).where(Checkpoint.job_id == job_id,
                                                 Checkpoint.candidate == candidate)
                        .values(is_best=False))
        row.is_best = True


def record_partial(session: Session, job_id: str, epoch: int, path: str, worker_id: str, *,
                   candidate: int = 0, kind: str = "dflash") -> bool:
    """The checkpoint the trainer saved when it was stopped during ``epoch``, marked partial;
    nothing when that epoch's own checkpoint is there already (stopped before the next epoch's
    first step: the same weights). Whether it was recorded."""
    row = _checkpoint(session, job_id, candidate, epoch)
    if row is not None and not row.partial:
        return False
    if row is None:
        row = Checkpoint(job_id=job_id, candidate=candidate, kind=kind, epoch=epoch, path=path,
                         partial=True)
        session.add(row)
    row.path, row.worker_id = path, worker_id
    return True


def candidate_row(session: Session, job_id: str, candidate: Candidate) -> JobCandidate:
    """The candidate's row (made here for a job created before candidates had rows)."""
    row = session.scalars(select(JobCandidate).where(JobCandidate.job_id == job_id,
                                                     JobCandidate.idx == candidate.index)).first()
    if row is None:
        row = JobCandidate(job_id=job_id, idx=candidate.index, name=candidate.name,
                           kind=candidate.kind, status=CandidateStatus.PENDING.value)
        session.add(row)
        session.flush()
    return row


class ProgressRecorder:
    """Feeds each line of one candidate's trainer through the parser and records what it
    means, one transaction per line. While the database is unreachable the records wait in a
    backlog (the trainer's output is never held up), retried every ``RETRY_SECONDS`` and
    drained, with retries, once the trainer has exited: an outage loses no metric, checkpoint
    row or event. It keeps the trainer's last lines (a failure's tail) and the CPU seconds its
    processes report as they exit."""

    RETRY_SECONDS = 1.0

    def __init__(self, ctx: JobContext[JobSpec], candidate: Candidate) -> None:
        self.ctx, self.candidate = ctx, candidate
        self.save_path = ctx.paths.checkpoints_of(ctx.spec, candidate)
        # Events of a bake-off name the candidate they are about.
        self.prefix = f"{candidate.name}: " if ctx.spec.is_bakeoff else ""
        self.backlog: deque[list[Record]] = deque()
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.cpu_seconds: float | None = None
        self.held_back = 0  # records that waited out an outage
        self._next_try = 0.0
        self.last_step: int | None = None  # the trainer's global step, counted from 0
        self.last_epoch: int | None = None  # the epoch of the latest training step (from 0)
        self.saved: set[int] = set()  # epochs whose checkpoint (an end's or a partial) it saved

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if match := CPU_SECONDS_LINE.search(line):
            self.cpu_seconds = (self.cpu_seconds or 0.0) + float(match.group(1))
        records = parse_line(line)
        if records:
            self.backlog.append(records)
        if self.backlog and time.monotonic() >= self._next_try:
            self._flush(retry=False)

    def tail(self) -> str:
        return "\n".join(self.lines)

    def drain(self) -> None:
        """Write what an outage held back, retrying while the database is still down."""
        self._flush(retry=True)
        if self.held_back:
            self.ctx.event("progress", f"{self.prefix}{self.held_back} trainer records were held "
                           "back by a database outage and recorded after it",
                           {"records": self.held_back})

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
        index, kind = self.candidate.index, self.candidate.kind
        job = ctx.lease.load(session)

        def event(what: str, message: str, data: dict | None = None) -> None:
            extra = {"candidate": self.candidate.name} if ctx.spec.is_bakeoff else {}
            record_event(session, job, what, self.prefix + message, {**(data or {}), **extra})

        metrics = [m for m in records if isinstance(m, Metric)]
        session.add_all(JobMetric(job_id=job_id, candidate=index, step=m.step, epoch=m.epoch,
                                  name=m.name, value=m.value) for m in metrics)
        self.last_step = max((m.step for m in metrics if m.step is not None),
                             default=self.last_step)
        self.last_epoch = max((m.epoch for m in metrics if m.step is not None
                               and m.epoch is not None), default=self.last_epoch)
        session.flush()  # the metrics first: a checkpoint row reads its epoch's val/ metrics
        for record in records:
            match record:
                case EpochEvent(phase="train", status=status, epoch=epoch, num_epochs=total):
                    # Events count epochs from 1, as people do; the data keeps the trainer's
                    # count from 0, as the checkpoints' directories and the API's fields do.
                    event("epoch", f"training epoch {epoch + 1} of {total} {status}",
                          {"epoch": epoch, "status": status})
                    if status == "completed" and self.last_step is not None:
                        row = candidate_row(session, job_id, self.candidate)
                        if row.steps_per_epoch is None:
                            # Global steps count from 0 over all epochs, resumed ones included.
                            row.steps_per_epoch = (self.last_step + 1) // (epoch + 1)
                case CheckpointSaved(path=path, label="interrupted"):
                    epoch = self.last_epoch
                    if epoch is not None:
                        self.saved.add(epoch)
                    if epoch is not None and record_partial(session, job_id, epoch, path, owner,
                                                            candidate=index, kind=kind):
                        event("checkpoint", f"partial checkpoint of epoch {epoch + 1} saved when "
                              "the trainer was stopped", {"path": path, "epoch": epoch,
                                                          "partial": True})
                case CheckpointSaved(path=path) if record.epoch is not None:
                    self.saved.add(record.epoch)
                    upsert_checkpoint(session, job_id, record.epoch, path, owner,
                                      candidate=index, kind=kind)
                    event("checkpoint", f"checkpoint for epoch {record.epoch + 1} saved",
                          {"path": path})
                case BestCheckpointUpdated(epoch=epoch, val_loss=loss):
                    upsert_checkpoint(session, job_id, epoch, str(self.save_path / str(epoch)),
                                      owner, best=True, candidate=index, kind=kind)
                    event("checkpoint", f"best checkpoint is now epoch {epoch + 1} "
                          f"(val loss {loss:.4f})", {"epoch": epoch, "val_loss": loss})
                case TrainingResumed(epoch=epoch):
                    event("resumed", f"training resumed from the epoch {epoch} checkpoint "
                          f"(continuing with epoch {epoch + 1})", {"epoch": epoch})
                case TrainingInterrupted(signal=sig):
                    event("interrupted", f"trainer received {sig}; saving before it exits")


def sync_checkpoints(ctx: JobContext[JobSpec], candidate: Candidate) -> None:
    """Record every epoch checkpoint in the candidate's save path, with its validation metrics,
    and the one ``checkpoint_best`` points to. The trainer writes val_metrics.json after it logs
    the save, so the rows made from the log lines are completed here."""
    save_path = ctx.paths.checkpoints_of(ctx.spec, candidate)
    best_link = save_path / "checkpoint_best"
    best = int(best_link.resolve().name) if best_link.is_symlink() else None
    epochs = saved_epochs(save_path)

    def write(session: Session) -> None:
        for epoch in epochs:
            upsert_checkpoint(session, ctx.job_id, epoch, str(save_path / str(epoch)),
                              ctx.lease.owner, best=epoch == best, candidate=candidate.index,
                              kind=candidate.kind)

    ctx.write(write)


def move(ctx: JobContext[JobSpec], candidate: Candidate, to: CandidateStatus, message: str,
         **kwargs: object) -> None:
    def write(session: Session) -> None:
        row = candidate_row(session, ctx.job_id, candidate)
        move_candidate(session, ctx.lease.load(session), row, to, message, **kwargs)  # type: ignore[arg-type]

    ctx.write(write)


def statuses(ctx: JobContext[JobSpec]) -> dict[int, CandidateStatus]:
    result: dict[int, CandidateStatus] = {}

    def read(session: Session) -> None:
        for candidate in ctx.spec.candidates:
            result[candidate.index] = CandidateStatus(candidate_row(session, ctx.job_id,
                                                                    candidate).status)

    ctx.write(read)
    return result


def train_candidate(ctx: JobContext[JobSpec], candidate: Candidate) -> ProcessFailed | None:
    """Train one candidate; its trainer's failure is returned (the candidate is marked failed),
    anything that stops the job is raised."""
    assert ctx.plan is not None, "the verifier stage sets the plan"
    spec, what = ctx.spec, candidate.name if ctx.spec.is_bakeoff else f"the {candidate.kind} drafter"
    save_path = ctx.paths.checkpoints_of(spec, candidate)
    epochs = candidate.drafter.epochs
    done = latest_epoch(save_path)
    if done is not None and done >= epochs - 1:
        ctx.event("skipped", f"{what}: all {epochs} epochs already trained; reusing the "
                  "checkpoints")
        sync_checkpoints(ctx, candidate)
        move(ctx, candidate, CandidateStatus.TRAINED, f"{what} trained (its checkpoints were "
             "already saved)")
        return None
    prefix = f"{candidate.name}: " if spec.is_bakeoff else ""
    if done is not None:
        ctx.event("resuming", f"{prefix}found the epoch {done + 1} checkpoint; the trainer resumes "
                  "after it", {"epoch": done})
    move(ctx, candidate, CandidateStatus.TRAINING, f"training {what} "
         f"({candidate.index + 1} of {len(spec.candidates)})" if spec.is_bakeoff
         else f"training {what}")
    recorder = ProgressRecorder(ctx, candidate)
    command = ctx.plan.training(candidate)
    try:
        # Stopped (a cancel, the worker's shutdown), it saves the epoch so far before it exits.
        proc = ctx.run(command, on_line=recorder, log_tail=recorder.tail,
                       grace=ctx.settings.trainer_stop_grace_seconds)
    except ProcessFailed as failure:
        recorder.drain()  # its progress until then is shown
        sync_checkpoints(ctx, candidate)
        move(ctx, candidate, CandidateStatus.FAILED, f"{what} failed: {failure}",
             reason=str(failure), error_code=failure.code,
             columns={"log_tail": failure.log_tail})
        return failure
    except BaseException:
        recorder.drain()
        say_if_nothing_was_saved(ctx, recorder)
        raise
    recorder.drain()
    sync_checkpoints(ctx, candidate)
    gpus = len(command.gpus)
    move(ctx, candidate, CandidateStatus.TRAINED, f"{what} trained in {proc.seconds:.0f} s",
         columns={"train_seconds": round(proc.seconds, 3),
                  "train_cpu_seconds": round(recorder.cpu_seconds, 3)
                  if recorder.cpu_seconds is not None else None,
                  "train_gpu_seconds": round(proc.seconds * gpus, 3) if gpus else None})
    return None


def say_if_nothing_was_saved(ctx: JobContext[JobSpec], recorder: ProgressRecorder) -> None:
    """A trainer stopped mid-epoch that saved nothing of it (killed before it could: a grace too
    short) loses that epoch's progress: the job's events say so, rather than let its "saving
    before it exits" stand as a promise. (Epochs are counted from 1 here, as people do.)"""
    epoch = recorder.last_epoch
    if epoch is None or epoch in recorder.saved:
        return
    kept = latest_epoch(recorder.save_path)
    since = (f"the epoch {kept + 1} checkpoint is the latest kept" if kept is not None
             else "no checkpoint is kept")
    try:
        ctx.event("checkpoint", f"{recorder.prefix}the trainer was stopped during epoch "
                  f"{epoch + 1} and saved nothing of it (it was given "
                  f"{ctx.settings.trainer_stop_grace_seconds:g} s: "
                  f"SPECDECK_TRAINER_STOP_GRACE_SECONDS); {since}",
                  {"epoch": epoch, "saved": False, "latest_kept": kept})
    except Exception:  # the lease may be gone already: nothing to tell the job then
        log.warning("job %s: could not record that nothing was saved", ctx.job_id)


def train(ctx: JobContext[JobSpec]) -> None:
    spec = ctx.spec
    status = statuses(ctx)
    todo = []
    for candidate in spec.candidates:
        if status[candidate.index] in (CandidateStatus.PENDING, CandidateStatus.TRAINING):
            todo.append(candidate)
        elif spec.is_bakeoff:
            ctx.event("skipped", f"{candidate.name} is {status[candidate.index].value} already: "
                      "not trained again", {"candidate": candidate.name})
    if spec.runtime == "vllm" and spec.resources.candidates_in_parallel and len(todo) > 1:
        failures = side_by_side(ctx, todo)
    else:
        failures = [failure for candidate in todo
                    if (failure := train_candidate(ctx, candidate)) is not None]
    trained = [c for c, s in statuses(ctx).items()
               if s in (CandidateStatus.TRAINED, CandidateStatus.EVALUATED)]
    if not trained:
        if len(spec.candidates) == 1 and failures:
            raise failures[0]  # a job of one drafter fails as its trainer did
        raise StageFailed(f"no candidate was trained: {'; '.join(map(str, failures)) or 'none left'}",
                          code="all_candidates_failed",
                          log_tail=failures[-1].log_tail if failures else "")


def side_by_side(ctx: JobContext[JobSpec], candidates: list[Candidate]) -> list[ProcessFailed]:
    """The candidates' trainers at once, each on its own GPUs; what stops the job (a cancel, a
    lost lease) stops them all and is raised."""
    failures: list[ProcessFailed] = []
    errors: list[BaseException] = []

    def one(candidate: Candidate) -> None:
        try:
            if (failure := train_candidate(ctx, candidate)) is not None:
                failures.append(failure)
        except BaseException as exc:  # re-raised below, once every trainer has stopped
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(c,), name=f"train-{c.name}") for c in candidates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return failures
