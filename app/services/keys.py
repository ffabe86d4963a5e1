"""Projects and API keys. Keys are stored as SHA-256 hashes; the plaintext is shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Project, utcnow
from app.errors import APIError, not_found
from app.roles import ROLES
from app.schemas.keys import KeyOut
from app.services import limits, quotas
from app.settings import Settings, get_settings

KEY_PREFIX = "sdk-"
VISIBLE_CHARS = 12
# How stale a key's last_used_at may get before a request through /api writes it again: one
# write a minute per busy key, not one per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    key: ApiKey
    plaintext: str


def get_or_create_project(session: Session, name: str) -> Project:
    project = session.scalars(select(Project).where(Project.name == name)).first()
    if project is None:
        project = Project(name=name)
        session.add(project)
        session.flush()
    return project


def get_project(session: Session, project_id: str) -> Project:
    """The project of a key that was just authenticated."""
    project = session.get(Project, project_id)
    if project is None:  # deleted since: its keys went with it (ON DELETE CASCADE)
        raise APIError(401, "Invalid API key", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    return project


def create_key(session: Session, project_name: str, name: str = "",
               role: str = "admin") -> NewKey:
    """A key for the project of that name (created if need be): ``specdeck admin keys create``."""
    return add_key(session, get_or_create_project(session, project_name).id, name, role)


def has_role(key: ApiKey, role: str) -> bool:
    """Whether ``key`` may do what ``role`` may."""
    return ROLES.index(key.role) >= ROLES.index(role)


def add_key(session: Session, project_id: str, name: str = "", role: str = "admin") -> NewKey:
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(project_id=project_id, name=name, role=role, prefix=plaintext[:VISIBLE_CHARS],
                 key_hash=hash_key(plaintext))
    session.add(key)
    session.flush()
    return NewKey(key=key, plaintext=plaintext)


def mint_key(session: Session, creator: ApiKey, name: str, role: str | None,
             settings: Settings) -> NewKey:
    """A key made through the API (POST /api/keys), within the project's quota of keys, with
    at most the role of the key that makes it (403 ``role_too_high``)."""
    role = role or creator.role
    if not has_role(creator, role):
        raise APIError(403, f"A key can't grant more than it has: this key is '{creator.role}', "
                       f"so it can't make an '{role}' key", code="role_too_high", param="role")
    project_id = creator.project_id
    new = add_key(session, project_id, name, role)
    quotas.check_api_keys(session, project_id, settings)
    return new


def authenticate(session: Session, plaintext: str) -> ApiKey | None:
    """The active key of that plaintext, its last use brought up to date (to the minute)."""
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext))).first()
    if key is None or key.revoked_at is not None:
        return None
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        # Never backwards: the gateway's usage batches write it too, with their own times.
        session.execute(update(ApiKey).where(
            ApiKey.id == key.id, (ApiKey.last_used_at.is_(None)) | (ApiKey.last_used_at < now))
            .values(last_used_at=now))
        key.last_used_at = now
    return key


def list_keys(session: Session, project_id: str, *, limit: int,
              after: str | None) -> tuple[list[ApiKey], bool]:
    """The project's keys, revoked ones too, newest first."""
    query = select(ApiKey).where(ApiKey.project_id == project_id)
    if after is not None:
        query = query.where(ApiKey.id < after)
    rows = list(session.scalars(query.order_by(ApiKey.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def revoke_key(session: Session, project_id: str, key_id: str) -> ApiKey:
    """Revoked at once for /api, and for /v1 once committed (announced to every API process:
    app.services.limits); idempotent (a revoked key keeps its first revoked_at). A project keeps
    at least one admin key: its last active one is refused (409 ``last_key``). The project's row
    is locked first, so two requests cannot revoke its last two keys together."""
    quotas.lock_project(session, project_id)
    key = session.scalars(select(ApiKey).where(ApiKey.id == key_id, ApiKey.project_id == project_id)
                          .with_for_update()).first()
    if key is None:
        raise not_found("API key", key_id, param="key_id")
    if key.revoked_at is None:
        others = key.role != "admin" or session.scalar(select(func.count()).select_from(ApiKey)
                                                       .where(ApiKey.project_id == project_id,
                                                              ApiKey.role == "admin",
                                                              ApiKey.revoked_at.is_(None),
                                                              ApiKey.id != key.id))
        if not others:
            raise APIError(409, "This is the project's last active admin key, and a project "
                           "keeps at least one: create another admin key (POST /api/keys), then "
                           "revoke this one", code="last_key", param="key_id")
        key.revoked_at = utcnow()
        session.flush()
        key_hash, settings = key.key_hash, get_settings()
        event.listen(session, "after_commit",
                     lambda _: limits.announce_revoked(settings, key_hash), once=True)
    return key


def key_out(key: ApiKey) -> KeyOut:
    return KeyOut.model_validate(key, from_attributes=True)
