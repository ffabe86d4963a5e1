"""Stage: speculators prepare-data through the server's renderer (and offline generation)."""

from __future__ import annotations

import json
from pathlib import Path

from app.db import session_scope, with_retries
from app.runtimes import dataset_file, training_data
from app.services import capture
from app.services.secrets import cipher
from workers.runner import JobContext, StageFailed


def prepared(ctx: JobContext) -> bool:
    data = ctx.paths.data
    return (data / "token_freq.pt").is_file() and (data / "dataset_info.json").is_file()


def as_conversations(source: Path, target: Path) -> None:
    """Copy an OpenAI ``messages`` JSONL with each line's key renamed to ``conversations``
    (speculators reads ``{role, content}`` turns there); written atomically."""
    partial = target.with_suffix(".partial")
    with source.open("rb") as src, partial.open("w", encoding="utf-8") as out:
        for raw in src:
            if raw.strip():
                record = json.loads(raw)
                record["conversations"] = record.pop("messages")
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    partial.replace(target)


def write_captured(ctx: JobContext) -> None:
    """A capture dataset's rows, decrypted into the job's work dir as ``messages`` JSONL, once
    per job, by the first stage that reads the data (the rows captured by then); the file goes
    when the job ends (``workers.runner.remove_work_data``)."""
    target = ctx.paths.captured
    if ctx.spec.dataset_kind != "capture" or target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fernet = cipher(ctx.settings)

    def export() -> int:
        with session_scope() as session:
            return capture.export_jsonl(session, ctx.spec.dataset_id, target, fernet)

    rows = with_retries(export, seconds=ctx.settings.database_retry_seconds, what=ctx.job_id)
    if rows == 0:
        target.unlink(missing_ok=True)
        raise StageFailed(f"dataset {ctx.spec.dataset_id} holds no captured rows any more "
                          "(its retention purged them)", code="data_error")
    ctx.event("captured_data", f"wrote the {rows} captured rows of dataset "
              f"{ctx.spec.dataset_id} for this job", {"rows": rows})


def prepare_data(ctx: JobContext) -> None:
    assert ctx.plan is not None, "the verifier stage sets the plan"
    write_captured(ctx)
    data = training_data(ctx.spec, ctx.paths)
    if ctx.spec.dataset_format == "messages" and not Path(data).is_file():
        as_conversations(dataset_file(ctx.spec, ctx.paths), Path(data))
    commands = [c for c in ctx.plan.stages if c.stage == "preparing_data"]
    if prepared(ctx):
        ctx.event("skipped", "prepared data already present; reusing it")
        commands = commands[1:]
    for command in commands:
        ctx.run(command)
