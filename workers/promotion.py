"""A deployment's engines, and the switch of its drafter without downtime, run by the worker
that serves it (the API side: ``app/services/promotions.py``).

The switch: (1) the new engine starts beside the old one (the local runtime: a second engine
process on another port of the same serving slot; vLLM: on free GPUs of the same worker, since
each vLLM engine takes most of its GPUs' memory; without enough free GPUs the promotion fails
and the old engine serves on), (2) the route switches in one transaction (the deployment's
drafter, ``upstream_url`` and GPUs), (3) the old engine drains: it runs until gateways can no
longer route to it from their cache (``gateway_route_cache_seconds`` plus a grace) and its
in-flight requests have ended (``vllm:num_requests_running`` and ``_waiting`` on its
``/metrics``), (4) it stops. A new engine that does not become ready is stopped, the promotion
fails and the old engine never stopped serving.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.db import session_scope
from app.db.models import Deployment, Promotion
from app.runtimes import ServeSpec, build_serve
from app.services import promotions
from app.services.state import PromotionStatus, move_promotion
from workers.readiness import free_port, wait_ready
from workers.runner import JobContext, StageFailed
from workers.supervisor import Process

log = logging.getLogger(__name__)
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")
DRAIN_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Engine:
    """One serving engine process of a deployment, on a port of its own."""

    proc: Process
    port: int
    gpus: list[int]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def upstream_url(ctx: JobContext, engine: Engine) -> str:
    """Where gateways reach the engine."""
    return f"http://{ctx.settings.worker_advertise_host}:{engine.port}"


def start_engine(ctx: JobContext, spec: dict[str, Any], name: str, api_key: str,
                 gpus: list[int] | None) -> Engine:
    port = free_port()
    advertised = ctx.settings.worker_advertise_host
    command = build_serve(ServeSpec.of_deployment(spec), name, port=port,
                          host="127.0.0.1" if advertised == "127.0.0.1" else "0.0.0.0",
                          gpus=gpus, api_key=api_key)
    return Engine(ctx.start(command), port, list(gpus or []))


def wait_engine(ctx: JobContext, engine: Engine, name: str, api_key: str) -> None:
    """Until the engine answers ready; StageFailed with its log tail if it exits or times out."""
    wait_ready(ctx, engine.proc, engine.base_url, name, what="serving engine",
               log_path=ctx.paths.log, timeout=ctx.settings.verifier_ready_seconds,
               headers=engine_headers(api_key))


def pending_promotion(ctx: JobContext) -> str | None:
    """The id of the oldest promotion waiting for this deployment's worker, if any."""
    with session_scope() as session:
        promotion = promotions.next_pending(session, ctx.lease.job_id)
        return promotion.id if promotion is not None else None


def _step(ctx: JobContext, promotion_id: str, to: PromotionStatus, message: str, **kwargs: Any
          ) -> None:
    def write(session: Any) -> None:
        move_promotion(session, session.get(Promotion, promotion_id), ctx.lease.load(session), to,
                       message, **kwargs)

    ctx.write(write)


def in_flight(engine: Engine, api_key: str) -> int:
    """Requests the engine is running or holding (0 once it no longer answers)."""
    try:
        text = httpx.get(f"{engine.base_url}/metrics", headers=engine_headers(api_key),
                         timeout=5).text
    except httpx.TransportError:
        return 0
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name in IN_FLIGHT:
            total += sum(sample.value for sample in family.samples)
    return int(total)


def drain(ctx: JobContext, engine: Engine, api_key: str) -> int:
    """Wait until no gateway can still route to ``engine`` from its cache and its in-flight
    requests have ended (at most ``promotion_drain_timeout_seconds``). Returns the requests
    still in flight when it gave up (0 when drained)."""
    settings = ctx.settings
    cached_until = time.monotonic() + settings.gateway_route_cache_seconds + \
        settings.promotion_drain_grace_seconds
    while time.monotonic() < cached_until:
        ctx.check()
        time.sleep(DRAIN_POLL_SECONDS)
    give_up = time.monotonic() + settings.promotion_drain_timeout_seconds
    while (left := in_flight(engine, api_key)) and time.monotonic() < give_up:
        ctx.check()
        time.sleep(DRAIN_POLL_SECONDS)
    return left


def switch_drafter(ctx: JobContext, old: Engine, promotion_id: str, name: str,
                   api_key: str) -> Engine:
    """Run one promotion (the steps above). Returns the engine that serves afterwards: the new
    one, or ``old`` when the new one failed."""
    with session_scope() as session:
        promotion = session.get(Promotion, promotion_id)
        target, kind = dict(promotion.target), promotion.kind
    spec = {**ctx.spec, **target}
    gpus: list[int] | None = None
    if spec["runtime"] == "vllm":
        count = spec["resources"]["tensor_parallel_size"]
        holder: dict[str, list[int] | None] = {}
        ctx.write(lambda session: holder.update(
            gpus=promotions.reserve_gpus(session, ctx.lease.load(session), count)))
        gpus = holder["gpus"]
        if gpus is None:
            reason = (f"no {count} free GPUs on this worker to start the new engine beside the "
                      "old one; the old drafter keeps serving")
            _step(ctx, promotion_id, PromotionStatus.FAILED, f"{kind} {promotion_id} failed: "
                  f"{reason}", reason=reason)
            return old
    _step(ctx, promotion_id, PromotionStatus.STARTING,
          f"{kind} {promotion_id}: starting the new engine (drafter {spec['drafter']}) beside "
          "the old one", data={"gpus": gpus or []})
    new = start_engine(ctx, spec, name, api_key, gpus)
    switched = False
    try:
        try:
            wait_engine(ctx, new, name, api_key)
        except StageFailed as exc:
            reason = f"the new engine did not become ready ({exc}); the old drafter keeps serving"
            _step(ctx, promotion_id, PromotionStatus.FAILED, f"{kind} {promotion_id} failed: "
                  f"{reason}", reason=reason, data={"log_tail": exc.log_tail})
            return old
        ctx.event("promotion", f"{kind} {promotion_id}: the new engine is ready on port {new.port}",
                  {"promotion": promotion_id, "kind": kind, "step": "ready", "port": new.port})
        url = upstream_url(ctx, new)
        holder_spec: dict[str, Any] = {}

        def switch(session: Any) -> None:
            deployment: Deployment = ctx.lease.load(session)
            holder_spec["spec"] = promotions.switch_route(
                session, deployment, session.get(Promotion, promotion_id), url, gpus)

        ctx.write(switch)
        switched = True
        ctx.spec = {**holder_spec["spec"], "allocation": {"verifier": gpus} if gpus is not None
                    else ctx.spec.get("allocation")}
    finally:
        if not switched:
            ctx.stop(new.proc)
            if gpus is not None:
                ctx.write(lambda session: promotions.release_gpus(
                    session, ctx.lease.load(session), gpus))
    try:
        left = drain(ctx, old, api_key)
    except BaseException:  # deleted, or the worker stops: serve_once stops only the old engine
        ctx.stop(new.proc)
        raise
    finally:
        ctx.stop(old.proc)
    ended = "drained" if not left else f"stopped with {left} requests still in flight after " \
        f"{ctx.settings.promotion_drain_timeout_seconds:.0f} s"
    _step(ctx, promotion_id, PromotionStatus.SUCCEEDED,
          f"{kind} {promotion_id} succeeded: the old engine {ended} and stopped; drafter "
          f"{spec['drafter']} serves", data={"in_flight_at_stop": left})
    return new
