"""Test-only pipeline: one stage that runs a real long-running Python child under the
supervisor. The job's metadata says how long it runs (``test_seconds``, or until the file
``test_until`` exists, ``test_seconds`` then being the cap) and how it exits (``test_exit_code``:
non-zero fails the job)."""

from __future__ import annotations

import sys

from app.runtimes import StageCommand
from app.services.state import Stage
from workers.runner import JobContext, PipelineStage


def run_child(ctx: JobContext) -> None:
    meta = ctx.spec.metadata
    ctx.event("test_allocation", "what the worker was given", {"allocation": ctx.spec.allocation})
    argv = [sys.executable, "-m", "tests.support.child", "--seconds", meta.get("test_seconds", "1")]
    if meta.get("test_pid_dir"):
        argv += ["--pid-file", f"{meta['test_pid_dir']}/{ctx.job_id}-{ctx.lease.attempt}.pid"]
    if meta.get("test_until"):
        argv += ["--until", meta["test_until"]]
    if meta.get("test_ignore_sigterm"):
        argv.append("--ignore-sigterm")
    if meta.get("test_exit_code"):
        argv += ["--exit-code", meta["test_exit_code"]]
    ctx.run(StageCommand(Stage.TRAINING.value, "test child", argv))


PIPELINE = [PipelineStage(Stage.TRAINING, run_child)]
