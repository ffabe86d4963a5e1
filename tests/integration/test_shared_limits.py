"""Limits shared by several API processes (app.services.limits): two `specdeck api` processes on
one Postgres database and one Redis enforce one rate limit per key between them, and both refuse
a revoked key at once (long before their auth caches expire); a Redis that cannot be reached
lets requests through (fail open) and is said in the log."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import Stack
from tests.integration.test_gateway import make_key
from tests.support.api_server import start_api, stop_api

BURST = 5
AUTH_CACHE_SECONDS = 300  # a revoked key refused within a second is the announcement's doing


@pytest.fixture
def apis(pg_stack: Stack, tmp_path: Path) -> Iterator[list[str]]:
    """Two API processes on one database and one Redis. One request a minute after the burst:
    no token comes back while the test runs, however slow the machine."""
    env = {**os.environ, **pg_stack.env, "SPECDECK_GATEWAY_RATE_LIMIT_RPM": "1",
           "SPECDECK_GATEWAY_RATE_LIMIT_BURST": str(BURST),
           "SPECDECK_GATEWAY_AUTH_CACHE_SECONDS": str(AUTH_CACHE_SECONDS)}
    started = []
    try:
        for name in ("api-1", "api-2"):
            started.append(start_api(env, tmp_path / f"{name}.log"))
        yield [url for url, _ in started]
    finally:
        for _, proc in started:
            stop_api(proc)


def models(url: str, raw_key: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {raw_key}"}, timeout=30)


def test_one_rate_limit_per_key_across_two_api_processes(apis: list[str], pg_stack: Stack) -> None:
    # Redis forgets its scripts (a restart, SCRIPT FLUSH): the limiter loads its script again.
    with redis.Redis.from_url(pg_stack.env["SPECDECK_BROKER_URL"]) as client:
        client.script_flush()
    key = make_key()
    answers = [models(apis[i % 2], key.plaintext) for i in range(BURST + 4)]
    assert [a.status_code for a in answers] == [200] * BURST + [429] * 4, \
        [(a.status_code, a.text[:100]) for a in answers]
    for refused in answers[BURST:]:
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
    # Another key has a bucket of its own, on either process.
    other = make_key()
    assert [models(url, other.plaintext).status_code for url in apis] == [200, 200]


def test_a_revoked_key_is_refused_by_every_api_process_at_once(apis: list[str]) -> None:
    admin = make_key()
    created = httpx.post(f"{apis[0]}/api/keys", json={"name": "doomed"}, timeout=30,
                         headers={"Authorization": f"Bearer {admin.plaintext}"})
    assert created.status_code == 201, created.text
    doomed = created.json()
    # Both processes have the key in their auth cache (for AUTH_CACHE_SECONDS).
    assert [models(url, doomed["key"]).status_code for url in apis] == [200, 200]

    revoked = httpx.delete(f"{apis[0]}/api/keys/{doomed['id']}", timeout=30,
                           headers={"Authorization": f"Bearer {admin.plaintext}"})
    assert revoked.status_code == 200, revoked.text
    since = time.monotonic()
    refused_after = {}
    while len(refused_after) < len(apis) and time.monotonic() - since < 10:
        for url in apis:
            if url not in refused_after and models(url, doomed["key"]).status_code == 401:
                refused_after[url] = time.monotonic() - since
        time.sleep(0.02)
    assert set(refused_after) == set(apis), refused_after
    assert max(refused_after.values()) <= 1.0, refused_after
    assert all(models(url, admin.plaintext).status_code == 200 for url in apis)  # the others live on


def test_a_redis_that_cannot_be_reached_fails_open(pg_stack: Stack, tmp_path: Path) -> None:
    log = tmp_path / "api.log"
    env = {**os.environ, **pg_stack.env, "SPECDECK_BROKER_URL": "redis://127.0.0.1:1/0",
           "SPECDECK_GATEWAY_RATE_LIMIT_RPM": "1", "SPECDECK_GATEWAY_RATE_LIMIT_BURST": "1"}
    url, proc = start_api(env, log)
    try:
        key = make_key()
        assert [models(url, key.plaintext).status_code for _ in range(3)] == [200] * 3  # no limit
    finally:
        stop_api(proc)
    assert "the rate limit's Redis cannot be reached" in log.read_text()
