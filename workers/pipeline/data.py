"""Stage: speculators prepare-data through the server's renderer (and offline generation)."""

from __future__ import annotations

from workers.runner import JobContext


def prepared(ctx: JobContext) -> bool:
    data = ctx.paths.data
    return (data / "token_freq.pt").is_file() and (data / "dataset_info.json").is_file()


def prepare_data(ctx: JobContext) -> None:
    assert ctx.plan is not None, "the verifier stage sets the plan"
    commands = [c for c in ctx.plan.stages if c.stage == "preparing_data"]
    if prepared(ctx):
        ctx.event("skipped", "prepared data already present; reusing it")
        commands = commands[1:]
    for command in commands:
        ctx.run(command)
