"""Per-project quotas: active jobs, active deployments, the bytes of uploaded datasets, API
keys not revoked and webhook endpoints, each a setting (0: no limit). Going past one answers 429 ``quota_exceeded``, naming the usage, the
limit and the setting; the request's transaction rolls back, so nothing is created.

Each check locks the project's row until the transaction ends, so two requests of one project
cannot both pass it past the limit. The lock is FOR NO KEY UPDATE: the KEY SHARE lock that
inserting a row of the project takes (its foreign key) does not wait for it, nor it for that.
SQLite has no row locks: there the same statement takes the database's write lock (``BEGIN
IMMEDIATE``, ``app.db``) until the transaction ends, so every other write waits for it.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Dataset, Deployment, Job, Project, Webhook
from app.errors import APIError
from app.services.state import MACHINES
from app.settings import Settings

# What each quota on active rows counts: its setting, what it counts, and how to free some.
ACTIVE = {
    Job: ("quota_active_jobs", "active jobs (queued, running or cancelling)",
          "cancel one or wait for one to end"),
    Deployment: ("quota_active_deployments", "active deployments (not stopped or failed)",
                 "delete one"),
}


def check_active(session: Session, new: Job | Deployment, settings: Settings) -> None:
    """Refuse ``new``, added and flushed (so it is counted), when it takes its project past its
    quota of active jobs or deployments. The project stays locked until the commit."""
    model = type(new)
    setting, what, free = ACTIVE[model]
    limit = getattr(settings, setting)
    if not limit:
        return
    lock_project(session, new.project_id)
    terminal = [status.value for status in MACHINES[model].terminal]
    query = select(func.count()).select_from(model).where(
        model.project_id == new.project_id, model.status.not_in(terminal))
    if model is Deployment:  # a deployment counts once, however many replicas it has
        query = query.where(Deployment.replica_of.is_(None))
    active = session.scalar(query)
    if active > limit:
        raise _exceeded(f"this project already has {active - 1} {what} and its quota is "
                        f"{limit}: {free}, or raise {_env(setting)}")


def check_dataset_bytes(session: Session, project_id: str, adding: int,
                        settings: Settings) -> None:
    """Refuse an upload of ``adding`` bytes, not stored yet, that takes its project past its
    quota of dataset bytes. The project stays locked until the commit."""
    limit = settings.quota_dataset_bytes
    if not limit:
        return
    lock_project(session, project_id)
    used = session.scalar(select(func.coalesce(func.sum(Dataset.num_bytes), 0)).where(
        Dataset.project_id == project_id, Dataset.kind == "upload"))
    if used + adding > limit:
        raise _exceeded(f"this project's datasets hold {used} bytes and its quota is {limit} "
                        f"bytes: this upload of {adding} bytes does not fit; delete a dataset, "
                        f"or raise {_env('quota_dataset_bytes')}", param="file")


def check_api_keys(session: Session, project_id: str, settings: Settings) -> None:
    """Refuse a new key, added and flushed (so it is counted), that takes its project past its
    quota of keys not revoked. The project stays locked until the commit."""
    limit = settings.quota_api_keys
    if not limit:
        return
    lock_project(session, project_id)
    active = session.scalar(select(func.count()).select_from(ApiKey).where(
        ApiKey.project_id == project_id, ApiKey.revoked_at.is_(None)))
    if active > limit:
        raise _exceeded(f"this project already has {active - 1} API keys not revoked and its "
                        f"quota is {limit}: revoke one, or raise {_env('quota_api_keys')}")


def check_webhooks(session: Session, project_id: str, settings: Settings) -> None:
    """Refuse one more webhook endpoint past the project's quota. The project stays locked
    until the commit."""
    limit = settings.quota_webhooks
    if not limit:
        return
    lock_project(session, project_id)
    count = session.scalar(select(func.count()).select_from(Webhook)
                           .where(Webhook.project_id == project_id))
    if count >= limit:
        raise _exceeded(f"this project already has {count} webhook endpoints and its quota is "
                        f"{limit}: delete one, or raise {_env('quota_webhooks')}")


def lock_project(session: Session, project_id: str) -> None:
    session.execute(select(Project.id).where(Project.id == project_id)
                    .with_for_update(key_share=True))


def _env(setting: str) -> str:
    return f"SPECDECK_{setting.upper()}"


def _exceeded(message: str, param: str | None = None) -> APIError:
    return APIError(429, f"Quota exceeded: {message}", code="quota_exceeded", param=param)
