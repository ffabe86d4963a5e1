"""Service endpoints: liveness, readiness (database and broker) and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.errors import APIError, error_responses
from app.services.reachability import ping_broker, ping_database

router = APIRouter(tags=["service"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
async def readyz() -> dict[str, object]:
    checks = {}
    for name, check in (("database", ping_database), ("broker", ping_broker)):
        try:
            await asyncio.wait_for(asyncio.to_thread(check), timeout=5)
            checks[name] = "ok"
        except Exception as exc:  # reported, not swallowed: it is the readiness answer
            raise APIError(503, f"{name} not reachable: {type(exc).__name__}: {exc}",
                           code=f"{name}_unavailable", headers={"Retry-After": "5"}) from exc
    return {"status": "ready", "checks": checks}


@router.get("/metrics", include_in_schema=False)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
