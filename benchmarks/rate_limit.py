"""The shared rate limit's cost: one ``RedisRateLimiter.take`` (app/services/limits.py, the
gateway's ``Pipeline`` on an asyncio protocol with hiredis) asking Redis at every call (as for
a key near its limit), the same limiter as the gateway runs it for a key with room to spare
(tokens taken up to ``BATCH_MAX`` at a time), and the same script through redis-py's own asyncio
client (``redis.asyncio.Redis.evalsha``, hiredis installed), in one run against the local Redis:
one call at a time, and 32 at once (as under load, where the pipeline batches), per call: wall
time and this process's CPU time. Prints each over redis-py's.

    .venv/bin/python benchmarks/rate_limit.py [--calls 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _stack import load, machine, wall_cpu_table  # noqa: E402

from app.services.limits import BUCKET_PREFIX, GCRA, RedisRateLimiter  # noqa: E402

REDIS_URL = os.environ.get("SPECDECK_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
RPM, BURST = 100_000_000, 1_000_000  # never refuses: every call does the whole script


async def ours(key: str) -> tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[None]]]:
    """Every call asks Redis (no tokens taken ahead): what a key near its limit costs."""
    limiter = RedisRateLimiter(REDIS_URL, RPM, BURST)
    limiter.BATCH_MAX = 1
    return (lambda: limiter.take(key)), limiter.aclose


async def batched(key: str) -> tuple[Callable[[], Awaitable[object]],
                                     Callable[[], Awaitable[None]]]:
    """As the gateway asks for a key with room to spare: up to BATCH_MAX tokens at a time."""
    limiter = RedisRateLimiter(REDIS_URL, RPM, BURST)
    return (lambda: limiter.take(key)), limiter.aclose


async def redis_py(key: str) -> tuple[Callable[[], Awaitable[object]],
                                      Callable[[], Awaitable[None]]]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
    sha = await client.script_load(GCRA)
    limiter = RedisRateLimiter(REDIS_URL, RPM, BURST)
    args = (BUCKET_PREFIX + key, limiter.interval_us, limiter.tolerance_us, 1)
    return (lambda: client.evalsha(sha, 1, *args)), client.aclose


async def measure(make: Callable[[str], Awaitable[tuple[Callable[[], Awaitable[object]],
                                                          Callable[[], Awaitable[None]]]]],
                  calls: int, together: int) -> tuple[float, float]:
    key = f"bench-{uuid.uuid4().hex}"
    call, close = await make(key)
    try:
        for _ in range(200):
            await call()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls // together):
            if together == 1:
                await call()
            else:
                await asyncio.gather(*(call() for _ in range(together)))
        done = calls // together * together
        return (time.perf_counter() - wall) / done, (time.process_time() - cpu) / done
    finally:
        await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import uvloop

    uvloop.install()
    before = load()
    clients = {"specdeck": ours, "specdeck, batches": batched, "redis-py": redis_py}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for together in (1, 32):
            for name, make in clients.items():
                wall, cpu = asyncio.run(measure(make, args.calls, together))
                results.setdefault((f"{together} at once", name), []).append((wall, cpu))
                print(f"  round {r + 1}, {together} at once, {name}: {wall * 1e6:.1f} us wall, "
                      f"{cpu * 1e6:.1f} us CPU a call", flush=True)
    print(f"\n{machine()}; 1-minute load average {before:.2f} before, {load():.2f} after")
    print(f"{args.calls} calls a round, {args.rounds} rounds; medians\n")
    print(wall_cpu_table(results, [f"{n} at once" for n in (1, 32)], list(clients), "calls"))

if __name__ == "__main__":
    main()
