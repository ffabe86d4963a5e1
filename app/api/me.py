"""/api/me: who the caller is (the project and the key of this request), for a sign-in page."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import CurrentKey, SessionDep
from app.errors import error_responses
from app.schemas.identity import IdentityOut, ProjectRef
from app.services import keys as service

router = APIRouter(prefix="/api/me", tags=["keys"], responses=error_responses(401, 403, 503))


@router.get("", response_model=IdentityOut)
def get_identity(key: CurrentKey, session: SessionDep) -> IdentityOut:
    """The caller's project and the key making this request (its prefix, never the key)."""
    project = service.get_project(session, key.project_id)
    return IdentityOut(project=ProjectRef(id=project.id, name=project.name),
                       key=service.key_out(key))
