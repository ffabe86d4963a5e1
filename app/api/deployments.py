"""/api/deployments: thin routes over app.services.deployments."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import AwareDatetime
from starlette.concurrency import run_in_threadpool

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.api.jobs import REPLAYED, IdempotencyKey, replayed
from app.api.links import links
from app.errors import error_responses
from app.schemas.common import BIGINT_MAX, Page
from app.schemas.deployments import (
    DeploymentCreate,
    DeploymentEventOut,
    DeploymentOut,
    DeploymentUpdate,
    PromoteRequest,
    PromotionOut,
    RetrainRequest,
)
from app.schemas.jobs import JobOut
from app.services import deployments as service
from app.services import jobs, promotions
from app.schemas.live_metrics import LiveMetricPoint, LiveMetricsPage
from app.services import live_metrics as live
from app.services.hub import fetch_configs

router = APIRouter(prefix="/api/deployments", tags=["deployments"],
                   responses=error_responses(401, 403, 422, 503))


@router.post("", status_code=201, response_model=DeploymentOut,
             responses={201: links("deployment_id", ("get", "/api/deployments/{deployment_id}"),
                                   ("get", "/api/deployments/{deployment_id}/events"),
                                   ("delete", "/api/deployments/{deployment_id}")),
                        **error_responses(400, 409, 413, 429)})
async def create_deployment(body: DeploymentCreate, key: CurrentKey, session: SessionDep,
                            settings: SettingsDep) -> DeploymentOut:
    hub = await fetch_configs({"drafter": body.drafter, "verifier": body.verifier}, settings)
    deployment = await run_in_threadpool(service.create_deployment, session, key.project_id,
                                         body, settings, hub)
    return service.deployment_out(deployment)


@router.get("", response_model=Page[DeploymentOut])
def list_deployments(key: CurrentKey, session: SessionDep,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20,
                     after: Annotated[str | None, Query(pattern=r"^dep_[0-9a-f]{24}$")] = None,
                     ) -> Page[DeploymentOut]:
    rows, has_more = service.list_deployments(session, key.project_id, limit=limit, after=after)
    return Page(data=[service.deployment_out(d) for d in rows], has_more=has_more,
                last_id=rows[-1].id if rows else None)


@router.get("/{deployment_id}", response_model=DeploymentOut,
            responses=error_responses(404))
def get_deployment(deployment_id: str, key: CurrentKey, session: SessionDep) -> DeploymentOut:
    return service.deployment_out(service.get_deployment(session, key.project_id, deployment_id))


@router.patch("/{deployment_id}", response_model=DeploymentOut,
              responses=error_responses(400, 404, 409, 413))
def update_deployment(deployment_id: str, body: DeploymentUpdate, key: CurrentKey,
                      session: SessionDep, settings: SettingsDep) -> DeploymentOut:
    """Scale a running deployment: new replicas are placed and started (each on a worker slot
    of its own), those past the count drain and stop; a replica that failed for good is
    replaced. 409 when the deployment is stopping, stopped or failed."""
    return service.deployment_out(
        service.update_deployment(session, key.project_id, deployment_id, body, settings))


@router.get("/{deployment_id}/events", response_model=Page[DeploymentEventOut],
            responses=error_responses(404))
def list_events(deployment_id: str, key: CurrentKey, session: SessionDep,
                limit: Annotated[int, Query(ge=1, le=100)] = 100,
                after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None
                ) -> Page[DeploymentEventOut]:
    """Status changes (restarts included) and the serving processes started and exited, oldest
    first; pass ``last_id`` back as ``after`` for the next page."""
    deployment = service.get_deployment(session, key.project_id, deployment_id)
    events, has_more = service.list_events(session, deployment, after=after, limit=limit)
    replica = {row.id: row.replica for row in deployment.replica_set}
    return Page(data=[DeploymentEventOut.model_validate(e, from_attributes=True).model_copy(
                          update={"replica": replica.get(e.deployment_id, 0)}) for e in events],
                has_more=has_more, last_id=events[-1].id if events else None)


@router.post("/{deployment_id}/promote", status_code=202, response_model=PromotionOut,
             responses=error_responses(400, 404, 409, 413))
def promote(deployment_id: str, body: PromoteRequest, key: CurrentKey,
            session: SessionDep) -> PromotionOut:
    """Switch the deployment to another checkpoint without downtime: the new engine starts
    beside the old one, the route switches once it is ready, the old engine finishes its
    in-flight requests and stops. A new engine that fails leaves the old one serving. Accepted:
    follow the promotion (GET .../promotions) or the deployment's events."""
    deployment = service.get_deployment(session, key.project_id, deployment_id)
    promotion = promotions.request_promotion(session, deployment, body.checkpoint_id)
    return promotions.promotion_views(session, [promotion])[0]


@router.post("/{deployment_id}/rollback", status_code=202, response_model=PromotionOut,
             responses=error_responses(404, 409))
def rollback(deployment_id: str, key: CurrentKey, session: SessionDep) -> PromotionOut:
    """Back to the drafter served before the current one, switched the same way as a promotion
    (no downtime). 409 when the deployment has served only one drafter."""
    deployment = service.get_deployment(session, key.project_id, deployment_id)
    promotion = promotions.request_rollback(session, deployment)
    return promotions.promotion_views(session, [promotion])[0]


@router.get("/{deployment_id}/promotions", response_model=Page[PromotionOut],
            responses=error_responses(404))
def list_promotions(deployment_id: str, key: CurrentKey, session: SessionDep,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20,
                    after: Annotated[str | None, Query(pattern=r"^prom_[0-9a-f]{24}$")] = None,
                    ) -> Page[PromotionOut]:
    """Its promotions and rollbacks, newest first: the history of its drafters."""
    deployment = service.get_deployment(session, key.project_id, deployment_id)
    rows, has_more = promotions.list_promotions(session, deployment, limit=limit, after=after)
    return Page(data=promotions.promotion_views(session, rows), has_more=has_more,
                last_id=rows[-1].id if rows else None)


@router.post("/{deployment_id}/retrain", status_code=201, response_model=JobOut,
             responses={200: REPLAYED, **error_responses(400, 404, 409, 413, 429)})
async def retrain(deployment_id: str, key: CurrentKey, session: SessionDep,
                  settings: SettingsDep, response: Response, body: RetrainRequest | None = None,
                  idempotency_key: IdempotencyKey = None) -> JobOut:
    """Create a job that retrains the deployment's drafter (``RetrainRequest``), checked and
    created as ``POST /api/jobs`` creates one; the job is the answer. With an Idempotency-Key,
    the same key and request answer the same job (200), whatever the deployment serves by then."""
    body = body or RetrainRequest()
    digest = service.retrain_hash(deployment_id, body)
    job = None if idempotency_key is None else await run_in_threadpool(
        jobs.replay, session, key.project_id, idempotency_key, digest)
    created = job is None
    if job is None:
        request = await run_in_threadpool(service.retrain_request, session, key.project_id,
                                          deployment_id, body)
        hub = await fetch_configs({"verifier": request.verifier}, settings)
        job, created = await run_in_threadpool(
            jobs.create_job, session, key.project_id, request, settings=settings, hub=hub,
            idempotency_key=idempotency_key, digest=digest)
    if not created:
        replayed(response)
    return (await run_in_threadpool(jobs.job_outs, session, [job]))[0]


@router.delete("/{deployment_id}", response_model=DeploymentOut, responses={
    200: {"description": "Stopping: a pending deployment is stopped at once, a starting or ready "
          "one moves to stopping, then stopped. Its record stays readable."},
    **error_responses(404)})
def delete_deployment(deployment_id: str, key: CurrentKey, session: SessionDep,
                      settings: SettingsDep) -> DeploymentOut:
    return service.deployment_out(
        service.delete_deployment(session, key.project_id, deployment_id, settings))


@router.get("/{deployment_id}/metrics", response_model=LiveMetricsPage,
            responses=error_responses(404))
def list_metrics(deployment_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep,
                 since: Annotated[AwareDatetime | None, Query(
                     description="Points from this time on (ISO 8601 with a timezone)")] = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None,
                 window_seconds: Annotated[float | None, Query(
                     gt=0, le=30 * 86400, description="The summary's window (default: "
                     "SPECDECK_DRIFT_WINDOW_SECONDS)")] = None,
                 ) -> LiveMetricsPage:
    """Live acceptance: one point per scrape interval of the engine's /metrics (oldest first;
    pass ``last_id`` back as ``after``), and ``window``, the acceptance of the drafter serving
    now over the last ``window_seconds``, weighted by drafts."""
    deployment = service.get_deployment(session, key.project_id, deployment_id)
    points, has_more = live.list_points(session, deployment, since=since, after=after,
                                        limit=limit)
    window = live.window_summary(session, deployment.id,
                                 window_seconds or settings.drift_window_seconds,
                                 settings=settings)
    return LiveMetricsPage(data=[LiveMetricPoint.model_validate(p, from_attributes=True)
                                 for p in points],
                           has_more=has_more, last_id=points[-1].id if points else None,
                           window=window)
