"""/api/secrets: write-only project secrets (values are never returned)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.schemas.common import Page
from app.schemas.secrets import SecretOut, SecretPut
from app.services import secrets as service

router = APIRouter(prefix="/api/secrets", tags=["secrets"])


@router.put("/{name}", response_model=SecretOut)
def put_secret(name: str, body: SecretPut, key: CurrentKey, session: SessionDep,
               settings: SettingsDep) -> SecretOut:
    secret = service.put_secret(session, key.project_id, name, body.value, settings)
    return SecretOut.model_validate(secret, from_attributes=True)


@router.get("", response_model=Page[SecretOut])
def list_secrets(key: CurrentKey, session: SessionDep) -> Page[SecretOut]:
    secrets = service.list_secrets(session, key.project_id)
    return Page(data=[SecretOut.model_validate(s, from_attributes=True) for s in secrets],
                has_more=False, last_id=None)


@router.delete("/{name}", status_code=204)
def delete_secret(name: str, key: CurrentKey, session: SessionDep) -> Response:
    service.delete_secret(session, key.project_id, name)
    return Response(status_code=204)
