"""Per-key rate limits and key revocations, shared by every API process.

With Redis (the broker of a Postgres + Redis install, ``SPECDECK_BROKER_URL=redis://...``):

* a key's rate limit is one bucket in Redis, checked and updated by one atomic script on Redis's
  own clock (GCRA: the bucket is the time at which it is next full), so any number of API
  processes, on any number of hosts, enforce exactly one limit per key;
* a revoked key is announced on a Redis channel once its revocation is committed; every API
  process's gateway listens and drops the key from its auth cache at once (and its whole auth
  cache when it had to reconnect, since it may have missed an announcement).

Without Redis (the embedded SQLite default: one API process) the bucket lives in the process,
and a revoked key is refused by the gateway within its auth cache's TTL.

Redis unreachable: the gateway **fails open**. A request goes on without a limit (with a warning
at most every 30 s), so an outage of the limiter never becomes an outage of the gateway; the
auth cache's TTL still bounds how long a revoked key is accepted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection, parse_url
from prometheus_client import Counter

from app.settings import Settings

log = logging.getLogger(__name__)

REVOKED_CHANNEL = "specdeck:revoked-keys"
BUCKET_PREFIX = "specdeck:rate:"
TIMEOUT = 0.5  # seconds: a slow Redis costs a request at most this, then it fails open
WARN_EVERY = 30.0
EARLY_REFUSED = Counter(
    "specdeck_gateway_early_refused_total",
    "Requests sent upstream before the rate limit answered, then refused by it (aborted there)")

# KEYS[1]: the key's bucket, the time (µs, Redis's clock) at which it is next full (its
# "theoretical arrival time"); ARGV[1]: µs per request at the limit; ARGV[2]: the burst's
# tolerance, (burst - 1) x ARGV[1]. Returns {0, the requests that would still be taken now}
# (taken) or {the µs until a request may go, 0}.
GCRA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if now < tat - tolerance then return {math.ceil(tat - tolerance - now), 0} end
local next_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', next_tat), 'PX', math.ceil((next_tat - now) / 1000) + 1)
return {0, math.floor((now + tolerance - next_tat) / interval) + 1}
"""


def redis_url(settings: Settings) -> str | None:
    """Where limits and revocations are shared: the broker, when it is Redis."""
    url = settings.broker_url
    return url if url.startswith(("redis://", "rediss://")) else None


class Verdict:
    """The rate limit's answer on one request, asked for as the request comes in: ``wait()``
    gives None (it may go) or the seconds until one could. ``early``: the request may be sent
    upstream before the answer arrives (``RedisRateLimiter.ask``); it is awaited before the
    upstream's answer, and a refusal aborts the request there."""

    __slots__ = ("answer", "early", "checked")

    def __init__(self, answer: asyncio.Future[float | None], early: bool) -> None:
        self.answer, self.early = answer, early
        self.checked = False  # acted on already (``app.api.openai.enforce``)

    async def wait(self) -> float | None:
        return await self.answer


class LocalRateLimiter:
    """A token bucket per key, in this process: ``rpm`` requests a minute on average, up to
    ``burst`` at once."""

    def __init__(self, rpm: float, burst: int) -> None:
        self.rate = rpm / 60.0
        self.burst = float(max(1, burst))
        self._buckets: dict[str, list[float]] = {}  # key id -> [tokens, updated]

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def ask(self, key_id: str) -> Verdict:
        answer: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        answer.set_result(self.take(key_id))
        return Verdict(answer, early=False)

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

    async def aclose(self) -> None:
        return None


class _Resp(asyncio.Protocol):
    """One connection to Redis: commands written in batches, one batch on the wire at a time
    (what arrives meanwhile goes as the next, in one write), replies parsed by hiredis and
    matched to the commands in order, as Redis answers them."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(replyError=redis.ResponseError)
        self.transport: asyncio.Transport | None = None
        self.sent: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.queued: list[tuple[bytes, asyncio.Future[Any]]] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(redis.ConnectionError("the connection to Redis is closed"))
        elif self.sent:
            self.queued.append((packed, future))
        else:
            self.sent.append(future)
            assert self.transport is not None
            self.transport.write(packed)
        return future

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        sent = self.sent
        try:
            while (reply := self.reader.gets()) is not False:
                future = sent.popleft()
                if not future.done():  # its caller gave up waiting
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # not in step with the commands
            self.abort(redis.ConnectionError(f"Redis's reply could not be read: {exc}"))
            return
        if not sent and self.queued:
            batch, self.queued = self.queued, []
            sent.extend(future for _, future in batch)
            assert self.transport is not None
            self.transport.write(b"".join(packed for packed, _ in batch))

    def connection_lost(self, exc: Exception | None) -> None:
        self.abort(redis.ConnectionError("Redis closed the connection"))

    def abort(self, error: Exception) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        waiting = [*self.sent, *(future for _, future in self.queued)]
        self.sent.clear()
        self.queued = []
        for future in waiting:
            if not future.done():
                future.set_exception(error)


class Pipeline:
    """Commands of concurrent callers on one Redis connection (``_Resp``): each costs one round
    trip and a few microseconds of CPU. redis-py's client takes a connection from its pool,
    retries and wraps per call: one rate-limit call alone cost 121 us of CPU through it against
    this one's 42, and 54 against 9 with 32 at once (``benchmarks/rate_limit.py``); through
    redis-py's connection object without its client, as here until 2026-12-04, 81-85 us.
    hiredis parses and packs; redis-py reads the URL (host, port, db, username, password, TLS)."""

    def __init__(self, url: str) -> None:
        options = parse_url(url)
        self.host, self.port = options.get("host", "localhost"), options.get("port", 6379)
        self.tls = options.get("connection_class") is SSLConnection
        self.handshake = [command for command in (
            ("AUTH", *filter(None, (options.get("username"), options["password"])))
            if options.get("password") else None,
            ("SELECT", options["db"]) if options.get("db") else None) if command]
        self.connection: _Resp | None = None
        self.connecting = asyncio.Lock()

    async def execute(self, *command: Any) -> Any:
        """The command's reply (an error reply raises its ``ResponseError``); raises
        ``redis.RedisError`` or ``OSError`` when Redis cannot be reached or is too slow."""
        connection = self.connection
        if connection is None or connection.closed:
            connection = await self._connect()
        reply = connection.send(hiredis.pack_command(command))
        timer = asyncio.get_running_loop().call_later(TIMEOUT, self._too_slow, connection, reply)
        try:
            result = await reply
        finally:
            timer.cancel()
        if isinstance(result, redis.ResponseError):
            raise (redis.exceptions.NoScriptError(*result.args)
                   if str(result).startswith("NOSCRIPT") else result)
        return result

    @staticmethod
    def _too_slow(connection: _Resp, reply: asyncio.Future[Any]) -> None:
        if not reply.done():  # the replies behind it are late too: a new connection next
            connection.abort(redis.TimeoutError("Redis answered too slowly"))

    async def _connect(self) -> _Resp:
        async with self.connecting:
            if self.connection is not None and not self.connection.closed:
                return self.connection  # another caller connected meanwhile
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(TIMEOUT):
                    _, connection = await loop.create_connection(
                        _Resp, self.host, self.port, ssl=self.tls or None)
                    for reply in [connection.send(hiredis.pack_command(command))
                                  for command in self.handshake]:
                        if isinstance(answer := await reply, redis.ResponseError):
                            connection.abort(answer)
                            raise answer
            except TimeoutError:
                raise redis.TimeoutError("no connection to Redis within the timeout") from None
            self.connection = connection
            return connection

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.abort(redis.ConnectionError("the pipeline was closed"))


class RedisRateLimiter:
    """The same limit, one bucket per key in Redis for every API process (GCRA above).

    Its answer is a round trip to Redis, as long as the rest of what the gateway adds to a
    request on a small machine. So a request of a key that Redis last left room for goes
    upstream while the answer is on its way (``Verdict.early``); the answer still decides, and
    a refused request is aborted at the engine before its answer is read. How many of a key's
    requests may go early is what Redis last said was left (``credit``), less this process's
    questions of that key still unanswered: a key at its limit waits for every answer, so an
    abusive client's excess never reaches an engine; only when several processes cross the
    limit at once can a few early requests be refused."""

    def __init__(self, url: str, rpm: float, burst: int) -> None:
        self.enabled = rpm > 0
        self.interval_us = max(1, round(60_000_000 / rpm)) if rpm > 0 else 0
        self.tolerance_us = self.interval_us * (max(1, burst) - 1)
        self.redis = Pipeline(url)
        self.sha = hashlib.sha1(GCRA.encode()).hexdigest()
        self._warned = 0.0
        self.credit: dict[str, int] = {}  # key id -> its requests that may go before the answer
        self.asking: dict[str, int] = {}  # key id -> its questions to Redis not yet answered

    def ask(self, key_id: str) -> Verdict:
        credit = self.credit.get(key_id, 0)
        if credit > 0:
            self.credit[key_id] = credit - 1
        return Verdict(asyncio.get_running_loop().create_task(self.take(key_id)), credit > 0)

    async def take(self, key_id: str) -> float | None:
        command = ("EVALSHA", self.sha, 1, BUCKET_PREFIX + key_id, self.interval_us,
                   self.tolerance_us)
        asking = self.asking
        asking[key_id] = asking.get(key_id, 0) + 1
        try:
            try:
                wait_us, left = await self.redis.execute(*command)
            except redis.exceptions.NoScriptError:  # Redis restarted, or SCRIPT FLUSH
                await self.redis.execute("SCRIPT", "LOAD", GCRA)
                wait_us, left = await self.redis.execute(*command)
        except (redis.RedisError, OSError) as exc:
            if time.monotonic() - self._warned > WARN_EVERY:
                self._warned = time.monotonic()
                log.warning("the rate limit's Redis cannot be reached (%s: %s): requests go on "
                            "without a limit until it can", type(exc).__name__, exc)
            self.credit.pop(key_id, None)
            return None
        finally:
            if asking[key_id] > 1:
                asking[key_id] -= 1
            else:
                del asking[key_id]
        if len(self.credit) > 100_000:
            self.credit.clear()
        self.credit[key_id] = max(0, left - asking.get(key_id, 0)) if not wait_us else 0
        return int(wait_us) / 1e6 if wait_us else None

    async def aclose(self) -> None:
        await self.redis.close()


def rate_limiter(settings: Settings) -> LocalRateLimiter | RedisRateLimiter:
    url = redis_url(settings)
    if url is None:
        return LocalRateLimiter(settings.gateway_rate_limit_rpm, settings.gateway_rate_limit_burst)
    return RedisRateLimiter(url, settings.gateway_rate_limit_rpm, settings.gateway_rate_limit_burst)


# --- revocations --------------------------------------------------------------------------------

def announce_revoked(settings: Settings, key_hash: str) -> None:
    """Tell every API process that the key with this hash is revoked (after the commit). Best
    effort: without Redis, each process sees it within its auth cache's TTL."""
    url = redis_url(settings)
    if url is None:
        return
    try:
        with redis.Redis.from_url(url, socket_timeout=TIMEOUT,
                                  socket_connect_timeout=TIMEOUT) as client:
            client.publish(REVOKED_CHANNEL, key_hash)
    except (redis.RedisError, OSError) as exc:
        log.warning("could not announce a revoked key (%s: %s): API processes refuse it within "
                    "their auth cache's TTL", type(exc).__name__, exc)


async def follow_revocations(url: str, revoked: Callable[[str | None], None]) -> None:
    """Call ``revoked(key_hash)`` for each announced revocation, until cancelled; after each
    (re)connection ``revoked(None)``: announcements may have been missed meanwhile."""
    delay = 0.5
    while True:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=TIMEOUT)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(REVOKED_CHANNEL)
                revoked(None)
                delay = 0.5
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is not None:
                        data = message["data"]
                        revoked(data.decode() if isinstance(data, bytes) else str(data))
        except (redis.RedisError, OSError) as exc:
            log.warning("not following key revocations (%s: %s); retrying in %.0f s",
                        type(exc).__name__, exc, delay)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)
