"""Stage: preflight, then the hidden-states server on a free port, up and ready."""

from __future__ import annotations

from app.runtimes import build_plan
from app.schemas.job_spec import JobSpec
from workers.pipeline.preflight import preflight
from workers.readiness import free_port, wait_ready
from workers.runner import JobContext


def allocated_gpus(spec: JobSpec) -> tuple[list[int], list[int]] | None:
    """The (verifier, trainer) GPUs the scheduler allocated; None on the local runtime."""
    allocation = spec.allocation or {}
    if "verifier" not in allocation:
        return None
    return list(allocation["verifier"]), list(allocation.get("trainer", []))


def start_verifier(ctx: JobContext[JobSpec]) -> None:
    preflight(ctx)
    port = free_port()
    ctx.plan = build_plan(ctx.spec, ctx.paths, port=port, gpus=allocated_gpus(ctx.spec))
    command = ctx.plan.stage("starting_verifier")
    ctx.paths.hidden_states.mkdir(parents=True, exist_ok=True)
    log_path = ctx.paths.root / "verifier-server.log"
    proc = ctx.start(command, log_path=log_path)
    ctx.on_cleanup(lambda: ctx.stop(proc))  # the evaluating stage may have stopped it already
    ctx.verifier_server = proc
    served_name = ctx.spec.verifier_info.reference
    wait_ready(ctx, proc, f"http://127.0.0.1:{port}", served_name, what="verifier server",
               log_path=log_path, timeout=ctx.settings.verifier_ready_seconds)
    ctx.watch("verifier server", proc, log_path)
    ctx.event("verifier_ready", f"verifier server ready on port {port}",
              {"port": port, "layer_ids": ctx.plan.server_layer_ids})
