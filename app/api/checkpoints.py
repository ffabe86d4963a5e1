"""/api/checkpoints: a checkpoint, and publishing it to the Hugging Face Hub."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.errors import error_responses
from app.schemas.jobs import CheckpointOut, PublishRequest
from app.services import checkpoints as service

router = APIRouter(prefix="/api/checkpoints", tags=["checkpoints"],
                   responses=error_responses(401, 403, 422, 503))


@router.get("/{checkpoint_id}", response_model=CheckpointOut, responses=error_responses(404))
def get_checkpoint(checkpoint_id: str, key: CurrentKey, session: SessionDep) -> CheckpointOut:
    return CheckpointOut.model_validate(
        service.get_checkpoint(session, key.project_id, checkpoint_id), from_attributes=True)


@router.post("/{checkpoint_id}/publish", status_code=202, response_model=CheckpointOut,
             responses=error_responses(400, 404, 409, 413))
def publish_checkpoint(checkpoint_id: str, body: PublishRequest, key: CurrentKey,
                       session: SessionDep, settings: SettingsDep) -> CheckpointOut:
    """Accepted: the worker holding the files uploads them; poll the checkpoint for the result."""
    checkpoint = service.request_publish(session, key.project_id, checkpoint_id, body, settings)
    return CheckpointOut.model_validate(checkpoint, from_attributes=True)
