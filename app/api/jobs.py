"""/api/jobs: thin routes over app.services.jobs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from app.api.deps import CurrentKey, SessionDep, SettingsDep
from app.api.links import links
from app.db import get_sessionmaker
from app.errors import error_responses
from app.logtail import read_after, tail_lines
from app.schemas.common import BIGINT_MAX, Page
from app.schemas.jobs import CheckpointOut, EventOut, JobCreate, JobOut, MetricOut, PlanOut
from app.services import jobs as service
from app.services.hub import fetch_configs
from app.services.state import TERMINAL, JobStatus

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=error_responses(401, 403, 422, 503))

JOB_ID = r"^job_[0-9a-f]{24}$"
Limit = Annotated[int, Query(ge=1, le=100)]
_JOB_LINKS = links("job_id", *(("get", f"/api/jobs/{{job_id}}{tail}") for tail in (
    "", "/events", "/events/stream", "/metrics", "/checkpoints", "/logs", "/logs/stream",
    "/plan")),
    ("post", "/api/jobs/{job_id}/cancel"))
# A create that may be a replay: 201 with the new job, or 200 with the one this Idempotency-Key
# and request created before (``replayed``).
REPLAYED: dict[str, Any] = {
    "model": JobOut, "description": "A replay: the job that this Idempotency-Key and request "
    "created before", "headers": {"Idempotent-Replayed": {
        "description": "Always \"true\"", "schema": {"type": "string", "enum": ["true"]}}},
    **_JOB_LINKS}
_CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: _JOB_LINKS, 200: REPLAYED, **error_responses(400, 413, 429)}
IdempotencyKey = Annotated[str | None, Header(max_length=255)]


def replayed(response: Response) -> None:
    response.status_code = 200
    response.headers["Idempotent-Replayed"] = "true"


@router.post("", status_code=201, response_model=JobOut, responses=_CREATE_RESPONSES)
async def create_job(body: JobCreate, key: CurrentKey, session: SessionDep,
                     settings: SettingsDep, response: Response,
                     idempotency_key: IdempotencyKey = None) -> JobOut:
    hub = await fetch_configs({"verifier": body.verifier}, settings)  # before the unit of work
    job, created = await run_in_threadpool(
        service.create_job, session, key.project_id, body, settings=settings, hub=hub,
        idempotency_key=idempotency_key)
    if not created:
        replayed(response)
    outs = await run_in_threadpool(service.job_outs, session, [job])  # a replay has progress
    return outs[0]


@router.post("/plan", response_model=PlanOut, responses=error_responses(400, 413))
async def plan_job(body: JobCreate, key: CurrentKey, session: SessionDep,
                   settings: SettingsDep) -> PlanOut:
    """A dry run: the plan that ``GET /api/jobs/{id}/plan`` would show for the job this body
    creates (the same checks and errors as ``POST /api/jobs``, the same builder), with nothing
    written: no job, no event, no quota used. Its paths hold ``<job_id>`` and its GPUs are the
    default placement, since the scheduler places a job only once it is created."""
    hub = await fetch_configs({"verifier": body.verifier}, settings)  # before the unit of work
    return PlanOut.model_validate(await run_in_threadpool(
        service.dry_run_plan, session, key.project_id, body, settings=settings, hub=hub))


@router.get("", response_model=Page[JobOut])
def list_jobs(key: CurrentKey, session: SessionDep, limit: Limit = 20,
              after: Annotated[str | None, Query(pattern=JOB_ID)] = None,
              status: JobStatus | None = None,
              name: Annotated[str | None, Query(max_length=100, pattern=r"^[^\x00]*$",
                                                description="Jobs whose name holds this text, "
                                                "whatever the case")] = None) -> Page[JobOut]:
    jobs, has_more = service.list_jobs(session, key.project_id, limit=limit, after=after,
                                       status=status, name=name)
    return Page(data=service.job_outs(session, jobs), has_more=has_more,
                last_id=jobs[-1].id if jobs else None)


@router.get("/{job_id}", response_model=JobOut, responses=error_responses(404))
def get_job(job_id: str, key: CurrentKey, session: SessionDep) -> JobOut:
    return service.job_outs(session, [service.get_job(session, key.project_id, job_id)])[0]


@router.post("/{job_id}/cancel", response_model=JobOut, responses=error_responses(404, 409))
def cancel_job(job_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep) -> JobOut:
    job = service.cancel_job(session, key.project_id, job_id, settings)
    return service.job_outs(session, [job])[0]


@router.get("/{job_id}/events", response_model=Page[EventOut],
            responses=error_responses(404))
def list_events(job_id: str, key: CurrentKey, session: SessionDep, limit: Limit = 100,
                after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None) -> Page[EventOut]:
    job = service.get_job(session, key.project_id, job_id)
    events, has_more = service.list_events(session, job, after=after, limit=limit)
    return Page(data=[EventOut.model_validate(e, from_attributes=True) for e in events],
                has_more=has_more, last_id=events[-1].id if events else None)


_JSON_OF = {"type": "string", "contentMediaType": "application/json"}
_STREAM_EVENTS = {"oneOf": [  # what _follow sends (its keep-alive comments are no events)
    {"type": "object", "required": ["id", "event", "data"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"const": "job.event"},
        "data": {**_JSON_OF, "contentSchema": {"$ref": "#/components/schemas/EventOut"}}}},
    {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": "end"}, "data": {**_JSON_OF, "contentSchema": {"const": {}}}}},
]}


@router.get("/{job_id}/events/stream", response_class=StreamingResponse, responses={
    200: {"description": "Server-sent events: one ``job.event`` per event (an EventOut), then "
          "``end`` once the job has ended",
          "content": {"text/event-stream": {"itemSchema": _STREAM_EVENTS}}},
    **error_responses(404)})
def stream_events(job_id: str, key: CurrentKey, session: SessionDep, request: Request,
                  last_event_id: Annotated[int | None, Header(ge=0, le=BIGINT_MAX)] = None
                  ) -> StreamingResponse:
    """Server-Sent Events: every event from ``Last-Event-ID`` on, until the job ends."""
    job = service.get_job(session, key.project_id, job_id)
    session.close()  # the stream opens short sessions of its own; hold no connection meanwhile
    return StreamingResponse(_follow(job.id, key.project_id, last_event_id, request),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _follow(job_id: str, project_id: str, after: int | None,
                  request: Request) -> AsyncIterator[str]:
    poll = 0.25
    while not await request.is_disconnected():
        events, done = await asyncio.to_thread(_poll_events, job_id, project_id, after)
        for event in events:
            after = event.id
            payload = EventOut.model_validate(event, from_attributes=True).model_dump_json()
            yield f"id: {event.id}\nevent: job.event\ndata: {payload}\n\n"
        if done and not events:
            yield "event: end\ndata: {}\n\n"
            return
        if not events:
            yield ": keep-alive\n\n"
            await asyncio.sleep(poll)


def _poll_events(job_id: str, project_id: str, after: int | None) -> tuple[list, bool]:
    with get_sessionmaker()() as session:
        job = service.get_job(session, project_id, job_id)
        events, _ = service.list_events(session, job, after=after, limit=500)
        return events, JobStatus(job.status) in TERMINAL


@router.get("/{job_id}/metrics", response_model=Page[MetricOut],
            responses=error_responses(404))
def list_metrics(job_id: str, key: CurrentKey, session: SessionDep,
                 name: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$")] = None,
                 after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None
                 ) -> Page[MetricOut]:
    """The job's metrics, oldest first; with ``after`` (the ``last_id`` of a previous page, 0
    while there were none), only those recorded since, so that a live page fetches what is
    new."""
    job = service.get_job(session, key.project_id, job_id)
    metrics = service.list_metrics(session, job, name=name, after=after)
    return Page(data=[MetricOut.model_validate(m, from_attributes=True) for m in metrics],
                has_more=False, last_id=metrics[-1].id if metrics else after or 0)


@router.get("/{job_id}/checkpoints", response_model=Page[CheckpointOut],
            responses=error_responses(404))
def list_checkpoints(job_id: str, key: CurrentKey, session: SessionDep) -> Page[CheckpointOut]:
    job = service.get_job(session, key.project_id, job_id)
    checkpoints = service.list_checkpoints(session, job)
    return Page(data=[CheckpointOut.model_validate(c, from_attributes=True) for c in checkpoints],
                has_more=False, last_id=checkpoints[-1].id if checkpoints else None)


# response_class Response: the errors are JSON (a PlainTextResponse class would declare them
# text/plain); the log itself is declared here and returned as a PlainTextResponse.
_LOG_HEADERS = {
    "X-Log-Offset": {"description": "Where the lines returned end in the log: the `after` of "
                     "the next request", "schema": {"type": "integer"}},
    "X-Log-Ended": {"description": "\"true\" once the job has ended: no line is added after "
                    "the ones it has", "schema": {"type": "string", "enum": ["true", "false"]}}}


@router.get("/{job_id}/logs", response_class=Response, responses={
    200: {"description": "The log's last lines, or the lines written after `after`",
          "content": {"text/plain": {"schema": {"type": "string"}}}, "headers": _LOG_HEADERS},
    **error_responses(404)})
def get_logs(job_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep,
             tail: Annotated[int, Query(ge=1, le=10_000)] = 200,
             after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None,
             wait: Annotated[float, Query(ge=0, le=30)] = 0) -> Response:
    """The last ``tail`` lines of the job's log (all its processes; secrets redacted). With
    ``after`` (the X-Log-Offset of the previous answer): the lines written since, waiting up to
    ``wait`` seconds for the first of them while the job runs, so that a reader following the
    log asks once per batch of new lines, and answering within a second of the job's end
    (X-Log-Ended: true). A line still being written comes with the next read."""
    job = service.get_job(session, key.project_id, job_id)
    path, running = service.job_log_path(job, settings), JobStatus(job.status) not in TERMINAL
    job_id, project_id = job.id, key.project_id
    session.close()  # hold no connection while waiting
    if after is None:
        text, offset = tail_lines(path, tail)
        return PlainTextResponse(text, headers={"X-Log-Offset": str(offset),
                                                "X-Log-Ended": str(not running).lower()})
    if not running:
        return LogLines(path, after, 0, has_ended=lambda: True)
    return LogLines(path, after, wait, has_ended=lambda: _has_ended(job_id, project_id))


def _has_ended(job_id: str, project_id: str) -> bool:
    with get_sessionmaker()() as session:
        return JobStatus(service.get_job(session, project_id, job_id).status) in TERMINAL


async def log_batches(path: Path, after: int, has_ended: Callable[[], bool]
                      ) -> AsyncIterator[tuple[str, int, bool]]:
    """Follow a log from an offset: ``(lines, offset after them, job ended)`` at each look,
    every POLL seconds while nothing is new, the job's status looked up every STATUS_POLL
    seconds. Ends after the look that found the job ended and nothing more to read."""
    loop = asyncio.get_running_loop()
    look, ended = loop.time(), False
    while True:
        if loop.time() >= look:  # before reading: what it wrote until its end is read
            ended = await asyncio.to_thread(has_ended)
            look = loop.time() + STATUS_POLL
        text, after = await asyncio.to_thread(read_after, path, after)
        yield text, after, ended
        if ended and not text:
            return
        if not text:
            await asyncio.sleep(POLL)


POLL, STATUS_POLL = 0.25, 1.0


class LogLines(Response):
    """The lines of a log after an offset, once there are some, the job has ended, ``wait``
    seconds have passed, or the client went away."""

    def __init__(self, path: Path, after: int, wait: float, *,
                 has_ended: Callable[[], bool]) -> None:
        super().__init__(media_type="text/plain")
        self.path, self.after, self.wait, self.has_ended = path, after, wait, has_ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnect(receive))
        deadline = asyncio.get_running_loop().time() + self.wait
        try:
            async for text, offset, ended in log_batches(self.path, self.after, self.has_ended):
                if text or ended or gone.done() or asyncio.get_running_loop().time() >= deadline:
                    break
        finally:
            gone.cancel()
        self.body = self.render(text)
        self.init_headers({"X-Log-Offset": str(offset), "X-Log-Ended": str(ended).lower()})
        await super().__call__(scope, receive, send)


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


_LOG_STREAM_EVENTS = {"oneOf": [  # what _follow_log sends (its keep-alive comments are no events)
    {"type": "object", "required": ["id", "event", "data"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"const": "lines"},
        "data": {**_JSON_OF, "contentSchema": {"type": "string"}}}},
    {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": "end"}, "data": {**_JSON_OF, "contentSchema": {"const": {}}}}},
]}


@router.get("/{job_id}/logs/stream", response_class=StreamingResponse, responses={
    200: {"description": "Server-sent events: ``lines`` (a JSON string of whole lines; its id "
          "is the log's offset after them), the last ``tail`` lines first, then each batch "
          "written since, until ``end`` once the job has ended",
          "content": {"text/event-stream": {"itemSchema": _LOG_STREAM_EVENTS}}},
    **error_responses(404)})
def stream_logs(job_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep,
                tail: Annotated[int, Query(ge=1, le=10_000)] = 200,
                last_event_id: Annotated[int | None, Header(ge=0, le=BIGINT_MAX)] = None
                ) -> StreamingResponse:
    """The job's log as one stream (all its processes; secrets redacted): a page follows it
    without asking again and again. ``Last-Event-ID`` (an offset) goes on where a dropped
    stream stopped."""
    job = service.get_job(session, key.project_id, job_id)
    path, project_id = service.job_log_path(job, settings), key.project_id
    session.close()  # the stream opens short sessions of its own; hold no connection meanwhile
    return StreamingResponse(_follow_log(path, job.id, project_id, last_event_id, tail),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _follow_log(path: Path, job_id: str, project_id: str, after: int | None, tail: int
                      ) -> AsyncIterator[str]:
    if after is None:
        text, after = await asyncio.to_thread(tail_lines, path, tail)
        yield f"id: {after}\nevent: lines\ndata: {json.dumps(text)}\n\n"
    quiet_since = asyncio.get_running_loop().time()
    async for text, offset, ended in log_batches(
            path, after, lambda: _has_ended(job_id, project_id)):
        now = asyncio.get_running_loop().time()
        if text:
            yield f"id: {offset}\nevent: lines\ndata: {json.dumps(text)}\n\n"
            quiet_since = now
        elif ended:
            yield "event: end\ndata: {}\n\n"
        elif now - quiet_since >= KEEP_ALIVE:
            yield ": keep-alive\n\n"
            quiet_since = now


KEEP_ALIVE = 15.0  # seconds of quiet before a comment that keeps proxies from closing the stream


@router.get("/{job_id}/plan", response_model=PlanOut, responses=error_responses(404))
def get_plan(job_id: str, key: CurrentKey, session: SessionDep, settings: SettingsDep) -> PlanOut:
    job = service.get_job(session, key.project_id, job_id)
    return PlanOut.model_validate(service.job_plan(job, settings))
