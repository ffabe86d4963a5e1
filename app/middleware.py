"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams and add latency)."""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import APIError, error_response

REQUESTS = Counter("specdeck_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("specdeck_http_request_seconds", "HTTP request latency", ["method", "route"])


class BatchedRequestMetrics:
    """``REQUESTS`` and ``LATENCY`` of one route served thousands of times a second (the
    gateway's): a request appends its latency and status to a queue, and the queue goes into
    the metrics every ``BATCH`` requests and whenever /metrics is read (``flush_batched_metrics``),
    so a scrape never misses one. Observed one by one, each request took 5-6 us of CPU on its
    way (prometheus_client takes a lock per counter it adds to), against a fraction of a
    microsecond for the append (docs/benchmarks.md, "Pinned to one CPU"). A deque: /metrics is
    read in a thread while the event loop appends, and its append and popleft are atomic, so an
    observation is never lost between them."""

    BATCH = 256

    def __init__(self, method: str, route: str) -> None:
        self.method, self.route = method, route
        self.latency = LATENCY.labels(method, route)
        self.requests: dict[int, Any] = {}  # status -> its counter
        self.pending: collections.deque[tuple[float, int]] = collections.deque()
        _batched.add(self)

    def observe(self, seconds: float, status: int) -> None:
        self.pending.append((seconds, status))
        if len(self.pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        pending = self.pending
        statuses: dict[int, int] = {}
        for _ in range(len(pending)):  # what is there now; what comes meanwhile, next time
            try:
                seconds, status = pending.popleft()
            except IndexError:  # a flush in another thread took the rest
                break
            self.latency.observe(seconds)
            statuses[status] = statuses.get(status, 0) + 1
        for status, count in statuses.items():
            counter = self.requests.get(status)
            if counter is None:
                counter = self.requests[status] = REQUESTS.labels(self.method, self.route,
                                                                  str(status))
            counter.inc(count)


_batched: weakref.WeakSet[BatchedRequestMetrics] = weakref.WeakSet()


def flush_batched_metrics() -> None:
    """Every ``BatchedRequestMetrics``' requests into the metrics (before they are read)."""
    for metrics in list(_batched):
        metrics.flush()


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
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            LATENCY.labels(scope["method"], path).observe(time.perf_counter() - start)
            REQUESTS.labels(scope["method"], path, str(status)).inc()
