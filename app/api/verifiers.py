"""/api/verifiers: what a verifier is, as job creation reads it, without creating a job."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from app.api.deps import CurrentKey, SettingsDep
from app.errors import error_responses
from app.schemas.verifiers import VerifierInspect, VerifierList, VerifierOut
from app.services import verifier as service
from app.services.hub import fetch_configs

router = APIRouter(prefix="/api/verifiers", tags=["verifiers"],
                   responses=error_responses(401, 403, 422, 503))


@router.get("", response_model=VerifierList)
async def list_verifiers(_: CurrentKey, settings: SettingsDep) -> VerifierList:
    """The models under the models root that a job can name as its verifier (by the name
    shown), as ``POST /api/verifiers/inspect`` reads each; a Hub id is not listed, and works
    as well."""
    return VerifierList(data=await run_in_threadpool(service.local_verifiers, settings))


@router.post("/inspect", response_model=VerifierOut, responses=error_responses(400, 413))
async def inspect_verifier(body: VerifierInspect, _: CurrentKey,
                           settings: SettingsDep) -> VerifierOut:
    """The verifier's config.json as ``POST /api/jobs`` reads it (a Hub id or a directory under
    the models root), with the same errors: 422 for a reference that names no usable model, 503
    with Retry-After when the Hub cannot be reached. Nothing is created."""
    hub = await fetch_configs({"verifier": body.verifier}, settings)
    return await run_in_threadpool(service.inspect_verifier, body.verifier, settings=settings,
                                   hub=hub)
