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
* ``Gateway``: the above plus one shared ``httpx.AsyncClient`` (pooled keep-alive connections to
  the upstreams), created and closed by the app's lifespan (``gateway_lifespan``).

Settings (read with defaults, see ``setting``): ``gateway_auth_cache_seconds`` (5),
``gateway_route_cache_seconds`` (1), ``gateway_rate_limit_rpm`` (600 per key; 0 disables),
``gateway_rate_limit_burst`` (100), ``gateway_max_tokens`` (4096),
``gateway_usage_flush_seconds`` (1), ``gateway_upstream_timeout_seconds`` (600: the longest
an upstream may take to answer or between two streamed chunks),
``gateway_upstream_connect_timeout_seconds`` (5), ``gateway_upstream_max_connections`` (1000),
``gateway_starting_retry_after_seconds`` (5), ``gateway_unavailable_retry_after_seconds`` (1).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import httpx
from cryptography.fernet import InvalidToken
from sqlalchemy import insert, select, update

from app.db import session_scope
from app.db.models import ApiKey, Deployment, Usage, utcnow
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
    "gateway_upstream_max_connections": 1000,
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
                    task = asyncio.get_running_loop().create_task(self._load(key))
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
                return entry[1]
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        return await self._load(key)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background cache refresh failed: %s", task.exception())

    async def _load(self, key: K) -> V:
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            started = time.monotonic()
            value = await anyio.to_thread.run_sync(self.loader, key)
            if len(self._entries) >= self.max_entries:
                self._evict()
            self._entries[key] = (started, value)
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
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
    authorization: str | None  # "Bearer <the upstream's internal key>": never sent to a client
    created: int


@dataclass(frozen=True, slots=True)
class ProjectRoutes:
    by_name: dict[str, Route]

    @property
    def ready(self) -> list[Route]:
        return sorted((r for r in self.by_name.values() if r.status == DeploymentStatus.READY),
                      key=lambda r: r.name)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


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
            authorization = None
            if row.api_key_ciphertext:
                try:
                    authorization = "Bearer " + fernet.decrypt(row.api_key_ciphertext.encode()).decode()
                except InvalidToken:
                    log.error("deployment %s: its upstream key cannot be decrypted with "
                              "SPECDECK_SECRET_KEY or SPECDECK_SECRET_KEY_PREVIOUS", row.id)
                    authorization = ""
            by_name[row.name] = Route(deployment_id=row.id, name=row.name, status=row.status,
                                      upstream_url=(row.upstream_url or "").rstrip("/") or None,
                                      authorization=authorization,
                                      created=int(row.created_at.timestamp()))
        return ProjectRoutes(by_name=by_name)

    return load


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
        with session_scope() as session:
            session.execute(insert(Usage), batch)
            for key_id, when in last_used.items():
                session.execute(update(ApiKey).where(ApiKey.id == key_id)
                                .values(last_used_at=when))


# --- the gateway -------------------------------------------------------------------------------

class Gateway:
    """Per-app state of the gateway (``app.state.gateway``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.max_tokens = int(setting(settings, "gateway_max_tokens"))
        self.starting_retry_after = str(int(setting(settings, "gateway_starting_retry_after_seconds")))
        self.unavailable_retry_after = str(
            int(setting(settings, "gateway_unavailable_retry_after_seconds")))
        self.callers: TTLCache[str, Caller | None] = TTLCache(
            load_caller, float(setting(settings, "gateway_auth_cache_seconds")))
        self.routes: TTLCache[str, ProjectRoutes] = TTLCache(
            routes_loader(settings), float(setting(settings, "gateway_route_cache_seconds")))
        self.limiter = RateLimiter(float(setting(settings, "gateway_rate_limit_rpm")),
                                   int(setting(settings, "gateway_rate_limit_burst")))
        self.usage = UsageRecorder(float(setting(settings, "gateway_usage_flush_seconds")))
        self._client: httpx.AsyncClient | None = None
        self._flusher: asyncio.Task[None] | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            read = float(setting(self.settings, "gateway_upstream_timeout_seconds"))
            connect = float(setting(self.settings, "gateway_upstream_connect_timeout_seconds"))
            connections = int(setting(self.settings, "gateway_upstream_max_connections"))
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(read, connect=connect, pool=connect),
                limits=httpx.Limits(max_connections=connections,
                                    max_keepalive_connections=connections,
                                    keepalive_expiry=30),
                trust_env=False,  # upstreams are on the cluster network: no proxies from the env
                follow_redirects=False)
        return self._client

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
        if self._client is not None:
            await self._client.aclose()
            self._client = None

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
