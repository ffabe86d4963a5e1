"""The gateway's auth cache (app.services.gateway.TTLCache): an invalidation (a revoked key
announced by Redis) is not undone by a load that was already under way."""

from __future__ import annotations

import asyncio
import threading

from app.services.gateway import TTLCache


def test_a_load_under_way_when_its_key_is_invalidated_is_not_kept() -> None:
    release = threading.Event()
    loads: list[str] = []

    def loader(key: str) -> int:
        loads.append(key)
        release.wait(10)
        return len(loads)

    async def scenario() -> tuple[int, int, int]:
        cache: TTLCache[str, int] = TTLCache(loader, ttl=60)
        pending = asyncio.ensure_future(cache.get("k"))
        while not loads:  # the load runs in a thread, with the key's old state
            await asyncio.sleep(0.01)
        cache.invalidate("k")  # meanwhile the key was revoked
        release.set()
        first = await pending  # the request that was waiting gets what the load read
        second = await cache.get("k")  # but the next one loads again
        third = await cache.get("k")  # and that load is kept
        await cache.aclose()
        return first, second, third

    assert asyncio.run(scenario()) == (1, 2, 2)
    assert loads == ["k", "k"]
