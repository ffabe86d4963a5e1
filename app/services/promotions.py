"""Promotions: switch a deployment's drafter without downtime, and roll it back.

The API (or a job's ``deploy`` option) records a pending promotion; the worker serving the
deployment picks it up (``workers/promotion.py``): it starts the new engine beside the old one,
switches the route here in one transaction (``switch_route``), lets the old engine drain and
stops it. A new engine that fails to become ready leaves the old one serving. The succeeded
promotions are the deployment's history of drafters: a rollback goes back to the ``previous``
of the latest one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Allocation, Deployment, Promotion, Worker
from app.errors import APIError
from app.schemas.deployments import PromotionOut, ReplicaPromotionOut
from app.services.checkpoints import checkpoint_drafter
from app.services.paging import newest_first
from app.services.replicas import all_rows, replica_rows
from app.services.scheduling import free_units
from app.services.state import (
    PROMOTION_ACTIVE,
    DeploymentStatus,
    PromotionStatus,
    move_promotion,
    record_event,
)
from app.services.webhooks import enqueue

# The deployment spec's fields that name its drafter: what a promotion changes.
DRAFTER_FIELDS = ("source", "drafter", "kind", "block_size", "num_speculative_tokens")
# A promotion is picked up by the worker that serves the deployment.
SERVING = (DeploymentStatus.STARTING.value, DeploymentStatus.READY.value)


def drafter_of(spec: dict[str, Any]) -> dict[str, Any]:
    """Its drafter's fields (DFlash for a deployment made before kinds were recorded)."""
    return {"kind": "dflash", **{name: spec[name] for name in DRAFTER_FIELDS if name in spec}}


def serving_deployment(session: Session, project_id: str, name: str) -> Deployment | None:
    """The project's starting or ready deployment of that name (names are unique among the
    active ones)."""
    return session.scalars(select(Deployment).where(
        Deployment.project_id == project_id, Deployment.name == name,
        Deployment.replica_of.is_(None), Deployment.status.in_(SERVING))).first()


def checkpoint_target(session: Session, deployment: Deployment, checkpoint_id: str, *,
                      param: str) -> dict[str, Any]:
    """The drafter fields of a deployment serving checkpoint ``checkpoint_id`` of its project;
    422 when it is not a drafter for the deployment's verifier."""
    drafter = checkpoint_drafter(session, deployment.project_id, checkpoint_id, param=param)
    if drafter.verifier != deployment.spec["verifier"]:
        raise APIError(422, f"checkpoint {checkpoint_id} was trained for verifier "
                       f"'{drafter.verifier}', and deployment {deployment.name} serves "
                       f"'{deployment.spec['verifier']}'", code="incompatible_drafter", param=param)
    return {"source": drafter.source(), "drafter": drafter.checkpoint.path,
            **drafter.drafter.serving()}


def _active(session: Session, deployment: Deployment) -> Promotion | None:
    """A switch under way on any of its replicas."""
    return session.scalars(select(Promotion).where(
        Promotion.deployment_id.in_([row.id for row in all_rows(deployment)]),
        Promotion.status.in_([s.value for s in PROMOTION_ACTIVE]))).first()


def _request(session: Session, deployment: Deployment, kind: str, target: dict[str, Any],
             job_id: str | None = None) -> Promotion:
    if deployment.status not in SERVING:
        raise APIError(409, f"deployment {deployment.id} is {deployment.status}; only a starting "
                       "or ready deployment switches drafters", code="deployment_not_serving")
    # Serialized per deployment: two concurrent requests cannot both pass the check below.
    session.execute(select(Deployment.id).where(Deployment.id == deployment.id).with_for_update())
    active = _active(session, deployment)
    if active is not None:
        raise APIError(409, f"promotion {active.promotion_of or active.id} of deployment "
                       f"{deployment.id} is {active.status}; wait until it ends",
                       code="promotion_in_progress")
    promotion = _pending(session, deployment, kind, target, job_id)
    # Every replica switches the same way, each by its own worker (a row of its own, naming
    # this one); one that has not started yet starts with the new drafter.
    for replica in replica_rows(deployment):
        if replica.status in SERVING:
            _pending(session, replica, kind, target, job_id, of=promotion)
        elif replica.status == DeploymentStatus.PENDING.value:
            replica.spec = {**replica.spec, **target}
    return promotion


def _pending(session: Session, deployment: Deployment, kind: str, target: dict[str, Any],
             job_id: str | None, of: Promotion | None = None) -> Promotion:
    promotion = Promotion(deployment_id=deployment.id, kind=kind, target=target, job_id=job_id,
                          status=PromotionStatus.PENDING.value,
                          promotion_of=of.id if of is not None else None)
    session.add(promotion)
    session.flush()
    what = "roll back to" if kind == "rollback" else "promote"
    record_event(session, deployment, "promotion",
                 f"{kind} {promotion.id} requested: {what} drafter {target['drafter']}"
                 + (f" (from job {job_id})" if job_id else ""),
                 {"promotion": promotion.id, "kind": kind, "step": "pending", "target": target})
    return promotion


def request_promotion(session: Session, deployment: Deployment, checkpoint_id: str, *,
                      param: str = "checkpoint_id", job_id: str | None = None) -> Promotion:
    target = checkpoint_target(session, deployment, checkpoint_id, param=param)
    if target["drafter"] == deployment.spec["drafter"]:
        raise APIError(409, f"deployment {deployment.name} already serves checkpoint "
                       f"{checkpoint_id}", code="already_serving", param=param)
    return _request(session, deployment, "promote", target, job_id)


def request_rollback(session: Session, deployment: Deployment) -> Promotion:
    """Back to the drafter served before the current one (the latest succeeded switch's
    ``previous``); rolling back twice comes back to where it started."""
    last = session.scalars(select(Promotion).where(
        Promotion.deployment_id == deployment.id,
        Promotion.status == PromotionStatus.SUCCEEDED.value).order_by(Promotion.id.desc())).first()
    if last is None or last.previous is None:
        raise APIError(409, f"deployment {deployment.id} has served only one drafter; there is "
                       "nothing to roll back to", code="nothing_to_roll_back")
    return _request(session, deployment, "rollback", last.previous)


def list_promotions(session: Session, deployment: Deployment, *, limit: int,
                    after: str | None) -> tuple[list[Promotion], bool]:
    return newest_first(session, select(Promotion).where(Promotion.deployment_id == deployment.id),
                        Promotion.id, limit=limit, after=after)


# The steps under way, least advanced first: a switch is as far as its slowest replica.
UNDER_WAY = tuple(step.value for step in PromotionStatus if step in PROMOTION_ACTIVE)


def promotion_views(session: Session, rows: list[Promotion]) -> list[PromotionOut]:
    """The deployment's promotions as the API shows them: each with its replicas' steps
    (one query for all of them) and the whole switch's step."""
    steps: dict[str, list[tuple[int, Promotion]]] = {row.id: [(0, row)] for row in rows}
    if rows:
        for child, replica in session.execute(
                select(Promotion, Deployment.replica)
                .join(Deployment, Deployment.id == Promotion.deployment_id)
                .where(Promotion.promotion_of.in_(list(steps)))
                .execution_options(populate_existing=True)):
            steps[child.promotion_of].append((replica, child))
    return [_view(row, sorted(steps[row.id], key=lambda step: step[0])) for row in rows]


def _view(row: Promotion, steps: list[tuple[int, Promotion]]) -> PromotionOut:
    replicas = [ReplicaPromotionOut(replica=replica, status=step.status,
                                    status_reason=step.status_reason,
                                    finished_at=step.finished_at) for replica, step in steps]
    under_way = [step for step in replicas if step.status in UNDER_WAY]
    failed = [step for step in replicas if step.status == PromotionStatus.FAILED.value]
    if under_way:
        shown = min(under_way, key=lambda step: UNDER_WAY.index(step.status))
    else:
        shown = failed[0] if failed else replicas[0]
    reason = shown.status_reason
    if reason and len(replicas) > 1:
        reason = f"replica {shown.replica}: {reason}"
    ended = [step.finished_at for step in replicas if step.finished_at is not None]
    return PromotionOut(id=row.id, deployment_id=row.deployment_id, kind=row.kind,
                        status=shown.status, status_reason=reason, target=row.target,
                        previous=row.previous, job_id=row.job_id, created_at=row.created_at,
                        updated_at=max(step.updated_at for _, step in steps),
                        finished_at=None if under_way or not ended else max(ended),
                        replicas=replicas)


def announce_if_ended(session: Session, promotion: Promotion) -> None:
    """Once the last replica's step of a switch has ended, the whole switch's webhook event
    (``deployment.promotion_succeeded`` or ``..._failed``, with the deployment and the
    promotion as the API shows them), in the caller's transaction (``move_promotion``).

    Sent once, however close together the replicas end: the deployment's promotion row is
    locked first, so of two replicas' last steps written at once the second one's transaction
    reads the rows after the first one's committed (on Postgres, FOR UPDATE; on SQLite the
    step's UPDATE already holds the database's write lock)."""
    head = session.scalars(select(Promotion).where(
        Promotion.id == (promotion.promotion_of or promotion.id))
        .with_for_update().execution_options(populate_existing=True)).one()
    steps = session.scalars(select(Promotion.status).where(
        Promotion.promotion_of == head.id)).all()
    if any(status in UNDER_WAY for status in (head.status, *steps)):
        return
    [view] = promotion_views(session, [head])
    deployment = session.get(Deployment, head.deployment_id)
    enqueue(session, deployment.project_id, f"deployment.promotion_{view.status}", deployment,
            {"promotion": view.model_dump(mode="json")})


# The worker's side ------------------------------------------------------------------------------

def next_pending(session: Session, deployment_id: str) -> Promotion | None:
    return session.scalars(select(Promotion).where(
        Promotion.deployment_id == deployment_id,
        Promotion.status == PromotionStatus.PENDING.value).order_by(Promotion.id)).first()


def reserve_gpus(session: Session, deployment: Deployment, count: int) -> list[int] | None:
    """``count`` more free GPUs of the deployment's worker for the new engine (vLLM takes most
    of a GPU's memory, so two engines do not share one); None when the worker has too few free.
    The allocations' unique key keeps them from anyone else; the deployment's ending hands
    them back like its own."""
    worker = session.get(Worker, deployment.worker_id) if deployment.worker_id else None
    free = free_units(session, worker, "gpu") if worker is not None else []
    if len(free) < count:
        return None
    taken = free[:count]
    try:
        with session.begin_nested():
            session.add_all(Allocation(worker_id=worker.id, resource="gpu", idx=i,
                                       deployment_id=deployment.id) for i in taken)
            session.flush()
    except IntegrityError:
        return None  # the scheduler placed something there meanwhile
    return taken


def release_gpus(session: Session, deployment: Deployment, gpus: list[int]) -> None:
    session.execute(delete(Allocation).where(Allocation.deployment_id == deployment.id,
                                             Allocation.resource == "gpu",
                                             Allocation.idx.in_(gpus)))


def switch_route(session: Session, deployment: Deployment, promotion: Promotion,
                 upstream_url: str, gpus: list[int] | None) -> dict[str, Any]:
    """The switch, in the caller's one transaction: the deployment's drafter and upstream
    become the new engine's, the promotion moves to draining (remembering the drafter it
    replaced, for rollback). With ``gpus`` (vLLM: the new engine ran on GPUs of its own), the
    deployment's allocation becomes those and the old engine's GPUs are handed back.
    Returns the new spec."""
    previous = drafter_of(deployment.spec)
    spec = {**deployment.spec, **promotion.target}
    deployment.spec, deployment.upstream_url = spec, upstream_url
    if gpus is not None:
        old = (deployment.allocation or {}).get("verifier", [])
        release_gpus(session, deployment, old)
        deployment.allocation = {**(deployment.allocation or {}), "verifier": gpus}
    promotion.previous = previous
    move_promotion(session, promotion, deployment, PromotionStatus.DRAINING,
                   f"route switched to the new engine ({upstream_url}, drafter "
                   f"{spec['drafter']}); the old engine drains", data={"upstream_url": upstream_url})
    return spec


def end_unfinished(session: Session, deployment: Deployment, reason: str) -> None:
    """A deployment whose worker lets it go (stopped, failed, handed back) ends its unfinished
    promotions: one not switched yet failed, one draining done (its old engine is gone)."""
    for promotion in list(session.scalars(select(Promotion).where(
            Promotion.deployment_id == deployment.id,
            Promotion.status.in_([s.value for s in PROMOTION_ACTIVE])))):
        if promotion.status == PromotionStatus.DRAINING:
            move_promotion(session, promotion, deployment, PromotionStatus.SUCCEEDED,
                           f"{promotion.kind} {promotion.id} done: the old engine stopped ({reason})")
        else:
            move_promotion(session, promotion, deployment, PromotionStatus.FAILED,
                           f"{promotion.kind} {promotion.id} failed: {reason}", reason=reason)
