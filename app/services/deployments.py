"""Deployments: serve a drafter (a job's checkpoint, or a Hub drafter with its verifier) with
its verifier, behind the gateway. Placed by the scheduler like jobs; run by a worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from app.db.models import Checkpoint, Deployment, DeploymentEvent, Job
from app.errors import APIError, not_found
from app.schemas.deployments import (
    DeploymentCreate,
    DeploymentOut,
    DeploymentUpdate,
    ReplicaOut,
    RetrainRequest,
)
from app.schemas.jobs import JOB_NAME_MAX, JobCreate
from app.services import capture, quotas, replicas, state
from app.services.scheduling import schedule
from app.services.state import DeploymentStatus
from app.schemas.job_spec import JobSpec
from app.services.checkpoints import checkpoint_drafter, read_drafter
from app.services.jobs import SHAPE, request_hash
from app.services.verifier import read_config, resolve_verifier
from app.settings import Settings

ACTIVE = [s.value for s in (DeploymentStatus.PENDING, DeploymentStatus.STARTING,
                            DeploymentStatus.READY, DeploymentStatus.STOPPING)]


def resolve_source(session: Session, project_id: str, body: DeploymentCreate,
                   settings: Settings, hub: Mapping[str, bytes]) -> dict[str, Any]:
    if body.checkpoint_id is not None:
        drafter = checkpoint_drafter(session, project_id, body.checkpoint_id, param="checkpoint_id")
        return {"source": drafter.source(), "drafter": drafter.checkpoint.path,
                "verifier": drafter.verifier, **drafter.drafter.serving()}
    assert body.drafter is not None and body.verifier is not None
    path, drafter_source, config = read_config(body.drafter, settings=settings, hub=hub,
                                               param="drafter")
    drafter = read_drafter(config, "drafter")
    verifier = resolve_verifier(body.verifier, settings=settings, hub=hub)
    return {"source": {"kind": drafter_source, "drafter": body.drafter, "verifier": body.verifier},
            "drafter": path, "verifier": verifier.reference, **drafter.serving()}


def create_deployment(session: Session, project_id: str, body: DeploymentCreate,
                      settings: Settings, hub: Mapping[str, bytes]) -> Deployment:
    """``hub``: the configs of Hub models it names (``app.services.hub.fetch_configs``)."""
    taken = session.scalar(select(func.coalesce(Deployment.replica_of, Deployment.id)).where(
        Deployment.project_id == project_id, Deployment.name == body.name,
        Deployment.status.in_(ACTIVE)).limit(1))
    if taken is not None:
        raise APIError(409, f"deployment {taken} already serves '{body.name}'; delete it first",
                       code="deployment_name_in_use", param="name")
    source = resolve_source(session, project_id, body, settings, hub)
    spec = {
        **source,
        "num_speculative_tokens": body.num_speculative_tokens or source["num_speculative_tokens"],
        "runtime": body.runtime or settings.default_runtime,
        "resources": body.resources.model_dump(),
        "replicas": body.replicas,
    }
    capture_dataset = None
    if body.capture is not None:  # before the new row exists: a redeploy reuses the dataset
        spec["capture"] = body.capture.model_dump()
        capture_dataset = capture.start(session, project_id, body.name, body.capture)
    deployment = Deployment(project_id=project_id, name=body.name, spec=spec,
                            capture_dataset_id=capture_dataset.id if capture_dataset else None)
    state.initialize(session, deployment, "deployment created")
    quotas.check_active(session, deployment, settings)
    replicas.scale(session, deployment, body.replicas)
    schedule(session, settings)
    return deployment


def update_deployment(session: Session, project_id: str, deployment_id: str,
                      body: DeploymentUpdate, settings: Settings) -> Deployment:
    """Scale it to ``body.replicas`` (``app.services.replicas.scale``), one change at a time
    per project, and never past a delete (``locked_deployment``)."""
    quotas.lock_project(session, project_id)
    deployment = locked_deployment(session, project_id, deployment_id)
    replicas.scale(session, deployment, body.replicas)
    schedule(session, settings)
    return deployment


def locked_deployment(session: Session, project_id: str, deployment_id: str) -> Deployment:
    """The deployment, its row locked until the request commits, read as it is then: a scale
    and a delete take this lock, so one waits for the other and sees what it did (a scale after
    a delete finds the deployment stopping: 409; a delete after a scale stops the new replicas
    too). On SQLite, the database's write lock (``app.db``, FOR UPDATE)."""
    deployment = get_deployment(session, project_id, deployment_id)
    session.execute(select(Deployment.id).where(Deployment.id == deployment.id).with_for_update())
    session.refresh(deployment)
    session.expire(deployment, ["replica_set"])
    return deployment


def get_deployment(session: Session, project_id: str, deployment_id: str) -> Deployment:
    """A deployment of the project (its replicas' rows are not deployments)."""
    deployment = session.scalars(select(Deployment).where(
        Deployment.id == deployment_id, Deployment.project_id == project_id,
        Deployment.replica_of.is_(None))).first()
    if deployment is None:
        raise not_found("deployment", deployment_id)
    return deployment


def list_deployments(session: Session, project_id: str, *, limit: int,
                     after: str | None) -> tuple[list[Deployment], bool]:
    query = (select(Deployment).options(selectinload(Deployment.replica_set))
             .where(Deployment.project_id == project_id, Deployment.replica_of.is_(None)))
    if after is not None:
        query = query.where(Deployment.id < after)
    rows = list(session.scalars(query.order_by(Deployment.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def list_events(session: Session, deployment: Deployment, *, after: int | None,
                limit: int) -> tuple[list[DeploymentEvent], bool]:
    """Its events and its replicas' (``replica_of``), oldest first."""
    rows = select(Deployment.id).where(Deployment.replica_of == deployment.id)
    query = select(DeploymentEvent).where(DeploymentEvent.deployment_id.in_(
        rows.union(select(Deployment.id).where(Deployment.id == deployment.id))))
    if after is not None:
        query = query.where(DeploymentEvent.id > after)
    rows = list(session.scalars(query.order_by(DeploymentEvent.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_deployment(session: Session, project_id: str, deployment_id: str,
                      settings: Settings) -> Deployment:
    """Every replica: pending ones stopped at once, starting or ready ones stopping, then
    stopped by their workers. A scale under way finishes first (``locked_deployment``)."""
    deployment = locked_deployment(session, project_id, deployment_id)
    for row in replicas.all_rows(deployment):
        replicas.stop(session, row, "deleted by user")
    schedule(session, settings)
    return deployment


def retrain_hash(deployment_id: str, body: RetrainRequest) -> str:
    """What a retrain's replay must hash to: its deployment and body, not the job they make
    (which changes with what the deployment serves)."""
    return request_hash(body, scope=f"retrain {deployment_id}\n")


def retrain_request(session: Session, project_id: str, deployment_id: str,
                    body: RetrainRequest) -> JobCreate:
    """The job ``POST /api/deployments/{id}/retrain`` creates (then checked and created as
    ``POST /api/jobs`` would): the deployment's verifier and runtime; when it serves a
    checkpoint, that checkpoint's job's settings and a warm start from it (``init_from``), its
    gate unless the body names one; the data regenerated by the verifier unless the body says
    otherwise; ``deploy`` back to this deployment when asked."""
    deployment = get_deployment(session, project_id, deployment_id)
    spec = deployment.spec
    dataset = body.dataset or deployment.capture_dataset_id  # default: its captured traffic
    if dataset is None:
        raise APIError(422, "this deployment captures no traffic (its \"capture\" option is off, "
                       "or its dataset was deleted): name the dataset to retrain on",
                       code="dataset_required", param="dataset")
    source = spec["source"]
    base: dict[str, Any] = {}
    kind = spec.get("kind", "dflash")
    if source["kind"] == "checkpoint":
        job = JobSpec.load(session.get(Job, source["job_id"]).spec)
        served = session.get(Checkpoint, source["checkpoint_id"])
        # The drafter it serves: its candidate's kind and settings (a bake-off's, any one).
        drafter = job.candidate(served.candidate if served is not None else 0).drafter
        base = {"verifier": job.verifier, "init_from": source["checkpoint_id"],
                "speculator": drafter.model_dump(exclude=set(SHAPE)),
                "resources": job.resources.model_dump(), "mode": job.mode,
                "gate": job.gate.model_dump() if job.gate else None}
    else:  # a Hub or local drafter: trained anew in its kind and shape (no checkpoint)
        shape = {"block_size": spec["block_size"]} if spec.get("block_size") else {}
        base = {"verifier": source["verifier"], "speculator": {"type": kind, **shape}}
    overrides = body.speculator.model_dump(exclude_none=True)
    data = body.data.model_dump(exclude_unset=True) if body.data is not None else {}
    fields = {
        **base,
        "dataset": dataset,
        "runtime": spec["runtime"],
        "speculator": {**base["speculator"], **overrides},
        "data": {"regenerate": True, **data},
        "evaluate": body.evaluate.model_dump() if body.evaluate is not None else True,
        "gate": body.gate.model_dump() if body.gate is not None else base.get("gate"),
        "deploy": {"deployment": deployment.name} if body.deploy else None,
        "metadata": {"retrain_of": deployment.id},
        "name": f"retrain of {deployment.name}"[:JOB_NAME_MAX],
    }
    try:
        return JobCreate.model_validate(fields)
    except ValidationError as exc:  # the source job's settings and the overrides disagree
        error = exc.errors()[0]
        raise APIError(422, f"the retrain job would be invalid: {error['msg']}",
                       code="invalid_value",
                       param=".".join(str(part) for part in error["loc"])) from exc


def replica_out(row: Deployment) -> ReplicaOut:
    return ReplicaOut(replica=row.replica, status=row.status, status_reason=row.status_reason,
                      worker=row.worker_id, restarts=row.restarts, drafter=row.spec["drafter"],
                      started_at=row.started_at)


def deployment_out(deployment: Deployment) -> DeploymentOut:
    """Its status is ``ready`` while any replica is (until it is deleted)."""
    spec = deployment.spec
    rows = replicas.all_rows(deployment)
    status = deployment.status
    if status in replicas.RUNNING and any(r.status == DeploymentStatus.READY.value for r in rows):
        status = DeploymentStatus.READY.value
    return DeploymentOut(
        id=deployment.id, name=deployment.name, status=status,
        status_reason=deployment.status_reason, source=spec["source"], drafter=spec["drafter"],
        kind=spec.get("kind", "dflash"),
        verifier=spec["verifier"], num_speculative_tokens=spec["num_speculative_tokens"],
        runtime=spec["runtime"], resources=spec["resources"], restarts=deployment.restarts,
        worker=deployment.worker_id, allocation=deployment.allocation,
        created_at=deployment.created_at, updated_at=deployment.updated_at,
        started_at=deployment.started_at, finished_at=deployment.finished_at,
        capture=capture.capture_out(deployment.capture_dataset, spec.get("capture")),
        replicas=spec.get("replicas", 1), replica_states=[replica_out(r) for r in rows])
