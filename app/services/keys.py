"""Projects and API keys. Keys are stored as SHA-256 hashes; the plaintext is shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Project

KEY_PREFIX = "sdk-"
VISIBLE_CHARS = 12


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


def create_key(session: Session, project_name: str, name: str = "") -> NewKey:
    project = get_or_create_project(session, project_name)
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(project_id=project.id, name=name, prefix=plaintext[:VISIBLE_CHARS],
                 key_hash=hash_key(plaintext))
    session.add(key)
    session.flush()
    return NewKey(key=key, plaintext=plaintext)


def authenticate(session: Session, plaintext: str) -> ApiKey | None:
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext))).first()
    if key is None or key.revoked_at is not None:
        return None
    return key
