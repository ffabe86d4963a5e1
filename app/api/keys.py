"""/api/keys: the project's API keys. A key is shown once, when it is created; after that only
its prefix. Keys are stored hashed, and neither form of a key is written to a log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from app.api.deps import AdminKey, SessionDep, SettingsDep
from app.api.links import links
from app.errors import error_responses
from app.schemas.common import Page
from app.schemas.keys import KeyCreate, KeyCreated, KeyOut
from app.services import keys as service

router = APIRouter(prefix="/api/keys", tags=["keys"],
                   responses=error_responses(401, 403, 422, 503))

KEY_ID = r"^key_[0-9a-f]{24}$"
KeyId = Annotated[str, Path(pattern=KEY_ID)]


@router.post("", status_code=201, response_model=KeyCreated, responses={
    201: links("key_id", ("delete", "/api/keys/{key_id}")), **error_responses(400, 413, 429)})
def create_key(body: KeyCreate, key: AdminKey, session: SessionDep, settings: SettingsDep,
               response: Response) -> KeyCreated:
    """A new key in the caller's project. Its plaintext (``key``) is in this answer only:
    store it now, it cannot be shown again. A project holds at most
    ``SPECDECK_QUOTA_API_KEYS`` keys not revoked (429 ``quota_exceeded``). Its ``role`` is at
    most the caller's (admin keys manage keys)."""
    new = service.mint_key(session, key, body.name, body.role, settings)
    response.headers["Cache-Control"] = "no-store"
    return KeyCreated(**service.key_out(new.key).model_dump(), key=new.plaintext)


@router.get("", response_model=Page[KeyOut])
def list_keys(key: AdminKey, session: SessionDep,
              limit: Annotated[int, Query(ge=1, le=100)] = 20,
              after: Annotated[str | None, Query(pattern=KEY_ID)] = None) -> Page[KeyOut]:
    """The project's keys, revoked ones too, newest first; pass ``last_id`` back as ``after``."""
    keys, has_more = service.list_keys(session, key.project_id, limit=limit, after=after)
    return Page(data=[service.key_out(k) for k in keys], has_more=has_more,
                last_id=keys[-1].id if keys else None)


@router.delete("/{key_id}", response_model=KeyOut, responses=error_responses(404, 409))
def revoke_key(key_id: KeyId, key: AdminKey, session: SessionDep) -> KeyOut:
    """Revoke a key of the caller's project (the one making this request too): from the
    moment this answers, /api refuses it with 401. The gateway (/v1) caches what a key is for
    ``SPECDECK_GATEWAY_AUTH_CACHE_SECONDS`` (default 5) in each API process, so it may still
    serve a revoked key for up to that long. Revoking a revoked key changes nothing. A project
    keeps at least one admin key: revoking its last active one answers 409 ``last_key``."""
    return service.key_out(service.revoke_key(session, key.project_id, key_id))
