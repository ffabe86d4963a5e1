"""Per-key rate limits and key revocations, shared by every API process.

With Redis (the broker of a Postgres + Redis install, ``SPECDECK_BROKER_URL=redis://...``):

* a key's rate limit is one bucket in Redis, checked and updated by one atomic script on Redis's
  own clock (GCRA: the bucket is the time at which it is next full), so any number of API
  processes, on any number of hosts, enforce exactly one limit per key; a process takes a key
  with room to spare a few requests at a time (``RedisRateLimiter``: never over the limit);
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
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.asyncio.retry import Retry
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
# tolerance, (burst - 1) x ARGV[1]; ARGV[3]: n, the requests to take (n >= 1), or minus those
# taken earlier and not used, to give back. Taking returns {0, the requests taken (1 to n),
# the requests that would still be taken now} or, when not even one may go, {the µs until one
# may, 0, 0}.
GCRA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if n < 0 then
  tat = tat + n * interval
  if tat <= now then redis.call('DEL', KEYS[1]) else
    redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  end
  return {0, 0, 0}
end
local available = math.floor((now + tolerance - tat) / interval) + 1
if available < 1 then return {math.ceil(tat - tolerance - now), 0, 0} end
local taken = math.min(n, available)
local next_tat = tat + taken * interval
redis.call('SET', KEYS[1], string.format('%d', next_tat), 'PX', math.ceil((next_tat - now) / 1000) + 1)
return {0, taken, available - taken}
"""


def redis_url(settings: Settings) -> str | None:
    """Where limits and revocations are shared: the broker, when it is Redis."""
    url = settings.broker_url
    return url if url.startswith(("redis://", "rediss://")) else None


class Verdict:
    """The rate limit's answer on one request, asked for as the request comes in: ``result``
    is None (it may go) or the seconds until one could, once ``answered``; ``wait()`` waits for
    it. ``early``: the request may be sent upstream before the answer arrives
    (``RedisRateLimiter.ask``); it is awaited before the upstream's answer, and a refusal aborts
    the request there. No task or future is made unless someone has to wait for the answer."""

    __slots__ = ("result", "answered", "early", "checked", "waiter")

    def __init__(self, early: bool = False) -> None:
        self.early = early
        self.result: float | None = None
        self.answered = False
        self.checked = False  # acted on already (``app.api.openai.enforce``)
        self.waiter: asyncio.Future[None] | None = None

    def answer(self, result: float | None) -> None:
        self.result, self.answered = result, True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> float | None:
        if not self.answered:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.result


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

    def ask(self, key_id: str) -> Verdict | None:
        """None when one more request of the key may go; else the (answered) refusal."""
        wait = self.take(key_id)
        if wait is None:
            return None
        verdict = Verdict()
        verdict.answer(wait)
        return verdict

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


Reply = Callable[[Any], None]  # called with a command's reply, or the exception it failed with


class Pipeline:
    """Redis commands of concurrent callers on redis-py's asyncio client (a pool of up to
    ``CONNECTIONS``, hiredis parsing the replies): ``send`` hands a command's reply (or the error it failed with)
    to a callback, so the rate limit asks without waiting on each answer itself. A command
    unanswered within ``TIMEOUT`` fails, without retries: the limit fails open instead."""

    CONNECTIONS = 16  # at most; a command waits up to TIMEOUT for one of them

    def __init__(self, url: str) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=self.CONNECTIONS, timeout=TIMEOUT, socket_timeout=TIMEOUT,
            socket_connect_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0))
        self.client = aioredis.Redis.from_pool(pool)  # closed with it
        self.sent: set[asyncio.Future[Any]] = set()  # commands on their way

    def send(self, reply: Reply, *command: Any) -> None:
        """Send ``command`` now; ``reply`` gets its reply, an error reply's ``ResponseError``,
        or the ``redis.RedisError`` or ``OSError`` that means Redis could not be reached or was
        too slow. Called on the event loop."""
        def answered(done: asyncio.Future[Any]) -> None:
            if done.cancelled():
                reply(redis.ConnectionError("the pipeline was closed"))
            elif (error := done.exception()) is not None:
                reply(error if isinstance(error, (redis.RedisError, OSError)) else
                      redis.ConnectionError(f"Redis could not be asked: {error!r}"))
            else:
                reply(done.result())

        sent = asyncio.ensure_future(self.client.execute_command(*command))
        self.sent.add(sent)
        sent.add_done_callback(self.sent.discard)
        sent.add_done_callback(answered)

    async def execute(self, *command: Any) -> Any:
        """The command's reply (an error reply raises its ``ResponseError``); raises
        ``redis.RedisError`` or ``OSError`` when Redis cannot be reached or is too slow."""
        return await self.client.execute_command(*command)

    async def close(self) -> None:
        """Once the commands sent have been answered (at most ``TIMEOUT`` more)."""
        if self.sent:
            await asyncio.wait(set(self.sent), timeout=TIMEOUT)
        await self.client.aclose()


class RedisRateLimiter:
    """The same limit, one bucket per key in Redis for every API process (GCRA above).

    Asking Redis is a round trip per request, and on a small VM its CPU (a write that wakes
    Redis, a read, Redis's own turn) is a third of what the gateway adds to a request. So:

    * **Tokens taken ahead.** A key with room to spare is asked for up to ``BATCH_MAX``
      requests at once, and at most one ``BATCH_SHARE``-th of what it has left: the next ones of
      this process go without asking (``held``). Tokens held and not used within ``HOLD``
      seconds are given back (``give_back_idle``), and all of them when the process stops. A
      key is never over its limit (a token is taken in Redis before its request goes); while
      another process holds some of its tokens, this one may refuse that many early, for at
      most ``HOLD`` seconds, and only when the key had room for a batch a moment before. A key
      with less than ``BATCH_SHARE`` requests left is asked for each: near the limit, every
      process sees the same bucket.
    * **The answer on the way.** A request that must ask goes upstream while the answer is on
      its way when Redis last left the key room (``Verdict.early``); the answer still decides,
      and a refused request is aborted at the engine before its answer is read. How many of a
      key's requests may go early is what Redis last said was left (``credit``), less this
      process's questions of that key still unanswered: a key at its limit waits for every
      answer, so an abusive client's excess never reaches an engine; only when several
      processes cross the limit at once can a few early requests be refused."""

    BATCH_MAX = 32
    BATCH_SHARE = 8
    HOLD = 1.0  # seconds

    def __init__(self, url: str, rpm: float, burst: int) -> None:
        self.enabled = rpm > 0
        self.interval_us = max(1, round(60_000_000 / rpm)) if rpm > 0 else 0
        self.tolerance_us = self.interval_us * (max(1, burst) - 1)
        self.redis = Pipeline(url)
        self.sha = hashlib.sha1(GCRA.encode()).hexdigest()
        self._warned = 0.0
        self.held: dict[str, int] = {}  # key id -> tokens taken from its bucket, not used yet
        self.held_since: dict[str, float] = {}  # key id -> when the tokens it holds were taken
        self.credit: dict[str, int] = {}  # key id -> its requests that may go before the answer
        self.asking: dict[str, int] = {}  # key id -> its questions to Redis not yet answered
        self.batching: set[str] = set()  # key ids with a question for several tokens on its way

    def ask(self, key_id: str) -> Verdict | None:
        """The verdict on one more request of the key: None when it may go at once (a token
        this process held), else one whose question to Redis is on its way."""
        held = self.held.get(key_id)
        if held:
            if held > 1:
                self.held[key_id] = held - 1
            else:
                del self.held[key_id], self.held_since[key_id]
            return None
        credit = self.credit.get(key_id, 0)
        if credit > 0:
            self.credit[key_id] = credit - 1
        wanted = 1
        if key_id not in self.batching:
            wanted = max(1, min(self.BATCH_MAX, credit // self.BATCH_SHARE))
            if wanted > 1:
                self.batching.add(key_id)
        verdict = Verdict(early=credit > 0)
        self.asking[key_id] = self.asking.get(key_id, 0) + 1
        self._send(key_id, wanted, functools.partial(self._answered, key_id, verdict, wanted))
        return verdict

    def _send(self, key_id: str, n: int, reply: Reply, script: bool = False) -> None:
        """GCRA on the key's bucket (``n`` < 0: give back), by its SHA or (``script``) whole."""
        self.redis.send(reply, *(("EVAL", GCRA) if script else ("EVALSHA", self.sha)), 1,
                        BUCKET_PREFIX + key_id, self.interval_us, self.tolerance_us, n)

    def _answered(self, key_id: str, verdict: Verdict, wanted: int, reply: Any,
                  loaded: bool = False) -> None:
        if isinstance(reply, redis.exceptions.NoScriptError) and not loaded:
            # Redis restarted, or SCRIPT FLUSH: the script whole, once
            self._send(key_id, wanted, functools.partial(
                self._answered, key_id, verdict, wanted, loaded=True), script=True)
            return
        if wanted > 1:
            self.batching.discard(key_id)
        asking = self.asking
        if asking[key_id] > 1:
            asking[key_id] -= 1
        else:
            del asking[key_id]
        if not isinstance(reply, Exception):
            try:
                wait_us, taken, left = int(reply[0]), int(reply[1]), int(reply[2])
            except (TypeError, ValueError, IndexError):
                reply = redis.ResponseError(f"the rate limit's script answered {reply!r}")
        if isinstance(reply, Exception):
            self._unreachable(reply)
            self.credit.pop(key_id, None)
            verdict.answer(None)
            return
        if len(self.credit) > 100_000:
            self.credit.clear()
        self.credit[key_id] = max(0, left - asking.get(key_id, 0)) if not wait_us else 0
        if taken > 1:
            if key_id not in self.held:
                self.held_since[key_id] = time.monotonic()
            self.held[key_id] = self.held.get(key_id, 0) + taken - 1
        verdict.answer(wait_us / 1e6 if wait_us else None)

    def _unreachable(self, error: Exception) -> None:
        if time.monotonic() - self._warned > WARN_EVERY:
            self._warned = time.monotonic()
            log.warning("the rate limit's Redis cannot be reached (%s: %s): requests go on "
                        "without a limit until it can", type(error).__name__, error)

    def give_back(self, older_than: float = 0.0) -> int:
        """Give back the held tokens taken more than ``older_than`` seconds ago (the unused
        rest of a batch); returns how many keys had some."""
        now, given = time.monotonic(), 0
        for key_id, since in list(self.held_since.items()):
            if now - since < older_than:
                continue
            del self.held_since[key_id]
            held = self.held.pop(key_id, 0)
            if held > 0:
                given += 1
                self._send(key_id, -held, self._given_back, script=True)
        return given

    def _given_back(self, reply: Any) -> None:
        if isinstance(reply, Exception):
            self._unreachable(reply)

    async def give_back_idle(self) -> None:
        """Until cancelled: every ``HOLD / 2`` seconds, give back the tokens held for longer
        than ``HOLD``."""
        while True:
            await asyncio.sleep(self.HOLD / 2)
            self.give_back(self.HOLD)

    async def take(self, key_id: str) -> float | None:
        """None if one more request of the key may go now; otherwise the seconds until one
        could (``ask``, awaited)."""
        verdict = self.ask(key_id)
        return None if verdict is None else await verdict.wait()

    async def aclose(self) -> None:
        """Gives back the tokens held, then closes once Redis has answered (at most
        ``TIMEOUT``)."""
        self.give_back()
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
