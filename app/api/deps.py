"""Request dependencies: the database session (commit in one place) and the caller's project."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.db import session_scope
from app.db.models import ApiKey
from app.errors import APIError
from app.services.keys import authenticate, has_role
from app.settings import Settings, get_settings


def get_db() -> Iterator[Session]:
    """The request's unit of work: committed when the route returns, rolled back if it raises."""
    with session_scope() as session:
        yield session


# scope="function": commit before the response is sent (the default "request" scope runs the
# cleanup afterwards, so a client could get 201 for a row that never committed).
SessionDep = Annotated[Session, Depends(get_db, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]


# The scheme, for the OpenAPI document (and its clients); the key is read and checked below and
# by the gateway, which answer 401 in the one error shape.
bearer = HTTPBearer(auto_error=False, description="An API key: `specdeck admin keys create` (a "
                    "project's first key), then `specdeck keys create` or POST /api/keys")
BearerScheme = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]


def current_key(request: Request, session: SessionDep, _: BearerScheme) -> ApiKey:
    header = request.headers.get("authorization")
    if not header:
        raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'",
                       code="missing_api_key", headers={"WWW-Authenticate": "Bearer"})
    scheme, _, token = header.partition(" ")
    key = authenticate(session, token.strip()) if scheme.lower() == "bearer" and token else None
    if key is None:
        raise APIError(401, "Invalid API key", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    # End the read: the connection goes back to the pool, so a route that waits on something
    # else first (the Hugging Face Hub) holds none meanwhile. The route's work begins anew.
    session.commit()
    return key


def member_key(key: Annotated[ApiKey, Depends(current_key)]) -> ApiKey:
    """Every /api route takes a member key at least: an inference key is for /v1 alone."""
    if not has_role(key, "member"):
        raise APIError(403, "This key is inference-only: it works on the OpenAI-compatible /v1, "
                       "not on /api", code="key_role")
    return key


def admin_key(key: Annotated[ApiKey, Depends(member_key)]) -> ApiKey:
    """API keys, secrets and webhooks take an admin key."""
    if not has_role(key, "admin"):
        raise APIError(403, f"This key's role is '{key.role}': API keys, secrets and webhooks "
                       "need an admin key", code="key_role")
    return key


CurrentKey = Annotated[ApiKey, Depends(member_key)]
AdminKey = Annotated[ApiKey, Depends(admin_key)]
