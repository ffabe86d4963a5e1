"""The rate limit's Redis pipeline (``Pipeline`` in app/services/limits.py) against the real Redis:
concurrent callers' commands share one connection and each gets its own reply; an error reply
fails only its own command; a connection Redis closed is replaced; a Redis that cannot be
reached fails every waiting command with a Redis error, and nobody is left waiting."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid

import redis
from redis.asyncio.connection import parse_url

from app.services.limits import Pipeline

REDIS_URL = os.environ.get("SPECDECK_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def pipeline(url: str = REDIS_URL) -> Pipeline:
    return Pipeline(url)


def test_concurrent_commands_each_get_their_own_reply_on_one_connection() -> None:
    prefix = f"specdeck-test:{uuid.uuid4().hex}:"

    async def run() -> None:
        redis_ = pipeline()
        try:
            replies = await asyncio.gather(*(redis_.execute("INCRBY", prefix + str(i % 7), i)
                                             for i in range(200)))
            totals: dict[int, int] = {}
            for i, reply in enumerate(replies):
                totals[i % 7] = totals.get(i % 7, 0) + i
                assert reply == totals[i % 7], (i, reply)  # in order, per key
            # On the URL's database (SELECT in the handshake).
            db = parse_url(REDIS_URL).get("db", 0)
            assert f" db={db} ".encode() in await redis_.execute("CLIENT", "INFO")
            # One connection for all of them: the pipeline never opens a second.
            assert len(set(await asyncio.gather(*(redis_.execute("CLIENT", "ID")
                                                  for _ in range(50))))) == 1
            # An error reply fails its own command only, wherever it is in a batch.
            results = await asyncio.gather(
                redis_.execute("INCRBY", prefix + "x", 1),
                redis_.execute("INCRBY", prefix + "x", "not a number"),
                redis_.execute("INCRBY", prefix + "x", 2), return_exceptions=True)
            assert results[0] == 1 and results[2] == 3
            assert isinstance(results[1], redis.ResponseError)
        finally:
            await redis_.execute("DEL", *(prefix + k for k in [*map(str, range(7)), "x"]))
            await redis_.close()

    asyncio.run(run())


def test_a_connection_redis_closed_is_replaced() -> None:
    async def run() -> None:
        redis_ = pipeline()
        try:
            own = await redis_.execute("CLIENT", "ID")
            with redis.Redis.from_url(REDIS_URL) as admin:
                assert admin.client_kill_filter(_id=own) == 1
            # At most the command sent before the close was seen fails; the next get a new one.
            with contextlib.suppress(redis.ConnectionError, OSError):
                await redis_.execute("PING")
            assert await redis_.execute("ECHO", "back") == b"back"
            assert await redis_.execute("CLIENT", "ID") != own
        finally:
            await redis_.close()

    asyncio.run(run())


def test_an_unreachable_redis_fails_every_waiting_command() -> None:
    async def run() -> None:
        redis_ = pipeline("redis://127.0.0.1:1/0")
        results = await asyncio.wait_for(asyncio.gather(
            *(redis_.execute("PING") for _ in range(5)), return_exceptions=True), 10)
        assert all(isinstance(r, (redis.RedisError, OSError)) for r in results), results
        assert redis_.connection is None

    asyncio.run(run())
