"""The OpenAI-compatible gateway's machinery: who is calling, where their model runs, how fast they
may call, and what they used. Everything on the request path is in memory.

* ``TTLCache``: key authentication (SHA-256 of the key -> key id, project id; a few seconds) and
  the routing table (project -> its deployments by name; about a second). A hit is a dict lookup.
  An entry past half its TTL is refreshed in the background while it keeps answering, so steady
  traffic never waits on the database; one past its TTL is reloaded before answering (one load
  per key at a time, in a thread). A revoked key or a changed deployment is seen within the TTL.
* ``RateLimiter``: a token bucket per API key, in this process (``specdeck api --workers N``
  gives each process its own buckets, so a key gets up to N times the rate).
* ``UsageRecorder``: usage rows buffered in memory and inserted in batches by a background task
  (every ``gateway_usage_flush_seconds``, and at shutdown), in a thread: the event loop never
  waits on the database.
* ``UpstreamClient``: one per app, pooled keep-alive HTTP/1.1 connections to the upstreams: an
  asyncio protocol with the ``httptools`` parser (what uvicorn parses with) that writes each
  request in one piece. It replaced ``httpx.AsyncClient``: against the same upstream in the
  same run, httpx took 952 us per request at p50 and this client 109 us (two socket writes per
  request, anyio and pool layers), and the whole budget is 1 ms; see docs/benchmarks.md.
* ``Gateway``: the above, created and closed by the app's lifespan (``gateway_lifespan``).

Settings (read with defaults, see ``setting``): ``gateway_auth_cache_seconds`` (5),
``gateway_route_cache_seconds`` (1), ``gateway_rate_limit_rpm`` (600 per key; 0 disables),
``gateway_rate_limit_burst`` (100), ``gateway_max_tokens`` (4096),
``gateway_usage_flush_seconds`` (1), ``gateway_upstream_timeout_seconds`` (600: the longest
an upstream may take to answer or between two streamed chunks),
``gateway_upstream_connect_timeout_seconds`` (5), ``gateway_upstream_max_idle_connections``
(256 kept per upstream), ``gateway_starting_retry_after_seconds`` (5),
``gateway_unavailable_retry_after_seconds`` (1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import anyio
import httptools
from cryptography.fernet import InvalidToken
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from app.db import session_scope
from app.db.models import ApiKey, Deployment, Usage, utcnow
from app.services.keys import hash_key
from app.services.secrets import cipher
from app.services.state import DeploymentStatus
from app.settings import Settings

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULTS: dict[str, float | int] = {
    "gateway_auth_cache_seconds": 5.0,
    "gateway_route_cache_seconds": 1.0,
    "gateway_rate_limit_rpm": 600.0,
    "gateway_rate_limit_burst": 100,
    "gateway_max_tokens": 4096,
    "gateway_usage_flush_seconds": 1.0,
    "gateway_upstream_timeout_seconds": 600.0,
    "gateway_upstream_connect_timeout_seconds": 5.0,
    "gateway_upstream_max_idle_connections": 256,
    "gateway_starting_retry_after_seconds": 5,
    "gateway_unavailable_retry_after_seconds": 1,
}


def setting(settings: Settings, name: str) -> Any:
    """``settings.<name>``; until Settings declares it, ``SPECDECK_<NAME>`` from the environment;
    else the default above (typed like the default)."""
    default = DEFAULTS[name]
    value = getattr(settings, name, None)
    if value is None:
        raw = os.environ.get(f"SPECDECK_{name.upper()}")
        value = type(default)(raw) if raw not in (None, "") else default
    return value


# --- caches ------------------------------------------------------------------------------------

class TTLCache(Generic[K, V]):
    """Values loaded by a blocking ``loader(key)`` (run in a thread), kept ``ttl`` seconds and
    refreshed in the background after ``ttl / 2`` while they keep answering."""

    def __init__(self, loader: Callable[[K], V], ttl: float, max_entries: int = 100_000) -> None:
        self.loader, self.ttl, self.max_entries = loader, ttl, max_entries
        self.refresh_after = ttl / 2
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def get(self, key: K) -> V:
        entry = self._entries.get(key)
        if entry is not None:
            age = time.monotonic() - entry[0]
            if age < self.ttl:
                if age >= self.refresh_after and key not in self._loading:
                    self._start_load(key)  # refresh ahead; this request goes on with the entry
                return entry[1]
        pending = self._loading.get(key) or self._start_load(key)
        # Shielded: a caller that goes away does not cancel a load others may be waiting on.
        return await asyncio.shield(pending)

    def _start_load(self, key: K) -> asyncio.Future[V]:
        """One load per key at a time: the future is registered before any await."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V] = loop.create_future()
        self._loading[key] = future
        task = loop.create_task(self._load(key, future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return future

    async def _load(self, key: K, future: asyncio.Future[V]) -> None:
        try:
            started = time.monotonic()
            value = await anyio.to_thread.run_sync(self.loader, key)
            if len(self._entries) >= self.max_entries:
                self._evict()
            self._entries[key] = (started, value)
            future.set_result(value)
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    log.warning("loading %r failed: %s: %s", key, type(exc).__name__, exc)
                    future.set_exception(exc)
                    future.exception()  # retrieved: no warning when nobody was waiting
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._loading.get(key) is future:
                del self._loading[key]

    def _evict(self) -> None:
        now = time.monotonic()
        self._entries = {k: v for k, v in self._entries.items() if now - v[0] < self.ttl}
        if len(self._entries) >= self.max_entries:
            self._entries.clear()

    def invalidate(self, key: K | None = None) -> None:
        if key is None:
            self._entries.clear()
        else:
            self._entries.pop(key, None)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()


@dataclass(frozen=True, slots=True)
class Caller:
    key_id: str
    project_id: str


@dataclass(frozen=True, slots=True)
class Route:
    """One served model name of a project: the newest deployment by that name not stopped."""

    deployment_id: str
    name: str
    status: str
    upstream_url: str | None
    created: int
    # Where to connect (scheme, host, port) and the request head up to Content-Length, with
    # "Authorization: Bearer <the upstream's internal key>" (never shown to a client). None: the
    # URL or the key is unusable (not set, not decryptable, not a valid header).
    target: tuple[str, str, int] | None = None
    head: bytes | None = None


@dataclass(frozen=True, slots=True)
class ProjectRoutes:
    by_name: dict[str, Route]

    @property
    def ready(self) -> list[Route]:
        return sorted((r for r in self.by_name.values() if r.status == DeploymentStatus.READY),
                      key=lambda r: r.name)


def load_caller(key_hash: str) -> Caller | None:
    with session_scope() as session:
        row = session.execute(select(ApiKey.id, ApiKey.project_id, ApiKey.revoked_at)
                              .where(ApiKey.key_hash == key_hash)).first()
    if row is None or row.revoked_at is not None:
        return None
    return Caller(key_id=row.id, project_id=row.project_id)


def routes_loader(settings: Settings) -> Callable[[str], ProjectRoutes]:
    fernet = cipher(settings)

    def load(project_id: str) -> ProjectRoutes:
        with session_scope() as session:
            rows = session.execute(
                select(Deployment.id, Deployment.name, Deployment.status, Deployment.upstream_url,
                       Deployment.api_key_ciphertext, Deployment.created_at)
                .where(Deployment.project_id == project_id,
                       Deployment.status != DeploymentStatus.STOPPED.value)
                .order_by(Deployment.created_at, Deployment.id)).all()
        by_name: dict[str, Route] = {}
        for row in rows:  # oldest first: the newest of a name wins
            key: str | None = None
            if row.api_key_ciphertext:
                try:
                    key = fernet.decrypt(row.api_key_ciphertext.encode()).decode()
                except InvalidToken:
                    log.error("deployment %s: its upstream key cannot be decrypted with "
                              "SPECDECK_SECRET_KEY or SPECDECK_SECRET_KEY_PREVIOUS", row.id)
                    key = "\n"  # unusable: the route answers 503
            target, head = request_head(row.upstream_url, key, "/v1/chat/completions")
            by_name[row.name] = Route(deployment_id=row.id, name=row.name, status=row.status,
                                      upstream_url=row.upstream_url,
                                      created=int(row.created_at.timestamp()),
                                      target=target, head=head)
        return ProjectRoutes(by_name=by_name)

    return load


def request_head(url: str | None, key: str | None, path: str
                 ) -> tuple[tuple[str, str, int] | None, bytes | None]:
    """The connection target and the request head (without Content-Length) for ``url``."""
    if not url:
        return None, None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        parts, port = None, 0
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        log.error("unusable upstream URL %r", url)
        return None, None
    lines = [f"POST {parts.path.rstrip('/')}{path} HTTP/1.1", f"Host: {parts.netloc}",
             "Content-Type: application/json", "Accept-Encoding: identity"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if any("\r" in line or "\n" in line for line in lines):
        return None, None  # a CR or LF inside a value: never send it
    try:
        return (parts.scheme, parts.hostname, port), ("\r\n".join(lines) + "\r\n").encode("latin-1")
    except UnicodeEncodeError:
        return None, None


# --- rate limit --------------------------------------------------------------------------------

class RateLimiter:
    """A token bucket per key: ``rpm`` requests a minute on average, up to ``burst`` at once."""

    def __init__(self, rpm: float, burst: int) -> None:
        self.rate = rpm / 60.0
        self.burst = float(max(1, burst))
        self._buckets: dict[str, list[float]] = {}  # key id -> [tokens, updated]

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key_id: str) -> float | None:
        """None if the request may go; otherwise the seconds until it could."""
        now = time.monotonic()
        bucket = self._buckets.get(key_id)
        if bucket is None:
            if len(self._buckets) > 100_000:
                self._buckets.clear()
            self._buckets[key_id] = [self.burst - 1.0, now]
            return None
        tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return None
        bucket[0] = tokens
        return (1.0 - tokens) / self.rate


# --- usage -------------------------------------------------------------------------------------

@dataclass
class UsageRecorder:
    """Buffers usage rows; ``run()`` inserts them every ``interval`` seconds, ``flush()`` now."""

    interval: float
    max_pending: int = 200_000
    pending: list[dict[str, Any]] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def add(self, caller: Caller, route: Route, prompt_tokens: int, completion_tokens: int) -> None:
        self.pending.append({"api_key_id": caller.key_id, "project_id": caller.project_id,
                             "deployment_id": route.deployment_id, "model": route.name,
                             "prompt_tokens": int(prompt_tokens),
                             "completion_tokens": int(completion_tokens),
                             "created_at": utcnow()})

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(Exception):  # flush() logs; keep flushing
                await self.flush()

    async def flush(self) -> int:
        async with self._lock:
            batch, self.pending = self.pending, []
            if not batch:
                return 0
            try:
                await anyio.to_thread.run_sync(self._write, batch)
            except Exception:
                log.exception("could not record %d usage rows; will retry", len(batch))
                self.pending[:0] = batch
                if len(self.pending) > self.max_pending:  # the database is gone for long
                    dropped = len(self.pending) - self.max_pending
                    del self.pending[:dropped]
                    log.error("dropped the %d oldest unrecorded usage rows", dropped)
                raise
            return len(batch)

    @staticmethod
    def _write(batch: list[dict[str, Any]]) -> None:
        last_used: dict[str, Any] = {}
        for row in batch:
            last_used[row["api_key_id"]] = row["created_at"]
        try:
            with session_scope() as session:
                session.execute(insert(Usage), batch)
                for key_id, when in last_used.items():
                    session.execute(update(ApiKey).where(ApiKey.id == key_id)
                                    .values(last_used_at=when))
        except IntegrityError:
            # A key (or its project) was deleted since: keep every other row, one at a time,
            # rather than retrying a batch that can never go in.
            for row in batch:
                try:
                    with session_scope() as session:
                        session.execute(insert(Usage), [row])
                except IntegrityError:
                    log.warning("dropped a usage row of deleted key %s", row["api_key_id"])


# --- the upstream client -----------------------------------------------------------------------

class UpstreamError(Exception):
    """The upstream failed below HTTP: see the subclasses."""


class UpstreamConnectError(UpstreamError):
    """Refused, unreachable, or no connection within the connect timeout."""


class UpstreamTimeout(UpstreamError):
    """No answer (or no next chunk) within the read timeout."""


class UpstreamBroken(UpstreamError):
    """The connection dropped before the end of the response, or the HTTP was malformed."""


class ClientGone(Exception):
    """The gateway's own client disconnected: the upstream request was aborted."""


class ClientWatch:
    """Watches the client's connection once its request body has been read; when the client goes
    away, closes the upstream connection it was given (the upstream sees the abort at once) and
    wakes whoever waits on it with ``ClientGone``. Cheaper than a cancel scope per request."""

    __slots__ = ("gone", "conn", "task")

    def __init__(self, receive: Callable[[], Any]) -> None:
        self.gone = False
        self.conn: _Connection | None = None
        self.task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Callable[[], Any]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self.conn is not None:
            self.conn.abort(ClientGone())

    def stop(self) -> None:
        self.conn = None  # it may go back to the pool and serve another request
        self.task.cancel()


_HIGH_WATER = 1 << 20  # bytes buffered from an upstream before it is paused (a slow client)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; parses responses with httptools as bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None  # one at a time, re-armed when it fires
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = self.complete = self.framed = self.got_bytes = self.paused = False
        self.keep_alive = True
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(UpstreamBroken(f"malformed HTTP from the upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and not self.framed:
            self.complete = True  # a body delimited by the end of the connection
            self.wake()
        elif not self.complete:
            self.fail(UpstreamBroken("the upstream closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"content-length" or (name == b"transfer-encoding"
                                         and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self.wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.transport.pause_reading()  # the client reads slower than the upstream writes
            self.paused = True
        self.wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.wake()

    # waiting
    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.wake()

    def abort(self, error: Exception) -> None:
        """Fail the response in progress with ``error`` and drop the connection."""
        self.fail(error)
        self.close()

    async def wait(self, timeout: float) -> None:
        """Until the parser or the connection has news, at most ``timeout`` seconds. The timer is
        not made and cancelled per wait (per chunk): one timer checks the latest deadline."""
        loop = self.loop
        self.deadline = loop.time() + timeout
        if self.timer is None:
            self.timer = loop.call_at(self.deadline, self._check_deadline)
        waiter = self.waiter = loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def _check_deadline(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # not waiting now: the next wait arms a timer again
        if self.loop.time() >= self.deadline:
            waiter.set_exception(UpstreamTimeout("the upstream did not answer in time"))
        else:
            self.timer = self.loop.call_at(self.deadline, self._check_deadline)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()  # the upstream sees its client go away


class UpstreamResponse:
    """An upstream response whose head has arrived; the body is read with ``read()`` or
    ``next_chunk()``. ``close()`` before the end drops the connection (the request is aborted
    upstream); reading to the end returns it to the pool."""

    __slots__ = ("client", "conn", "target", "timeout", "status", "headers", "done")

    def __init__(self, client: "UpstreamClient", conn: _Connection, target: tuple[str, str, int],
                 timeout: float) -> None:
        self.client, self.conn, self.target, self.timeout = client, conn, target, timeout
        self.status, self.headers = conn.status, conn.headers
        self.done = False

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    async def next_chunk(self) -> bytes | None:
        """What arrived of the body since the last call (all of it, in one piece, so that a
        proxy passes on several upstream chunks in one write when it falls behind); None at the
        end."""
        conn = self.conn
        while True:
            if conn.chunks:
                chunks = conn.chunks
                chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                conn.buffered = 0
                if conn.paused and conn.transport is not None:
                    conn.transport.resume_reading()
                    conn.paused = False
                return chunk
            if conn.complete:
                self._release()
                return None
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.timeout)

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def _release(self) -> None:
        if not self.done:
            self.done = True
            conn = self.conn
            if conn.keep_alive and not conn.closed and conn.error is None and not conn.paused:
                self.client.put(self.target, conn)
            else:
                conn.close()

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.conn.close()


class UpstreamClient:
    """Pooled keep-alive connections per upstream (scheme, host, port); one request per
    connection at a time; each request written in one piece."""

    def __init__(self, connect_timeout: float, read_timeout: float, max_idle: int = 256,
                 keepalive: float = 4.0) -> None:
        # keepalive: below uvicorn's (vLLM's) 5 s, so an idle connection is dropped here first.
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_idle, self.keepalive = max_idle, keepalive
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    def put(self, target: tuple[str, str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(target, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _take(self, target: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(target)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be stale
            if conn.closed or now - conn.idle_since > self.keepalive:
                conn.close()
                continue
            return conn
        return None

    async def _connect(self, target: tuple[str, str, int]) -> _Connection:
        scheme, host, port = target
        loop = asyncio.get_running_loop()
        context = None
        if scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), host, port, ssl=context),
                self.connect_timeout)
        except TimeoutError:
            raise UpstreamConnectError(f"no connection to {host}:{port} within "
                                       f"{self.connect_timeout} s") from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    async def send(self, target: tuple[str, str, int], head: bytes, body: bytes,
                   watch: ClientWatch | None = None) -> UpstreamResponse:
        """Send the request; return once the response head has arrived. With ``watch``, the
        client going away aborts the upstream request (``ClientGone``)."""
        message = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        for attempt in (0, 1):
            conn = self._take(target)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(target)
            conn.reset()
            if watch is not None:
                if watch.gone:
                    self.put(target, conn)
                    raise ClientGone()
                watch.conn = conn
            assert conn.transport is not None
            conn.transport.write(message)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self.read_timeout)
            except UpstreamBroken:
                conn.close()
                if reused and not conn.got_bytes and attempt == 0:
                    continue  # the upstream had closed this idle connection: once more, fresh
                raise
            except BaseException:
                conn.close()  # timed out, or cancelled (the client went away): abort upstream
                raise
            return UpstreamResponse(self, conn, target, self.read_timeout)
        raise AssertionError("unreachable")

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


# --- the gateway -------------------------------------------------------------------------------

class Gateway:
    """Per-app state of the gateway (``app.state.gateway``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.max_tokens = int(setting(settings, "gateway_max_tokens"))
        self.starting_retry_after = str(
            int(setting(settings, "gateway_starting_retry_after_seconds")))
        self.unavailable_retry_after = str(
            int(setting(settings, "gateway_unavailable_retry_after_seconds")))
        self.callers: TTLCache[str, Caller | None] = TTLCache(
            load_caller, float(setting(settings, "gateway_auth_cache_seconds")))
        self.routes: TTLCache[str, ProjectRoutes] = TTLCache(
            routes_loader(settings), float(setting(settings, "gateway_route_cache_seconds")))
        self.limiter = RateLimiter(float(setting(settings, "gateway_rate_limit_rpm")),
                                   int(setting(settings, "gateway_rate_limit_burst")))
        self.usage = UsageRecorder(float(setting(settings, "gateway_usage_flush_seconds")))
        self.client = UpstreamClient(
            connect_timeout=float(setting(settings, "gateway_upstream_connect_timeout_seconds")),
            read_timeout=float(setting(settings, "gateway_upstream_timeout_seconds")),
            max_idle=int(setting(settings, "gateway_upstream_max_idle_connections")))
        self._flusher: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self.usage.run())

    async def aclose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        with contextlib.suppress(Exception):
            await self.usage.flush()
        await self.callers.aclose()
        await self.routes.aclose()
        self.client.close()

    async def caller(self, raw_key: str) -> Caller | None:
        return await self.callers.get(hash_key(raw_key))

    async def project_routes(self, project_id: str) -> ProjectRoutes:
        return await self.routes.get(project_id)

    def retry_after(self, seconds: float) -> str:
        return str(max(1, math.ceil(seconds)))


def get_gateway(app: Any) -> Gateway:
    """The app's gateway, created on first use if the lifespan did not run (bare ASGI calls)."""
    gateway = getattr(app.state, "gateway", None)
    if gateway is None:
        from app.settings import get_settings

        gateway = app.state.gateway = Gateway(get_settings())
        gateway.start()
    return gateway


@contextlib.asynccontextmanager
async def gateway_lifespan(app: Any) -> AsyncIterator[None]:
    from app.settings import get_settings

    gateway = app.state.gateway = Gateway(get_settings())
    gateway.start()
    try:
        yield
    finally:
        await gateway.aclose()
        app.state.gateway = None
