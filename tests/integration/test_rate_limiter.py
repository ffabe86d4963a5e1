"""The shared rate limit (``RedisRateLimiter`` in app/services/limits.py) against the real Redis:
a key with room to spare is taken several tokens at a time, and the next requests of that
process go without asking; a key near its limit is asked for each request; held tokens never
let a key past its limit, whatever the processes; unused ones go back after ``HOLD`` and when the
limiter closes. How much of a key's bucket is used is read from Redis itself: at one request a
minute, each request taken moves the bucket's time by one minute."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable

import redis

from app.services.limits import BUCKET_PREFIX, RedisRateLimiter, Verdict

REDIS_URL = os.environ.get("SPECDECK_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
RPM = 1  # no token comes back while a test runs


def taken(key_id: str) -> int:
    """Requests taken from the key's bucket (its bucket starts full: none)."""
    with redis.Redis.from_url(REDIS_URL) as client:
        tat = client.get(BUCKET_PREFIX + key_id)
        if tat is None:
            return 0
        seconds, micros = client.time()
    return round((int(tat) - (seconds * 1_000_000 + micros)) / 60_000_000)


async def decide(limiter: RedisRateLimiter, key_id: str) -> tuple[bool, bool]:
    """(may go, asked Redis)."""
    verdict: Verdict | None = limiter.ask(key_id)
    if verdict is None:
        return True, False
    return await verdict.wait() is None, True


def run(test: Callable[..., Awaitable[None]], burst: int, processes: int = 1) -> None:
    key_id = f"test-{uuid.uuid4().hex}"

    async def main() -> None:
        limiters = [RedisRateLimiter(REDIS_URL, RPM, burst) for _ in range(processes)]
        try:
            await test(key_id, *limiters)
        finally:
            for limiter in limiters:
                await limiter.aclose()
            with redis.Redis.from_url(REDIS_URL) as client:
                client.delete(BUCKET_PREFIX + key_id)

    asyncio.run(main())


def test_a_key_with_room_is_taken_a_batch_at_a_time() -> None:
    async def test(key_id: str, limiter: RedisRateLimiter) -> None:
        # The first request asks for itself; Redis says what is left (999).
        assert await decide(limiter, key_id) == (True, True) and taken(key_id) == 1
        # The next takes a batch: a process takes at most an eighth of what is left.
        assert await decide(limiter, key_id) == (True, True)
        assert taken(key_id) == 1 + RedisRateLimiter.BATCH_MAX
        # The batch's other tokens: no question to Redis, nothing more taken there.
        for _ in range(RedisRateLimiter.BATCH_MAX - 1):
            assert await decide(limiter, key_id) == (True, False)
        assert taken(key_id) == 1 + RedisRateLimiter.BATCH_MAX
        assert await decide(limiter, key_id) == (True, True)  # the next batch
        assert taken(key_id) == 1 + 2 * RedisRateLimiter.BATCH_MAX
        # Closing gives back what this process held and did not use: the key has used the
        # first request, the first batch, and two of the second.
        assert await decide(limiter, key_id) == (True, False)
        await limiter.aclose()
        assert taken(key_id) == 1 + RedisRateLimiter.BATCH_MAX + 2

    run(test, burst=1000)


def test_a_key_near_its_limit_is_asked_for_each_request() -> None:
    burst = RedisRateLimiter.BATCH_SHARE

    async def test(key_id: str, limiter: RedisRateLimiter) -> None:
        answers = [await decide(limiter, key_id) for _ in range(burst + 2)]
        assert answers == [(True, True)] * burst + [(False, True)] * 2
        assert taken(key_id) == burst

    run(test, burst=burst)


def test_tokens_held_never_let_a_key_past_its_limit_across_processes() -> None:
    burst = 100

    async def test(key_id: str, *limiters: RedisRateLimiter) -> None:
        allowed = 0
        for i in range(3 * burst):  # the processes in turn, then all at once
            allowed += (await decide(limiters[i % len(limiters)], key_id))[0]
        together = await asyncio.gather(*(decide(limiters[i % len(limiters)], key_id)
                                          for i in range(60)))
        allowed += sum(ok for ok, _ in together)
        assert allowed == burst  # not one more; and each token taken was used
        assert taken(key_id) == burst
        assert not any(limiter.held for limiter in limiters)

    run(test, burst=burst, processes=3)


def test_held_tokens_unused_for_hold_seconds_go_back() -> None:
    async def test(key_id: str, limiter: RedisRateLimiter) -> None:
        limiter.HOLD = 0.2
        keeper = asyncio.get_running_loop().create_task(limiter.give_back_idle())
        try:
            await decide(limiter, key_id)
            await decide(limiter, key_id)  # a batch: one used, the rest held
            assert taken(key_id) == 1 + RedisRateLimiter.BATCH_MAX
            for _ in range(40):
                await asyncio.sleep(0.05)
                if taken(key_id) == 2:
                    break
            assert taken(key_id) == 2 and not limiter.held
            # Given back, they are the key's again: the next request asks Redis.
            assert await decide(limiter, key_id) == (True, True)
        finally:
            keeper.cancel()

    run(test, burst=1000)
