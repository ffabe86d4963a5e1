"""The OpenAI-compatible gateway's machinery: who is calling, where their model runs, how fast they
may call, and what they used. Everything on the request path is in memory.

* ``TTLCache``: key authentication (SHA-256 of the key -> key id, project id; a few seconds) and
  the routing table (project -> its deployments by name; about a second). A hit is a dict lookup.
  An entry past half its TTL is refreshed in the background while it keeps answering, so steady
  traffic never waits on the database; one past its TTL is reloaded before answering (one load
  per key at a time, in a thread). A changed deployment is seen within the TTL, and so is a
  revoked key where no Redis announces it.
* The rate limit per API key (``app.services.limits``): one bucket in Redis for every API
  process when the broker is Redis, else in this process; revocations announced on Redis drop
  a key from every process's auth cache at once.
* ``UsageRecorder``: usage rows buffered in memory and inserted in batches by a background task
  (every ``gateway_usage_flush_seconds``, and at shutdown), in a thread: the event loop never
  waits on the database. ``CaptureRecorder``: the same (``BatchWriter``) for the requests
  sampled by deployments that capture traffic, in a bounded queue: when it is full, a request
  goes on uncaptured and is counted as dropped (``app.services.capture``).
* ``UpstreamClient`` (``app.services.upstream``, on aiohttp): pooled keep-alive connections to
  the upstreams, a read timeout per streamed chunk, bytes passed through undecoded.
* ``Balancer``: which replica of a deployment a request goes to (the fewest in flight from this
  process; one that failed to connect or broke is ejected for a few seconds).
* ``Gateway``: the above, created and closed by the app's lifespan (``gateway_lifespan``).

Settings: the ``gateway_*`` fields of ``app.settings.Settings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import anyio
from cryptography.fernet import InvalidToken, MultiFernet
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db import read_scope, session_scope
from app.db.models import ApiKey, Capture, Deployment, Usage, utcnow
from app.services import capture, limits
from app.services.capture import Sampled
from app.services.keys import hash_key
from app.services.secrets import cipher
from app.services.state import DeploymentStatus
from app.services.upstream import UpstreamClient, UpstreamError
from app.settings import Settings

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")

# --- caches ------------------------------------------------------------------------------------

class TTLCache(Generic[K, V]):
    """Values loaded by a blocking ``loader(key)`` (run in a thread), kept ``ttl`` seconds and
    refreshed in the background after ``ttl / 2`` while they keep answering."""

    def __init__(self, loader: Callable[[K], V], ttl: float, max_entries: int = 100_000) -> None:
        self.loader, self.ttl, self.max_entries = loader, ttl, max_entries
        self.refresh_after = ttl / 2
        self._entries: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}
        # When a key being loaded (None: every key) was invalidated: a load that started
        # before that answers its waiters but is not kept.
        self._invalidated: dict[K | None, float] = {}
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
            if started > max(self._invalidated.get(key, 0.0), self._invalidated.get(None, 0.0)):
                if len(self._entries) >= self.max_entries:
                    self._evict()
                self._entries[key] = (started, value)
                self._invalidated.pop(key, None)
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
        """Forget ``key`` (None: every key), and any load of it already under way."""
        if key is None:
            self._entries.clear()
            self._invalidated = {None: time.monotonic()}
        else:
            self._entries.pop(key, None)
            if key in self._loading:
                self._invalidated[key] = time.monotonic()

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()


@dataclass(frozen=True, slots=True)
class Caller:
    key_id: str
    project_id: str


@dataclass(frozen=True, slots=True)
class Replica:
    """One engine a route can send to: the deployment's own row (index 0) or one of its replica
    rows, ready, with its chat completions URL and the headers to send it ("Authorization: Bearer
    <the engine's internal key>", never shown to a client)."""

    deployment_id: str  # that row's id (the deployment's own for index 0)
    index: int
    url: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Route:
    """One served model name of a project: the newest deployment by that name not stopped, and
    the engines that serve it (``replicas``: its own row and its replica rows that are ready
    with a usable URL and key; ``Balancer`` picks one per request). ``status`` is ready when any
    of those rows is, else the deployment's own. Usage and capture name the deployment
    (``deployment_id``), whichever replica served the request."""

    deployment_id: str
    name: str
    status: str
    created: int
    replicas: tuple[Replica, ...] = ()
    # Traffic capture: the dataset sampled requests go to (None: off), and the share sampled.
    capture_dataset_id: str | None = None
    capture_rate: float = 0.0

    def sample(self) -> bool:
        """Whether to capture this request (decided per request)."""
        return self.capture_dataset_id is not None and (
            self.capture_rate >= 1.0 or random.random() < self.capture_rate)


@dataclass(frozen=True, slots=True)
class ProjectRoutes:
    """A project's routes by served name (replica rows are inside their deployment's route)."""

    by_name: dict[str, Route]

    @property
    def ready(self) -> list[Route]:
        return sorted((r for r in self.by_name.values() if r.status == DeploymentStatus.READY),
                      key=lambda r: r.name)


def load_caller(key_hash: str) -> Caller | None:
    with read_scope() as connection:
        row = connection.execute(select(ApiKey.id, ApiKey.project_id, ApiKey.revoked_at)
                                 .where(ApiKey.key_hash == key_hash)).first()
    if row is None or row.revoked_at is not None:
        return None
    return Caller(key_id=row.id, project_id=row.project_id)


def routes_loader(settings: Settings) -> Callable[[str], ProjectRoutes]:
    fernet = cipher(settings)
    ready = DeploymentStatus.READY.value

    def replica(row: Any) -> Replica | None:
        """The row's engine, if the row is ready and its URL and key are usable."""
        if row.status != ready:
            return None
        key: str | None = None
        if row.api_key_ciphertext:
            try:
                key = fernet.decrypt(row.api_key_ciphertext.encode()).decode()
            except InvalidToken:
                log.error("deployment %s: its upstream key cannot be decrypted with "
                          "SPECDECK_SECRET_KEY or SPECDECK_SECRET_KEY_PREVIOUS", row.id)
                return None
        url, headers = upstream_target(row.upstream_url, key, "/v1/chat/completions")
        if url is None or headers is None:
            return None
        return Replica(deployment_id=row.id, index=row.replica, url=url, headers=headers)

    def load(project_id: str) -> ProjectRoutes:
        # One query: the project's deployment rows and replica rows (a replica shares its
        # deployment's project), not stopped.
        with read_scope() as connection:
            rows = connection.execute(
                select(Deployment.id, Deployment.name, Deployment.status, Deployment.upstream_url,
                       Deployment.api_key_ciphertext, Deployment.created_at,
                       Deployment.replica_of, Deployment.replica,
                       Capture.dataset_id.label("capture_dataset_id"), Capture.sample_rate)
                .outerjoin(Capture, Capture.dataset_id == Deployment.capture_dataset_id)
                .where(Deployment.project_id == project_id,
                       Deployment.status != DeploymentStatus.STOPPED.value)
                .order_by(Deployment.created_at, Deployment.id)).all()
        newest: dict[str, Any] = {}
        replica_rows: dict[str, list[Any]] = {}  # deployment id -> its replica rows
        for row in rows:  # oldest first: the newest of a name wins
            if row.replica_of is None:
                newest[row.name] = row
            else:
                replica_rows.setdefault(row.replica_of, []).append(row)
        by_name: dict[str, Route] = {}
        for name, row in newest.items():
            served = [row, *sorted(replica_rows.get(row.id, ()), key=lambda r: r.replica)]
            status = ready if any(r.status == ready for r in served) else row.status
            by_name[name] = Route(
                deployment_id=row.id, name=name, status=status,
                created=int(row.created_at.timestamp()),
                replicas=tuple(r for r in map(replica, served) if r is not None),
                capture_dataset_id=row.capture_dataset_id, capture_rate=row.sample_rate or 0.0)
        return ProjectRoutes(by_name=by_name)

    return load


def upstream_target(base_url: str | None, key: str | None, path: str
                    ) -> tuple[str | None, dict[str, str] | None]:
    """The URL of ``path`` under ``base_url`` and the headers to send it with."""
    if not base_url:
        return None, None
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        log.error("unusable upstream URL %r", base_url)
        return None, None
    headers = {"Content-Type": "application/json", "Accept": "*/*",
               "Accept-Encoding": "identity", "User-Agent": "specdeck-gateway"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if any("\r" in value or "\n" in value for value in headers.values()):
        return None, None  # a CR or LF inside a value: never send it
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}{path}", headers


# --- batched writes: usage, capture ------------------------------------------------------------

class BatchWriter(Generic[T]):
    """Items buffered in memory and written in batches by ``run()`` every ``interval`` seconds
    (``flush()``: now), in a thread: the event loop never waits on the database. At most
    ``max_pending`` items wait; ``add`` refuses more (False). Subclasses write a batch
    (``write``, in the thread) and say what becomes of one that failed (``restore``)."""

    what = "rows"

    def __init__(self, interval: float, max_pending: int) -> None:
        self.interval, self.max_pending = interval, max_pending
        self.pending: list[T] = []
        self._lock = asyncio.Lock()

    def add(self, item: T) -> bool:
        if len(self.pending) >= self.max_pending:
            return False
        self.pending.append(item)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(Exception):  # flush() logs; keep flushing
                await self.flush()

    def take(self) -> Any:
        """What the next ``write`` gets (on the event loop); None: nothing to write."""
        batch, self.pending = self.pending, []
        return batch or None

    async def flush(self) -> int:
        async with self._lock:
            batch = self.take()
            if batch is None:
                return 0
            try:
                return await anyio.to_thread.run_sync(self.write, batch)
            except Exception:
                log.exception("could not record %s; will retry", self.what)
                self.restore(batch)
                raise

    def write(self, batch: Any) -> int:
        raise NotImplementedError

    def restore(self, batch: Any) -> None:
        """A failed batch back in front of what came since, the oldest dropped beyond
        ``max_pending`` (the database is gone for long)."""
        self.pending[:0] = batch
        if len(self.pending) > self.max_pending:
            dropped = len(self.pending) - self.max_pending
            del self.pending[:dropped]
            log.error("dropped the %d oldest unrecorded %s", dropped, self.what)


class UsageRecorder(BatchWriter[dict[str, Any]]):
    """Usage rows (one per request), and the keys' ``last_used_at``."""

    what = "usage rows"

    def __init__(self, interval: float, max_pending: int = 200_000) -> None:
        super().__init__(interval, max_pending)

    def add_usage(self, caller: Caller, route: Route, prompt_tokens: int, completion_tokens: int,
                  acceptance_length: float | None = None) -> None:
        if not self.add({"api_key_id": caller.key_id, "project_id": caller.project_id,
                         "deployment_id": route.deployment_id, "model": route.name,
                         "prompt_tokens": int(prompt_tokens),
                         "completion_tokens": int(completion_tokens),
                         "acceptance_length": acceptance_length, "created_at": utcnow()}):
            log.error("dropped a usage row: %d are waiting for the database", len(self.pending))

    def write(self, batch: list[dict[str, Any]]) -> int:
        try:
            with session_scope() as session:
                insert_usage(session, batch)
                touch_keys(session, batch)
        except IntegrityError:
            # A key (or its project) was deleted since: keep every other row, one at a time,
            # rather than retrying a batch that can never go in.
            kept = []
            for row in batch:
                try:
                    with session_scope() as session:
                        insert_usage(session, [row])
                    kept.append(row)
                except IntegrityError:
                    log.warning("dropped a usage row of deleted key %s", row["api_key_id"])
            with session_scope() as session:
                touch_keys(session, kept)
        return len(batch)


def touch_keys(session: Session, rows: list[dict[str, Any]]) -> None:
    """The keys' ``last_used_at``: their newest row's time, never backwards (/api writes it
    too)."""
    last_used: dict[str, Any] = {}
    for row in rows:
        last_used[row["api_key_id"]] = max(row["created_at"],
                                           last_used.get(row["api_key_id"], row["created_at"]))
    for key_id, when in last_used.items():
        session.execute(update(ApiKey).where(
            ApiKey.id == key_id, ApiKey.last_used_at.is_(None) | (ApiKey.last_used_at < when))
            .values(last_used_at=when))


USAGE_COLUMNS = ("api_key_id", "project_id", "deployment_id", "model", "prompt_tokens",
                 "completion_tokens", "acceptance_length", "created_at")


def insert_usage(session: Session, batch: list[dict[str, Any]]) -> None:
    """Usage rows in one statement: PostgreSQL's COPY (a row costs a few microseconds there,
    against tens through an executemany, and the gateway writes one per request), else an
    executemany."""
    dialect = session.get_bind().dialect
    if dialect.name == "postgresql":
        statement = f"COPY usage ({', '.join(USAGE_COLUMNS)}) FROM STDIN"
        try:
            with session.connection().connection.cursor() as cursor, \
                    cursor.copy(statement) as copy:
                for row in batch:
                    copy.write_row([row[column] for column in USAGE_COLUMNS])
        except dialect.dbapi.IntegrityError as exc:  # as SQLAlchemy raises it
            raise IntegrityError(statement, None, exc) from exc
    else:
        session.execute(Usage.__table__.insert(), batch)  # Core executemany


class CaptureRecorder(BatchWriter[Sampled]):
    """Sampled requests of deployments that capture (``app.services.capture``). A full queue
    drops the request from capture, never delays it: counted per dataset, and the count is
    written with the next batch (``captures.dropped_queue_full``)."""

    what = "captured requests"

    def __init__(self, interval: float, max_pending: int, fernet: MultiFernet) -> None:
        super().__init__(interval, max_pending)
        self.fernet = fernet
        self.dropped: dict[str, int] = {}

    def add_sampled(self, sampled: Sampled) -> None:
        if not self.add(sampled):
            self.dropped[sampled.dataset_id] = self.dropped.get(sampled.dataset_id, 0) + 1

    def take(self) -> tuple[list[Sampled], dict[str, int]] | None:
        batch, self.pending = self.pending, []
        dropped, self.dropped = self.dropped, {}
        return (batch, dropped) if batch or dropped else None

    def write(self, batch: tuple[list[Sampled], dict[str, int]]) -> int:
        with session_scope() as session:
            return capture.store(session, batch[0], batch[1], self.fernet)

    def restore(self, batch: tuple[list[Sampled], dict[str, int]]) -> None:
        sampled, dropped = batch
        for dataset_id, count in dropped.items():
            self.dropped[dataset_id] = self.dropped.get(dataset_id, 0) + count
        cut = len(sampled) - min(len(sampled), max(0, self.max_pending - len(self.pending)))
        for item in sampled[:cut]:  # the oldest, that no longer fit
            self.dropped[item.dataset_id] = self.dropped.get(item.dataset_id, 0) + 1
        self.pending[:0] = sampled[cut:]


class ClientWatch:
    """Watches the client's connection once its request body has been read: a task waits on
    ``receive()``, which the server answers ``http.disconnect`` when the client goes away. It
    then cancels the request's task wherever that waits on the upstream (for the answer or the
    next chunk); the task closes the upstream response, so the upstream sees the abort at once,
    and ends quietly (``gone`` tells it why it was cancelled)."""

    __slots__ = ("gone", "armed", "task", "watcher")

    def __init__(self, receive: Callable[[], Any]) -> None:
        self.gone = False
        self.armed = True
        self.task = asyncio.current_task()
        self.watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Callable[[], Any]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone()

    def _gone(self) -> None:
        self.gone = True
        if self.armed and self.task is not None:
            self.task.cancel()

    def stop(self) -> None:
        self.armed = False
        self.watcher.cancel()

    def swallow(self) -> bool:
        """In an ``except CancelledError``: True (and the cancel undone) if it came from here."""
        if not self.gone or self.task is None:
            return False
        self.task.uncancel()
        return True


# --- balancing across replicas -----------------------------------------------------------------

class Balancer:
    """Which of a route's replicas a request goes to, per gateway process (no coordination
    between API processes): the one with the fewest requests in flight from this process
    (``inflight``, counted by ``UpstreamClient.send``), ties to the one picked longest ago, so
    sequential requests take turns. A replica that refused a connection or broke before
    answering is ejected for ``eject_seconds``: picked only when every other one is ejected too
    (never a 503 for ejection alone); after that the next request tries it again."""

    EJECTED = 1 << 30  # added to an ejected replica's count in flight

    __slots__ = ("eject_seconds", "inflight", "picked", "picks", "ejected")

    def __init__(self, eject_seconds: float) -> None:
        self.eject_seconds = eject_seconds
        self.inflight: dict[str, int] = {}  # replica id -> requests in flight
        self.picked: dict[str, int] = {}  # replica id -> the number of its last pick
        self.picks = 0
        self.ejected: dict[str, float] = {}  # replica id -> ejected until (time.monotonic)

    def pick(self, replicas: tuple[Replica, ...], avoid: Replica | None = None) -> Replica:
        """One of ``replicas`` (not empty), never ``avoid`` when there is another."""
        if len(replicas) == 1:
            return replicas[0]
        inflight, picked, ejected = self.inflight, self.picked, self.ejected
        now = time.monotonic() if ejected else 0.0
        best, best_load, best_pick = replicas[0], -1, 0
        for replica in replicas:
            if replica is avoid:
                continue
            key = replica.deployment_id
            load = inflight.get(key, 0)
            if ejected and key in ejected:
                if ejected[key] > now:
                    load += self.EJECTED
                else:
                    del ejected[key]
            last = picked.get(key, 0)
            if best_load < 0 or load < best_load or (load == best_load and last < best_pick):
                best, best_load, best_pick = replica, load, last
        self.picks += 1
        picked[best.deployment_id] = self.picks
        return best

    def eject(self, replica: Replica, error: UpstreamError) -> None:
        """Eject ``replica`` (again) for ``eject_seconds``; logged when it was not ejected."""
        key, now = replica.deployment_id, time.monotonic()
        if self.ejected.get(key, 0.0) <= now:
            log.warning("upstream %s (replica %d, %s) failed: %s; ejected for %g s", replica.url,
                        replica.index, key, error, self.eject_seconds)
        self.ejected[key] = now + self.eject_seconds


# --- the gateway -------------------------------------------------------------------------------

class Gateway:
    """Per-app state of the gateway (``app.state.gateway``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.max_tokens = settings.gateway_max_tokens
        self.max_body_bytes = settings.max_body_bytes
        self.starting_retry_after = str(settings.gateway_starting_retry_after_seconds)
        self.unavailable_retry_after = str(settings.gateway_unavailable_retry_after_seconds)
        self.callers: TTLCache[str, Caller | None] = TTLCache(
            load_caller, settings.gateway_auth_cache_seconds)
        self.routes: TTLCache[str, ProjectRoutes] = TTLCache(
            routes_loader(settings), settings.gateway_route_cache_seconds)
        self.limiter = limits.rate_limiter(settings)
        self.usage = UsageRecorder(settings.gateway_usage_flush_seconds)
        self.capture = CaptureRecorder(settings.gateway_capture_flush_seconds,
                                       settings.gateway_capture_queue_rows, cipher(settings))
        self.client = UpstreamClient(
            connect_timeout=settings.gateway_upstream_connect_timeout_seconds,
            read_timeout=settings.gateway_upstream_timeout_seconds,
            max_connections=settings.gateway_upstream_max_connections)
        self.balancer = Balancer(settings.gateway_replica_eject_seconds)
        self._flushers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self._flushers:
            loop = asyncio.get_running_loop()
            self._flushers = [loop.create_task(w.run()) for w in (self.usage, self.capture)]
            if url := limits.redis_url(self.settings):
                self._flushers.append(loop.create_task(
                    limits.follow_revocations(url, self.callers.invalidate)))
            if isinstance(self.limiter, limits.RedisRateLimiter) and self.limiter.enabled:
                self._flushers.append(loop.create_task(self.limiter.give_back_idle()))

    async def aclose(self) -> None:
        for flusher in self._flushers:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        self._flushers = []
        for writer in (self.usage, self.capture):
            with contextlib.suppress(Exception):
                await writer.flush()
        await self.callers.aclose()
        await self.routes.aclose()
        await self.client.aclose()
        await self.limiter.aclose()

    async def caller(self, raw_key: str) -> Caller | None:
        """The key's caller; None if there is no such key (or it was revoked). The caller is
        looked up each time; the key's hash is remembered (``key_hash``)."""
        return await self.callers.get(key_hash(raw_key))

    async def project_routes(self, project_id: str) -> ProjectRoutes:
        return await self.routes.get(project_id)

    def retry_after(self, seconds: float) -> str:
        return str(max(1, math.ceil(seconds)))


@functools.lru_cache(maxsize=4096)
def key_hash(raw_key: str) -> str:
    """``hash_key``, remembered for the keys in use: hashing took 4-5 us of each request's CPU on
    its way (docs/benchmarks.md, "Why the gateway is built as it is")."""
    return hash_key(raw_key)


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
