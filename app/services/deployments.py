"""Deployments: serve a drafter (a job's checkpoint, or a Hub drafter with its verifier) with
its verifier, behind the gateway. Placed by the scheduler like jobs; run by a worker."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Deployment, DeploymentEvent, Job
from app.errors import APIError, not_found
from app.schemas.deployments import DeploymentCreate, DeploymentOut
from app.services import capture, quotas, state
from app.services.scheduling import schedule
from app.services.state import DeploymentStatus
from app.services.verifier import load_config, read_config, resolve_verifier
from app.settings import Settings

ACTIVE = [s.value for s in (DeploymentStatus.PENDING, DeploymentStatus.STARTING,
                            DeploymentStatus.READY, DeploymentStatus.STOPPING)]


def _drafter_block_size(config: dict[str, Any], param: str) -> int:
    block_size = config.get("block_size")
    if (config.get("speculators_model_type") != "dflash" or not isinstance(block_size, int)
            or isinstance(block_size, bool) or block_size < 2):
        raise APIError(422, "the drafter is not a speculators-format DFlash checkpoint (its "
                       "config.json needs speculators_model_type 'dflash' and an integer block_size)",
                       code="invalid_drafter", param=param)
    return block_size


def resolve_source(session: Session, project_id: str, body: DeploymentCreate,
                   settings: Settings, hub: Mapping[str, bytes]) -> dict[str, Any]:
    if body.checkpoint_id is not None:
        row = session.execute(
            select(Checkpoint, Job).join(Job, Job.id == Checkpoint.job_id)
            .where(Checkpoint.id == body.checkpoint_id, Job.project_id == project_id)).first()
        if row is None:
            raise APIError(422, f"no checkpoint with id '{body.checkpoint_id}'",
                           code="checkpoint_not_found", param="checkpoint_id")
        checkpoint, job = row
        config_file = Path(checkpoint.path) / "config.json"
        if not config_file.is_file():
            raise APIError(422, f"checkpoint {checkpoint.id} is no longer on disk",
                           code="checkpoint_not_found", param="checkpoint_id")
        block_size = _drafter_block_size(load_config(config_file, checkpoint.id,
                                                     param="checkpoint_id"), "checkpoint_id")
        return {"source": {"kind": "checkpoint", "checkpoint_id": checkpoint.id, "job_id": job.id},
                "drafter": checkpoint.path, "verifier": job.spec["verifier_info"]["reference"],
                "block_size": block_size}
    assert body.drafter is not None and body.verifier is not None
    drafter, drafter_source, config = read_config(body.drafter, settings=settings, hub=hub,
                                                   param="drafter")
    block_size = _drafter_block_size(config, "drafter")
    verifier = resolve_verifier(body.verifier, settings=settings, hub=hub)
    return {"source": {"kind": drafter_source, "drafter": body.drafter, "verifier": body.verifier},
            "drafter": drafter, "verifier": verifier.reference, "block_size": block_size}


def create_deployment(session: Session, project_id: str, body: DeploymentCreate,
                      settings: Settings, hub: Mapping[str, bytes]) -> Deployment:
    """``hub``: the configs of Hub models it names (``app.services.hub.fetch_configs``)."""
    taken = session.scalar(select(Deployment.id).where(
        Deployment.project_id == project_id, Deployment.name == body.name,
        Deployment.status.in_(ACTIVE)))
    if taken is not None:
        raise APIError(409, f"deployment {taken} already serves '{body.name}'; delete it first",
                       code="deployment_name_in_use", param="name")
    source = resolve_source(session, project_id, body, settings, hub)
    spec = {
        **source,
        "num_speculative_tokens": body.num_speculative_tokens or source["block_size"] - 1,
        "runtime": body.runtime or settings.default_runtime,
        "resources": body.resources.model_dump(),
    }
    capture_dataset = None
    if body.capture is not None:  # before the new row exists: a redeploy reuses the dataset
        spec["capture"] = body.capture.model_dump()
        capture_dataset = capture.start(session, project_id, body.name, body.capture)
    deployment = Deployment(project_id=project_id, name=body.name, spec=spec,
                            capture_dataset_id=capture_dataset.id if capture_dataset else None)
    state.initialize(session, deployment, "deployment created")
    quotas.check_active(session, deployment, settings)
    schedule(session, settings)
    return deployment


def get_deployment(session: Session, project_id: str, deployment_id: str) -> Deployment:
    deployment = session.scalars(select(Deployment).where(
        Deployment.id == deployment_id, Deployment.project_id == project_id)).first()
    if deployment is None:
        raise not_found("deployment", deployment_id)
    return deployment


def list_deployments(session: Session, project_id: str, *, limit: int,
                     after: str | None) -> tuple[list[Deployment], bool]:
    query = select(Deployment).where(Deployment.project_id == project_id)
    if after is not None:
        query = query.where(Deployment.id < after)
    rows = list(session.scalars(query.order_by(Deployment.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def list_events(session: Session, deployment: Deployment, *, after: int | None,
                limit: int) -> tuple[list[DeploymentEvent], bool]:
    query = select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment.id)
    if after is not None:
        query = query.where(DeploymentEvent.id > after)
    rows = list(session.scalars(query.order_by(DeploymentEvent.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_deployment(session: Session, project_id: str, deployment_id: str,
                      settings: Settings) -> Deployment:
    """Pending: stopped at once. Starting or ready: stopping, then stopped by its worker."""
    deployment = get_deployment(session, project_id, deployment_id)
    current = DeploymentStatus(deployment.status)
    if current == DeploymentStatus.PENDING:
        state.transition(session, deployment, DeploymentStatus.STOPPED, reason="deleted by user")
        schedule(session, settings)
    elif current in (DeploymentStatus.STARTING, DeploymentStatus.READY):
        state.transition(session, deployment, DeploymentStatus.STOPPING, reason="deleted by user")
    return deployment


def deployment_out(deployment: Deployment) -> DeploymentOut:
    spec = deployment.spec
    return DeploymentOut(
        id=deployment.id, name=deployment.name, status=deployment.status,
        status_reason=deployment.status_reason, source=spec["source"], drafter=spec["drafter"],
        verifier=spec["verifier"], num_speculative_tokens=spec["num_speculative_tokens"],
        runtime=spec["runtime"], resources=spec["resources"], restarts=deployment.restarts,
        worker=deployment.worker_id, allocation=deployment.allocation,
        created_at=deployment.created_at, updated_at=deployment.updated_at,
        started_at=deployment.started_at, finished_at=deployment.finished_at,
        capture=capture.capture_out(deployment.capture_dataset, spec.get("capture")))
