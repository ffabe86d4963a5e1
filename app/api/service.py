"""Service endpoints: liveness, readiness (database and broker) and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.db import get_engine
from app.errors import APIError, error_responses

router = APIRouter(tags=["service"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _check_database() -> None:
    with get_engine().connect() as conn:
        conn.execute(text("SELECT 1"))


def _check_broker() -> None:
    from workers.celery_app import get_celery

    with get_celery().connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@router.get("/readyz", responses=error_responses(503))
async def readyz() -> dict[str, object]:
    checks = {}
    for name, check in (("database", _check_database), ("broker", _check_broker)):
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
