"""/api/datasets: thin routes over app.services.datasets.

``POST /api/datasets`` takes either ``multipart/form-data`` (a JSONL ``file`` and an optional
``name``) or ``application/json`` (``{"public": "sharegpt", "name": ...}``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.api.links import links
from app.errors import APIError, echo, error_responses
from app.schemas.common import Page, inline_schema, text_problem
from app.schemas.datasets import NAME_MAX, DatasetOut, DatasetPreview, PublicDatasetCreate
from app.services import dataset_preview
from app.services import datasets as service

router = APIRouter(prefix="/api/datasets", tags=["datasets"],
                   responses=error_responses(401, 403, 422, 503))

DATASET_ID = service.DATASET_ID.pattern
Limit = Annotated[int, Query(ge=1, le=100)]
JSON_BODY_MAX = 64 * 1024

# What _upload_fields accepts as the upload's name: not blank, and storable text.
UPLOAD_NAME = re.compile(r"^[^\x00]*[^\s\x00][^\x00]*$")
_REQUEST_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "additionalProperties": False,
        "properties": {"file": {"type": "string", "format": "binary",
                                "description": "JSONL: one {\"messages\": [...]} (OpenAI) or "
                                               "{\"conversations\": [...]} (ShareGPT) per line"},
                       "name": {"type": "string", "maxLength": NAME_MAX,
                                "pattern": UPLOAD_NAME.pattern}}}},
    "application/json": {"schema": inline_schema(PublicDatasetCreate)},
}}}


_LINKS = links("dataset_id", ("get", "/api/datasets/{dataset_id}"),
               ("delete", "/api/datasets/{dataset_id}"))
_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: _LINKS,
    200: {"model": DatasetOut, "description": "The same upload, or the same public dataset, "
          "again: the dataset made before", **_LINKS},
    **error_responses(400, 413, 415, 429),
}


@router.post("", status_code=201, response_model=DatasetOut, responses=_RESPONSES,
             openapi_extra=_REQUEST_BODY)
async def create_dataset(request: Request, key: CurrentKey, session: SessionDep,
                         settings: SettingsDep, response: Response) -> Any:
    """Upload a JSONL file (validated line by line; the same content again returns the same
    dataset with 200), or register a public dataset by name."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=2) as form:
            upload, name = _upload_fields(form.multi_items())
            try:
                dataset, created = await run_in_threadpool(
                    service.create_upload, session, key.project_id, upload.file,
                    filename=upload.filename, name=name, settings=settings)
            except service.InvalidDataset as exc:
                return exc.response()
    elif content_type == "application/json" or content_type.endswith("+json"):
        body = _public_body(await _read_capped(request, JSON_BODY_MAX))
        dataset, created = await run_in_threadpool(
            service.create_public, session, key.project_id, body.public, body.name)
    else:
        raise APIError(415, "send multipart/form-data with a 'file' field, or application/json "
                       "with 'public'", code="unsupported_media_type")
    if not created:
        response.status_code = 200
    return service.dataset_out(dataset)


@router.get("", response_model=Page[DatasetOut])
def list_datasets(key: CurrentKey, session: SessionDep, limit: Limit = 20,
                  after: Annotated[str | None, Query(pattern=DATASET_ID)] = None,
                  ) -> Page[DatasetOut]:
    rows, has_more = service.list_datasets(session, key.project_id, limit=limit, after=after)
    return Page(data=[service.dataset_out(d) for d in rows], has_more=has_more,
                last_id=rows[-1].id if rows else None)


@router.get("/{dataset_id}", response_model=DatasetOut, responses=error_responses(404))
def get_dataset(dataset_id: str, key: CurrentKey, session: SessionDep) -> DatasetOut:
    return service.dataset_out(service.get_dataset(session, key.project_id, dataset_id))


@router.get("/{dataset_id}/rows", response_model=DatasetPreview,
            responses=error_responses(404, 409))
def preview_rows(dataset_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep,
                 offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                 limit: Annotated[int, Query(ge=1, le=50)] = 5) -> DatasetPreview:
    """A page of the dataset's rows as a reader sees them: each turn's role and text (cut to
    2,000 characters). Uploads and captures; a public preset answers 409 (``no_preview``): the
    worker downloads it when a job trains on it."""
    dataset = service.get_dataset(session, key.project_id, dataset_id)
    return dataset_preview.preview(session, dataset, settings, offset=offset, limit=limit)


@router.delete("/{dataset_id}", status_code=204, response_class=Response,
               responses=error_responses(404, 409))
def delete_dataset(dataset_id: str, key: CurrentKey, session: SessionDep) -> Response:
    service.delete_dataset(session, key.project_id, dataset_id)
    return Response(status_code=204)


def _upload_fields(items: list[tuple[str, UploadFile | str]]) -> tuple[UploadFile, str | None]:
    upload: UploadFile | None = None
    name: str | None = None
    for field, value in items:
        if field == "file":
            if not isinstance(value, UploadFile):
                raise APIError(422, "file must be a file upload", code="invalid_value",
                               param="file")
            upload = value
        elif field == "name":
            if not isinstance(value, str) or len(value) > NAME_MAX:
                raise APIError(422, f"name must be 1-{NAME_MAX} characters", code="invalid_value",
                               param="name")
            problem = text_problem(value)
            if problem:
                raise APIError(422, f"name {problem}", code="invalid_value", param="name")
            if not UPLOAD_NAME.fullmatch(value):
                raise APIError(422, "name must not be blank", code="invalid_value", param="name")
            name = value
        else:
            raise APIError(422, f"Unknown field '{echo(field)}'", code="unknown_field",
                           param=field)
    if upload is None:
        raise APIError(422, "Missing required field 'file'", code="missing_field", param="file")
    return upload, name


async def _read_capped(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"Request body is larger than {limit} bytes",
                           code="request_too_large")
    return bytes(body)


def _public_body(raw: bytes) -> PublicDatasetCreate:
    try:
        return PublicDatasetCreate.model_validate_json(raw)
    except ValidationError as exc:
        # The app's validation handler turns this into the one error shape.
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]) from exc
