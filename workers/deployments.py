"""Runs a deployment on its worker: the serving engine (vLLM with a DFlash speculative config,
on the allocated GPUs or, on the local runtime, vLLM's CPU wheel), health-checked, restarted with backoff when it
crashes, stopped when the deployment is deleted, handed back when the worker shuts down."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from typing import Any

import httpx

from app.db import session_scope
from app.runtimes.local import vllm_missing
from app.services import replicas
from app.services.promotions import end_unfinished
from app.services.scheduling import schedule
from app.services.state import DeploymentStatus, StaleJob, transition
from app.settings import Settings
from workers.lease import Heartbeat, Lease, LeaseLost
from workers.adoption import Found, take_over
from workers.promotion import (
    Engine,
    engine_headers,
    pending_promotion,
    start_engine,
    switch_drafter,
    upstream_url,
    wait_engine,
)
from workers.live_metrics import LiveMetrics
from workers.runner import Cancelled, JobContext, ShuttingDown, StageFailed
from workers.supervisor import Process, exit_words

log = logging.getLogger(__name__)
UNHEALTHY_CHECKS = 3  # consecutive failed health checks that count as a crash


class GaveUp(Exception):
    pass


@dataclass(frozen=True)
class Switch:
    """What ``monitor`` returns when a promotion waits for this deployment."""

    promotion_id: str


def _move(lease: Lease, to: DeploymentStatus, **kwargs: Any) -> None:
    with session_scope() as session:
        transition(session, lease.load(session), to, token=lease.token, **kwargs)


def monitor(ctx: JobContext, proc: Process, base_url: str, headers: dict[str, str]
            ) -> str | Switch:
    """Health-check until the engine crashes (returns why), a promotion asks for another
    drafter (returns it), or the deployment must stop (raises); a healthy round also scrapes
    the live acceptance when it is due (workers/live_metrics.py)."""
    failures = 0
    live = LiveMetrics(ctx.spec.get("series", ctx.lease.job_id), ctx.spec.get("replica", 0),
                       ctx.spec, base_url, ctx.settings)
    with httpx.Client(timeout=5, headers=headers) as client:
        while True:
            ctx.check()
            if (code := proc.poll()) is not None:
                return f"the engine {exit_words(code, None)}"
            try:
                healthy = client.get(f"{base_url}/health").status_code == 200
            except httpx.TransportError:
                healthy = False
            failures = 0 if healthy else failures + 1
            if healthy:
                live.tick(client)
            if failures >= UNHEALTHY_CHECKS:
                return f"{UNHEALTHY_CHECKS} health checks failed in a row"
            if healthy and (promotion_id := pending_promotion(ctx)) is not None:
                return Switch(promotion_id)
            ctx.heartbeat.cancel_requested.wait(ctx.settings.health_check_seconds)


def serve_once(ctx: JobContext, name: str, api_key: str, adopted: Engine | None = None) -> str:
    """Start the engine, wait until it is ready, mark the deployment ready (an ``adopted``
    engine is ready already), watch it, switch its drafter when a promotion asks
    (workers/promotion.py). Returns why it went down."""
    engine = adopted or start_engine(ctx, ctx.spec, name, api_key,
                                     (ctx.spec.get("allocation") or {}).get("verifier"))
    try:
        if adopted is None:
            try:
                wait_engine(ctx, engine, name, api_key)
            except StageFailed as exc:
                return str(exc)
            _move(ctx.lease, DeploymentStatus.READY, message=f"ready on port {engine.port}",
                  columns={"upstream_url": upstream_url(ctx, engine)})
        while True:
            outcome = monitor(ctx, engine.proc, engine.base_url, engine_headers(api_key))
            if isinstance(outcome, str):
                return outcome
            engine = switch_drafter(ctx, engine, outcome.promotion_id, name, api_key)
    finally:
        ctx.stop(engine.proc)


def serve(ctx: JobContext, name: str, api_key: str, restarts: int,
          adopted: Engine | None = None) -> None:
    """Serve until stopped (first through an ``adopted`` engine, if given); after each crash,
    restart after 2^n seconds (at most 60), up to ``deployment_max_restarts`` times, then give
    up."""
    if ctx.spec.get("runtime") == "local" and (missing := vllm_missing()):
        raise GaveUp(missing)
    while True:
        why = serve_once(ctx, name, api_key, adopted)
        adopted = None
        restarts += 1
        if restarts > ctx.settings.deployment_max_restarts:
            raise GaveUp(f"{why}; gave up after {restarts - 1} restarts")
        backoff = min(60.0, 2.0 ** restarts)
        _move(ctx.lease, DeploymentStatus.STARTING, reason=f"{why}; restart {restarts} in {backoff:.0f} s",
              columns={"restarts": restarts, "upstream_url": None})
        deadline = time.monotonic() + backoff
        while time.monotonic() < deadline:
            ctx.check()
            ctx.heartbeat.cancel_requested.wait(min(0.5, max(0.0, deadline - time.monotonic())))


def run_deployment(lease: Lease, deployment: dict[str, Any], settings: Settings, api_key: str,
                   adopted: Found | None = None) -> None:
    heartbeat = Heartbeat(lease, interval=settings.heartbeat_seconds,
                          lease_seconds=settings.lease_seconds)
    with heartbeat:
        # On the local runtime the engine is forked from a preloader that imported vLLM once
        # for the deployment (runner.py): its restarts and promotions skip vLLM's imports.
        spec = deployment["spec"]
        ctx = JobContext(lease=lease, spec=spec, settings=settings, heartbeat=heartbeat,
                         secrets=[api_key], outlives_worker=True,
                         preload=settings.vllm_preload and spec.get("runtime") == "local")
        ending: tuple[DeploymentStatus, dict[str, Any]] | None
        try:
            engine = take_over(ctx, adopted) if adopted is not None else None
            serve(ctx, deployment["name"], api_key, deployment["restarts"], engine)
            ending = None  # serve() only returns by raising
        except Cancelled:
            ending = DeploymentStatus.STOPPED, {"reason": "deleted by user", "columns": {"upstream_url": None}}
        except ShuttingDown:
            ending = DeploymentStatus.PENDING, {"reason": "worker shut down; waiting for a worker",
                                                "columns": {"upstream_url": None}}
        except GaveUp as exc:
            ending = DeploymentStatus.FAILED, {"reason": str(exc), "columns": {"upstream_url": None}}
        except (LeaseLost, StaleJob):
            ending = None
        except Exception as exc:
            log.exception("deployment %s failed", lease.job_id)
            ending = DeploymentStatus.FAILED, {"reason": f"internal error: {exc}",
                                               "data": {"traceback": traceback.format_exc()},
                                               "columns": {"upstream_url": None}}
        finally:
            ctx.close()
        if ending is None:
            log.warning("deployment %s: lease lost; another worker owns it now", lease.job_id)
            return
        to, kwargs = ending
        with session_scope() as session:
            row = lease.load(session)
            if row.status == DeploymentStatus.STOPPING:  # a delete wins over any other ending
                to, kwargs = DeploymentStatus.STOPPED, {"reason": "deleted by user",
                                                        "columns": {"upstream_url": None}}
            end_unfinished(session, row, f"the deployment is {to.value}")
            transition(session, row, to, token=lease.token, **kwargs)
            if to == DeploymentStatus.FAILED:
                replicas.failed(session, row)
        with session_scope() as session:
            schedule(session, settings)
