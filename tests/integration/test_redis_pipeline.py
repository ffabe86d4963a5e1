"""The rate limit's Redis pipeline (``Pipeline`` in app/services/limits.py, on redis-py's asyncio
client) against the real Redis: concurrent callers' commands each get their own reply, in order
per key, also through ``send``'s callbacks; an error reply fails only its own command; a
connection Redis closed is replaced; a Redis that cannot be reached fails every waiting command
with a Redis error, and nobody is left waiting."""

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


def test_concurrent_commands_each_get_their_own_reply() -> None:
    prefix = f"specdeck-test:{uuid.uuid4().hex}:"

    async def run() -> None:
        redis_ = pipeline()
        try:
            replies = await asyncio.gather(*(redis_.execute("INCRBY", prefix + str(i % 7), 1)
                                             for i in range(200)))
            for key in range(7):  # each command its own reply: every count once, per key
                counts = sorted(reply for i, reply in enumerate(replies) if i % 7 == key)
                assert counts == list(range(1, len(counts) + 1)), (key, counts)
            # On the URL's database.
            db = parse_url(REDIS_URL).get("db", 0)
            assert f" db={db} ".encode() in await redis_.execute("CLIENT", "INFO")
            # The callbacks of send: each its own reply.
            loop = asyncio.get_running_loop()
            answers = [loop.create_future() for _ in range(20)]
            for i, answer in enumerate(answers):
                redis_.send(answer.set_result, "INCRBY", prefix + "s", 1)
            assert sorted(await asyncio.gather(*answers)) == list(range(1, 21))
            # An error reply fails its own command only, wherever it is in a batch.
            results = await asyncio.gather(
                redis_.execute("INCRBY", prefix + "x", 1),
                redis_.execute("INCRBY", prefix + "x", "not a number"),
                redis_.execute("INCRBY", prefix + "x", 2), return_exceptions=True)
            assert results[0] == 1 and results[2] == 3
            assert isinstance(results[1], redis.ResponseError)
        finally:
            await redis_.execute("DEL", *(prefix + k for k in [*map(str, range(7)), "x", "s"]))
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
        failed = asyncio.get_running_loop().create_future()
        redis_.send(failed.set_result, "PING")
        assert isinstance(await asyncio.wait_for(failed, 10), (redis.RedisError, OSError))
        await redis_.close()

    asyncio.run(run())
