"""Runs a claimed job through its pipeline: stages, events, supervision, and the final status."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from app.db import session_scope, with_retries
from app.logtail import tail
from app.runtimes import JobPaths, Plan, StageCommand
from app.schemas.job_spec import JobSpec
from app.services.scheduling import schedule
from app.services.state import TERMINAL, JobStatus, Stage, StaleJob, record_event, transition
from app.settings import Settings
from workers.lease import Heartbeat, Lease, LeaseLost
from workers.runtimes.local.preload import PRELOADER_ENV, forks, launcher_argv, preloader_argv
from workers.supervisor import Group, ManagedProcess, Process, exit_words

log = logging.getLogger(__name__)

HOST = socket.gethostname()
# Set when the worker itself is shutting down (Ctrl-C, SIGTERM): jobs are handed back.
SHUTTING_DOWN = threading.Event()


class StageFailed(Exception):
    def __init__(self, message: str, *, code: str = "stage_failed", log_tail: str = "") -> None:
        super().__init__(message)
        self.code, self.log_tail = code, log_tail


class ProcessFailed(StageFailed):
    """A process a stage ran exited with an error (not the job being stopped)."""


class Cancelled(Exception):
    pass


class ShuttingDown(Exception):
    pass


@dataclass(frozen=True)
class PipelineStage:
    stage: Stage
    run: Callable[["JobContext[JobSpec]"], None]
    when: Callable[[JobSpec], bool] = lambda spec: True  # does the job need it?


S = TypeVar("S")  # a job's spec (JobSpec), or a deployment's (its row's JSON)


@dataclass
class JobContext(Generic[S]):
    """What a stage gets: the job's spec and paths, and guarded ways to report and run. A
    deployment's worker runs its engine through one too."""

    lease: Lease
    spec: S
    settings: Settings
    heartbeat: Heartbeat
    paths: JobPaths = field(init=False)
    secrets: list[str] = field(default_factory=list)
    plan: Plan | None = None  # set once the verifier server's port is known
    verifier_server: ManagedProcess | None = None  # the hidden-states server, while it runs
    # The local runtime's processes (vLLM servers, prepare-data, the trainer) forked from one
    # import of their modules per job or deployment (preload.py): set on the local runtime.
    preload: bool = False
    # A deployment's processes write their output to its log themselves: they can outlive the
    # worker (workers/adoption.py); a job's pass it through the worker, which reads progress.
    outlives_worker: bool = False
    _preloader: tuple[Process, str] | None = None  # the process, its socket's path
    _preload_lock: threading.Lock = field(default_factory=threading.Lock)
    _watched: list[tuple[str, ManagedProcess, Path]] = field(default_factory=list)
    _stopped: list[Process] = field(default_factory=list)
    _cleanups: list[Callable[[], None]] = field(default_factory=list)
    _groups: list[Group] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.paths = JobPaths.for_job(self.settings, self.lease.job_id)

    @property
    def job_id(self) -> str:
        return self.lease.job_id

    def check(self) -> None:
        """Raise if the job must stop: lease lost, cancel requested, worker shutting down, or
        a process the job depends on (the verifier server) died."""
        for name, proc, log_path in self._watched:
            if proc.poll() is not None:
                raise StageFailed(f"{name} died (exit code {proc.poll()})",
                                  code=f"{name.replace(' ', '_')}_died", log_tail=tail(log_path))
        if self.heartbeat.lost.is_set():
            raise LeaseLost(self.job_id)
        if self.heartbeat.cancel_requested.is_set():
            raise Cancelled
        if SHUTTING_DOWN.is_set():
            raise ShuttingDown

    def should_stop(self) -> bool:
        return (self.heartbeat.lost.is_set() or self.heartbeat.cancel_requested.is_set()
                or SHUTTING_DOWN.is_set() or self.dependency_died())

    def dependency_died(self) -> bool:
        return any(p.poll() is not None for _, p, _ in self._watched)

    def watch(self, name: str, proc: ManagedProcess, log_path: Path) -> None:
        """The job cannot go on without ``proc``: its death stops and fails the current stage."""
        self._watched.append((name, proc, log_path))

    def unwatch(self, proc: ManagedProcess) -> None:
        self._watched = [w for w in self._watched if w[1] is not proc]

    def set_stage(self, stage: Stage) -> None:
        self.write(lambda session: transition(session, self.lease.load(session), JobStatus.RUNNING,
                                              stage=stage, token=self.lease.token))

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.write(lambda session: record_event(session, self.lease.load(session), kind, message,
                                                data))

    def write(self, fn: Callable[[Any], None], *, retry: bool = True) -> None:
        """Run ``fn(session)`` in one transaction while the lease is still ours. Through a
        database outage it is retried for ``database_retry_seconds`` (``retry=False``: the
        caller keeps what it could not write and tries again later)."""
        def unit() -> None:
            with session_scope() as session:
                self.lease.load(session)
                fn(session)

        if not retry:
            return unit()
        with_retries(unit, seconds=self.settings.database_retry_seconds, what=self.job_id)

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the attempt ends, whatever the outcome (stop servers)."""
        self._cleanups.append(fn)

    def close(self) -> None:
        self._watched.clear()
        for cleanup in reversed(self._cleanups):
            cleanup()
        self._cleanups.clear()

    def _track(self, pgid: int, add: bool) -> None:
        """Record the job's live process groups on its row (with what identifies each), so a
        worker that outlives this one can stop them (workers/reconciler.py)."""
        with self._lock:
            if add:
                self._groups.append(Group.of(pgid))
            else:
                self._groups = [g for g in self._groups if g.pgid != pgid]
            groups = [g.to_json() for g in self._groups]  # written under the lock: the latest wins
            self.write(lambda session: self.lease.update(session, pgids=groups, pgid_host=HOST))

    def start(self, command: StageCommand, on_line: Callable[[str], None] | None = None,
              log_path: Path | None = None) -> ManagedProcess:
        """Start a process in its own group; its pgid is recorded so orphans can be reaped."""
        argv, env = command.argv, command.env
        if self.preload and forks(argv) and (preloader := self._preloader_env(command)):
            argv, env = launcher_argv(argv), {**env, **preloader}
        self.event("process", f"starting: {command.description}",
                   {"argv": argv, "env": command.redacted_env(), "gpus": command.gpus})
        proc = ManagedProcess(argv, env=env, log_path=log_path or self.paths.log,
                              job_id=self.job_id, secrets=self.secrets, on_line=on_line,
                              description=command.description,
                              outlives_worker=self.outlives_worker)
        self._track(proc.pgid, add=True)
        return proc

    def _preloader_env(self, command: StageCommand) -> dict[str, str]:
        """Where the job's preloader listens, started with this first process's environment on
        the first call; nothing once it has died (the command then runs as it is)."""
        with self._preload_lock:
            if self._preloader is None:
                folder = tempfile.mkdtemp(prefix="specdeck-vllm-")  # 0700, and a short path
                self.on_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
                path = os.path.join(folder, "preloader.sock")
                preloader = self.start(StageCommand(
                    command.stage, "preloader (imports vLLM and speculators once for the job's "
                    "processes)",
                    preloader_argv(path), command.env))
                self.on_cleanup(lambda: self.stop(preloader))
                self._preloader = preloader, path
            preloader, path = self._preloader
        return {} if preloader.poll() is not None else {PRELOADER_ENV: path}

    def adopt(self, groups: list[Group], preloader: tuple[Process, str] | None) -> None:
        """Processes an earlier run of this worker started are this context's now (their groups
        stay recorded on the row; the preloader forks the next engine)."""
        with self._lock:
            self._groups = list(groups)
        self._preloader = preloader

    def finish(self, proc: Process) -> None:
        """Bookkeeping once ``proc`` has exited: forget its group, record how it ended."""
        try:
            self._track(proc.pgid, add=False)
            ended = exit_words(proc.poll(), proc.stopped, proc.grace)
            self.event("process", f"{proc.description} {ended} after {proc.seconds:.1f} s",
                       {"exit_code": proc.poll(), "ended": ended,
                        "seconds": round(proc.seconds, 3)})
        except LeaseLost:
            log.warning("job %s: lease lost; %s stopped without bookkeeping", self.job_id,
                        proc.description)

    def stop(self, proc: Process) -> None:
        """Stop a process started with ``start`` (SIGTERM to its group, the grace period, then
        SIGKILL) and record how it ended. It is unwatched first, so its exit is not taken for a
        crash. Stopping it again does nothing."""
        self.unwatch(proc)
        with self._lock:
            if any(p is proc for p in self._stopped):
                return
            self._stopped.append(proc)
        proc.stop(self.settings.cancel_grace_seconds)
        self.finish(proc)

    def run(self, command: StageCommand, on_line: Callable[[str], None] | None = None,
            *, log_tail: Callable[[], str] | None = None,
            grace: float | None = None) -> ManagedProcess:
        """Run to completion; stops the group on cancel, takeover or shutdown (SIGTERM, then
        ``grace`` seconds, default the cancel grace, then SIGKILL), then raises. A non-zero exit
        raises ProcessFailed with the end of the log (``log_tail``: of what the process printed
        itself, when the job's log holds other processes' lines too)."""
        proc = self.start(command, on_line)
        cancel_grace = self.settings.cancel_grace_seconds

        def grace_now() -> float:
            # A process whose verifier server died gets nothing done in a longer grace (a
            # trainer would wait on the dead server to finish its step): it stops at once.
            return cancel_grace if grace is None or self.dependency_died() else grace
        try:
            code = proc.wait(self.should_stop, grace=grace_now)
        finally:
            self.finish(proc)
        self.check()
        if code != 0:
            lines = log_tail() if log_tail is not None else tail(self.paths.log)
            kind, hint = classify_failure(code, lines)
            ended = f"exited with code {code}" if code > 0 else exit_words(code, proc.stopped)
            raise ProcessFailed(f"{command.description} {ended}{hint}", code=kind, log_tail=lines)
        return proc


# (error code, what to tell the user, the log patterns that identify it), most specific first.
FAILURES = [
    ("cuda_oom", "the GPU ran out of memory: lower total_seq_len or max_anchors, or add GPUs",
     ("CUDA out of memory", "torch.OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")),
    ("data_error", "the dataset could not be read or prepared",
     ("JSONDecodeError", "DatasetGenerationError", "No valid samples", "empty preprocessed dataset")),
    ("publish_failed", "publishing to the Hugging Face Hub failed (see the log)",
     ("publish failed:",)),
    ("bad_configuration", "the command line or configuration was rejected",
     ("ValidationError", "Invalid value for", "No such option", "error: argument", "Usage:")),
]


def classify_failure(code: int, log_tail: str) -> tuple[str, str]:
    if code == 137:
        return "host_oom_killed", " (killed: the host ran out of memory, or SIGKILL)"
    if code == -9:
        return "host_oom_killed", ""  # exit_words says it
    for kind, hint, patterns in FAILURES:
        if any(p in log_tail for p in patterns):
            return kind, f": {hint}"
    return "process_failed", ""


def load_pipeline(spec: str) -> list[PipelineStage]:
    module, _, attr = spec.partition(":")
    return list(getattr(importlib.import_module(module), attr))


def _finish(lease: Lease, settings: Settings, to: JobStatus, **kwargs: Any) -> None:
    def end() -> None:
        with session_scope() as session:
            job = lease.load(session)
            ending, details = to, kwargs
            if job.status == JobStatus.CANCELLING:  # a cancel request wins over any other ending
                ending, details = JobStatus.CANCELLED, {"reason": "cancelled by user"}
            transition(session, job, ending, token=lease.token, **details)

    def next_job() -> None:
        with session_scope() as session:
            schedule(session, settings)  # its GPUs are free: the oldest waiting job goes next

    with_retries(end, seconds=settings.database_retry_seconds, what=lease.job_id)
    with_retries(next_job, seconds=settings.database_retry_seconds, what=lease.job_id)


def run_job(lease: Lease, spec: JobSpec, settings: Settings) -> None:
    heartbeat = Heartbeat(lease, interval=settings.heartbeat_seconds,
                          lease_seconds=settings.lease_seconds)
    with heartbeat:
        stages = load_pipeline(settings.pipeline)
        ctx = JobContext(lease=lease, spec=spec, settings=settings, heartbeat=heartbeat,
                         preload=settings.vllm_preload and spec.runtime == "local")
        try:
            outcome = _run_stages(ctx, stages)
        finally:
            ctx.close()
        if outcome is None:
            log.warning("job %s: lease lost; another worker owns it now", lease.job_id)
            return
        to, kwargs = outcome
        if to in TERMINAL:
            remove_hidden_states(ctx.paths)
            remove_work_data(ctx.spec, ctx.paths)
        _finish(lease, settings, to, **kwargs)


def _run_stages(ctx: JobContext[JobSpec], stages: list[PipelineStage]
                ) -> tuple[JobStatus, dict[str, Any]] | None:
    """Run every stage; return the status the job ends in (None: the lease is no longer ours)."""
    try:
        for stage in stages:
            if not stage.when(ctx.spec):
                continue
            ctx.check()
            ctx.set_stage(stage.stage)
            stage.run(ctx)
        ctx.check()
        return JobStatus.SUCCEEDED, {"stage": None, "message": "all stages completed"}
    except Cancelled:
        return JobStatus.CANCELLED, {"reason": "cancelled by user"}
    except ShuttingDown:
        return JobStatus.QUEUED, {"reason": "worker shut down; waiting for a worker",
                                  "message": f"{ctx.lease.owner} shut down; job handed back"}
    except StageFailed as exc:
        return JobStatus.FAILED, {"reason": str(exc), "error_code": exc.code,
                                  "data": {"log_tail": exc.log_tail}}
    except (LeaseLost, StaleJob):
        return None
    except Exception as exc:
        log.exception("job %s failed", ctx.job_id)
        return JobStatus.FAILED, {"reason": f"internal error: {exc}", "error_code": "internal_error",
                                  "data": {"traceback": traceback.format_exc()}}


def remove_hidden_states(paths: JobPaths) -> None:
    """Hidden states are large and only needed while the job runs: remove them at the end."""
    for directory in (paths.hidden_states, paths.data / "hidden_states"):
        shutil.rmtree(directory, ignore_errors=True)


def remove_work_data(spec: JobSpec, paths: JobPaths) -> None:
    """A capture's decrypted rows (and their copy for prepare-data) are user data kept
    encrypted at rest: they leave the work dir when the job ends."""
    if spec.dataset_kind == "capture":
        for path in (paths.captured, paths.root / "conversations.jsonl"):
            path.unlink(missing_ok=True)
