"""One error shape for every response: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.db import UNAVAILABLE
from app.schemas.drafters import KINDS

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}
# The types an OpenAI client knows; an engine's own (vLLM's exception names) are not among them.
OPENAI_TYPES = frozenset({*_TYPES.values(), "server_error", "api_error"})
ECHO_MAX = 100  # characters of a client's value quoted back in a message


def echo(value: str, limit: int = ECHO_MAX) -> str:
    """A value the client sent, as a message quotes it: cut to ``limit`` characters."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The one error shape, as the OpenAPI document declares it."""

    error: ErrorDetail


# What each status means when a route answers it, for the OpenAPI document.
_MEANINGS = {
    400: "The body could not be parsed",
    401: "Missing or invalid API key",
    403: ("The key's role does not allow this: an inference key on /api, a member key on "
          "keys, secrets or webhooks"),
    404: "No such resource in the caller's project",
    409: "The resource's current state does not allow this",
    413: "The request body is over the size limit",
    415: "Unsupported Content-Type",
    422: "Invalid request: the field is named in error.param",
    429: "Over a rate limit or quota; retry after Retry-After seconds",
    502: "The model server failed",
    503: "A dependency is unreachable; retry after Retry-After seconds",
    504: "The model server did not answer in time",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying",
                                "schema": {"type": "string"}}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of the errors a route can answer, all in the one shape."""
    return {status: {"model": ErrorResponse, "description": _MEANINGS[status],
                     **({"headers": _RETRY_AFTER} if status in (429, 503) else {})}
            for status in statuses}


class APIError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status_code, "api_error")
        self.headers = headers


def not_found(what: str, ident: str, param: str | None = None) -> APIError:
    return APIError(404, f"No {what} with id '{echo(ident)}'", code="not_found", param=param)


def error_body(status_code: int, message: str, *, code: str | None = None,
               param: str | None = None, type: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type or _TYPES.get(status_code, "api_error"),
                      "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(exc.status_code, exc.message, code=exc.code, param=exc.param, type=exc.type),
        status_code=exc.status_code,
        headers=exc.headers,
    )


def _parts(loc: tuple[Any, ...] | list[Any]) -> tuple[list[str], str | None]:
    """The field's path, without the location in front ("body", "query", ...: a field may itself
    be named "path" or "query"), and the drafter kind it is a field of: pydantic names the
    branch of a drafter union in the path ("speculator.eagle3.block_size"), the client's body
    does not."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    kind = next((p for p in parts if p in KINDS), None)
    return [p for p in parts if p != kind], kind


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return error_response(exc)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    parts, drafter = _parts(first.get("loc", ()))
    param = ".".join(parts) or None
    kind = first.get("type", "invalid")
    message = first.get("msg", "Invalid request")
    if kind == "extra_forbidden" and drafter:
        article = "an" if drafter[0] in "aeiou" else "a"
        message = (f"Unknown field '{echo(param or '')}': {article} {drafter} drafter has no "
                   f"{parts[-1]}")
        code = "unknown_field"
    elif kind == "extra_forbidden":
        message = f"Unknown field '{echo(param or '')}'"
        code = "unknown_field"
    elif kind == "unknown_kind":  # a drafter's "type" that names no kind
        param = f"{param}.type" if param else "type"
        message = f"{param}: {message}"
        code = "invalid_value"
    elif kind in ("missing",):
        message = f"Missing required field '{echo(param or '')}'"
        code = "missing_field"
    elif kind == "json_invalid":
        message = "Request body is not valid JSON"
        code = "invalid_json"
    else:
        message = f"{param}: {message}" if param else message
        code = "invalid_value"
    return JSONResponse(error_body(422, message, code=code, param=param), status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 405:
        return _method_not_allowed(request)
    code = {404: "not_found"}.get(exc.status_code)
    return JSONResponse(error_body(exc.status_code, str(exc.detail), code=code),
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


# The database is down or restarting, or every pooled connection is taken: the request may
# succeed in a moment, so it is a 503 with Retry-After (which SDKs honour), not a 500.
DATABASE_RETRY_AFTER_SECONDS = 2


def database_unavailable() -> APIError:
    return APIError(503, "The database is unreachable right now; retry shortly",
                    code="service_unavailable",
                    headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    return error_response(database_unavailable())


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _method_not_allowed(request: Request) -> JSONResponse:
    """405 with every method the path answers in Allow: Starlette's own Allow names the methods
    of the first route that matched the path only, and each method of a path is a route."""
    path = {"type": "http", "path": request.scope["path"],
            "root_path": request.scope.get("root_path", "")}
    allowed = ", ".join(method for method in _METHODS if any(
        route.matches({**path, "method": method})[0] is Match.FULL
        for route in request.app.router.routes))
    message = f"Method {request.method} is not allowed on {request.url.path}; use {allowed}"
    return JSONResponse(error_body(405, message, code="method_not_allowed"), status_code=405,
                        headers={"Allow": allowed})


def internal_error(exc: Exception) -> JSONResponse:
    """500 for an error nothing else handled (logged with its traceback)."""
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(error_body(500, "Internal server error", code="internal_error",
                                   type="server_error"), status_code=500)


async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
    return internal_error(exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, _database_error)
    app.add_exception_handler(Exception, _unhandled)
