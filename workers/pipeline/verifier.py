"""Stage: preflight, then the hidden-states server on a free port, up and ready."""

from __future__ import annotations

import socket
import time

import httpx

from workers.pipeline.preflight import preflight
from workers.runner import JobContext, StageFailed
from workers.runtimes import build_plan
from workers.supervisor import ManagedProcess, tail


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(ctx: JobContext, proc: ManagedProcess, base_url: str, served_name: str) -> None:
    """Ready when /health answers 200 and /v1/models lists the served name."""
    log_path = ctx.paths.root / "verifier-server.log"
    deadline = time.monotonic() + ctx.settings.verifier_ready_seconds
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            ctx.check()
            if proc.poll() is not None:
                raise StageFailed(f"the verifier server exited with code {proc.poll()} while "
                                  "starting", code="verifier_failed", log_tail=tail(log_path))
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    models = client.get(f"{base_url}/v1/models").json()
                    if any(m.get("id") == served_name for m in models.get("data", [])):
                        return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.5)
    raise StageFailed(f"the verifier server was not ready after "
                      f"{ctx.settings.verifier_ready_seconds:.0f} s", code="verifier_failed",
                      log_tail=tail(log_path))


def start_verifier(ctx: JobContext) -> None:
    preflight(ctx)
    port = free_port()
    ctx.plan = build_plan(ctx.spec, ctx.paths, port=port)
    command = ctx.plan.stage("starting_verifier")
    ctx.paths.hidden_states.mkdir(parents=True, exist_ok=True)
    log_path = ctx.paths.root / "verifier-server.log"
    proc = ctx.start(command, log_path=log_path)

    def stop_server() -> None:
        proc.stop(ctx.settings.cancel_grace_seconds)
        ctx.finish(proc)

    ctx.on_cleanup(stop_server)
    served_name = ctx.spec["verifier_info"]["reference"]
    wait_ready(ctx, proc, f"http://127.0.0.1:{port}", served_name)
    ctx.watch("verifier server", proc, log_path)
    ctx.event("verifier_ready", f"verifier server ready on port {port}",
              {"port": port, "layer_ids": ctx.plan.server_layer_ids})
