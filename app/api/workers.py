"""/api/workers: the registered GPU workers."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.errors import error_responses
from app.schemas.common import Page
from app.schemas.workers import WorkerOut
from app.services import workers as service

router = APIRouter(prefix="/api/workers", tags=["workers"],
                   responses=error_responses(401, 403, 503))


@router.get("", response_model=Page[WorkerOut])
def list_workers(key: CurrentKey, session: SessionDep, settings: SettingsDep) -> Page[WorkerOut]:
    workers = service.list_workers(session, settings.reconcile_seconds, key.project_id)
    return Page(data=workers, has_more=False, last_id=None)
