"""/api/secrets: write-only project secrets (values are never returned)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from app.api.deps import AdminKey, SessionDep, SettingsDep
from app.api.links import links
from app.errors import error_responses
from app.schemas.common import Page
from app.schemas.secrets import SecretOut, SecretPut
from app.services import secrets as service

router = APIRouter(prefix="/api/secrets", tags=["secrets"],
                   responses=error_responses(401, 403, 503))

# Checked by the service (with a message that says what a name may hold); declared here.
Name = Annotated[str, Path(json_schema_extra={"pattern": service.NAME.pattern})]


@router.put("/{name}", response_model=SecretOut, responses={
    200: links("name", ("delete", "/api/secrets/{name}"), field="name"),
    **error_responses(400, 413, 422)})
def put_secret(name: Name, body: SecretPut, key: AdminKey, session: SessionDep,
               settings: SettingsDep) -> SecretOut:
    secret = service.put_secret(session, key.project_id, name, body.value, settings)
    return SecretOut.model_validate(secret, from_attributes=True)


@router.get("", response_model=Page[SecretOut])
def list_secrets(key: AdminKey, session: SessionDep) -> Page[SecretOut]:
    secrets = service.list_secrets(session, key.project_id)
    return Page(data=[SecretOut.model_validate(s, from_attributes=True) for s in secrets],
                has_more=False, last_id=None)


@router.delete("/{name}", status_code=204, response_class=Response,
               responses=error_responses(404, 422))
def delete_secret(name: Name, key: AdminKey, session: SessionDep) -> Response:
    service.delete_secret(session, key.project_id, name)
    return Response(status_code=204)
