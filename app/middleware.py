"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams and add latency)."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import APIError, error_response

REQUESTS = Counter("specdeck_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("specdeck_http_request_seconds", "HTTP request latency", ["method", "route"])


class BodySizeLimit:
    """Answer 413 in the error shape for a body over the limit: ``max_bytes``, or
    ``overrides[path]`` for those exact paths (uploads). A declared Content-Length over it is
    refused before the app runs; a body that grows past it while the app reads it (chunked, no
    Content-Length) is answered 413 right there, and the app is told the client went away (what
    it sends after that is dropped), so every route answers the same 413."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 overrides: dict[str, int] | None = None) -> None:
        self.app, self.max_bytes, self.overrides = app, max_bytes, overrides or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.overrides.get(scope["path"], self.max_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > limit:
                    return await self._reject(scope, receive, send, limit)
                break
        seen = 0
        started = rejected = False

        async def limited_receive() -> Message:
            nonlocal seen, started, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    rejected = True
                    if not started:
                        started = True
                        await self._reject(scope, receive, send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return  # the 413 went out instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not rejected:
                raise  # else: the app failed on the disconnect it was handed; the 413 is out

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        await error_response(too_large(limit))(scope, receive, send)


def too_large(limit: int) -> APIError:
    """413 for a body over ``limit`` bytes; the connection is closed after it (the rest of the
    body is never read)."""
    return APIError(413, f"Request body is larger than {limit} bytes", code="request_too_large",
                    headers={"Connection": "close"})


class PrometheusMetrics:
    """Each request's latency (a stream's: until its end) and status, by route: 499 for one
    whose client went away before it was answered, 500 for one the app failed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 0

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
            status = status or 499  # returned without an answer: the client went away
        except BaseException:
            status = status or 500
            raise
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            LATENCY.labels(scope["method"], path).observe(time.perf_counter() - start)
            REQUESTS.labels(scope["method"], path, str(status)).inc()
