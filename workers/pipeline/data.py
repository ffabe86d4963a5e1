"""Stage: speculators prepare-data through the server's renderer (and offline generation)."""

from __future__ import annotations

import json
from pathlib import Path

from workers.runner import JobContext
from workers.runtimes import training_data


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


def prepare_data(ctx: JobContext) -> None:
    assert ctx.plan is not None, "the verifier stage sets the plan"
    data = training_data(ctx.spec, ctx.paths)
    if ctx.spec.get("dataset_format") == "messages" and not Path(data).is_file():
        as_conversations(Path(ctx.spec["dataset_path"]), Path(data))
    commands = [c for c in ctx.plan.stages if c.stage == "preparing_data"]
    if prepared(ctx):
        ctx.event("skipped", "prepared data already present; reusing it")
        commands = commands[1:]
    for command in commands:
        ctx.run(command)
