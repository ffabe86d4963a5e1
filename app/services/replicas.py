"""A deployment's replicas: the engines that serve it, each a ``deployments`` row of its own.

The deployment's own row is replica 0. Replica ``i`` > 0 is a row that names the deployment in
``replica_of``, with its name, spec and capture: the scheduler places it, a worker claims, runs,
health-checks and restarts it, and the reconciler reaps it, exactly as a deployment (there is no
second machinery). ``scale`` keeps one active row per index below ``spec["replicas"]``: it
creates the missing ones (a replica that failed for good is replaced by a new row of its index)
and stops those past the count. Promotions are asked of every replica
(``app.services.promotions``); the gateway balances over the ready ones
(``app.services.gateway``); their live acceptance points add up in the deployment's series.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.db.models import Deployment
from app.errors import APIError
from app.services import state
from app.services.state import DeploymentStatus

# The statuses of a replica that serves or is on its way to.
RUNNING = [s.value for s in (DeploymentStatus.PENDING, DeploymentStatus.STARTING,
                             DeploymentStatus.READY)]


def replica_rows(deployment: Deployment) -> list[Deployment]:
    """The rows of its replicas past 0, the newest of each index, stopped ones left out."""
    newest = {row.replica: row for row in deployment.replica_set}
    return [row for _, row in sorted(newest.items())
            if row.status != DeploymentStatus.STOPPED.value]


def all_rows(deployment: Deployment) -> list[Deployment]:
    """Replica 0 (the deployment's row) and the rows of its other replicas."""
    return [deployment, *replica_rows(deployment)]


def stop(session: Session, row: Deployment, reason: str) -> None:
    """Pending: stopped at once. Starting or ready: stopping, then stopped by its worker."""
    current = DeploymentStatus(row.status)
    if current == DeploymentStatus.PENDING:
        state.transition(session, row, DeploymentStatus.STOPPED, reason=reason)
    elif current in (DeploymentStatus.STARTING, DeploymentStatus.READY):
        state.transition(session, row, DeploymentStatus.STOPPING, reason=reason)


def failed(session: Session, row: Deployment) -> None:
    """A row that failed for good. The deployment's own row (replica 0) carries its identity and
    cannot be replaced, so the deployment has failed: its other replicas stop too, rather than
    serve on behind a deployment that reads ``failed`` and can no longer be scaled. A replica
    past 0 that fails is replaced by the next scaling."""
    if row.replica_of is None:
        for replica in replica_rows(row):
            stop(session, replica, f"deployment {row.id} failed: {row.status_reason}")


def scale(session: Session, deployment: Deployment, replicas: int) -> None:
    """Make ``replicas`` the deployment's count: new rows for the missing indices (placed by the
    caller's ``schedule``), the ones past the count stopped. The caller holds the project's
    lock, so two scalings of one deployment do not both add a replica."""
    if deployment.status not in RUNNING:
        raise APIError(409, f"deployment {deployment.id} is {deployment.status}; only a pending, "
                       "starting or ready deployment is scaled", code="deployment_not_serving")
    deployment.spec = {**deployment.spec, "replicas": replicas}
    running = {row.replica: row for row in replica_rows(deployment) if row.status in RUNNING}
    for index, row in running.items():
        if index >= replicas:
            stop(session, row, f"scaled down to {replicas} replicas")
    for index in range(1, replicas):
        if index not in running:
            replica = Deployment(project_id=deployment.project_id, name=deployment.name,
                                 spec=deployment.spec, replica_of=deployment.id, replica=index,
                                 capture_dataset_id=deployment.capture_dataset_id)
            state.initialize(session, replica, f"replica {index} of deployment {deployment.id} "
                             "created")
    session.expire(deployment, ["replica_set"])
    for row in replica_rows(deployment):  # each row carries the count, as its spec does
        if row.spec.get("replicas") != replicas:
            row.spec = {**row.spec, "replicas": replicas}
