"""Deployment replicas through the gateway, end to end over real HTTP: the real ``openai`` SDK
(and raw httpx) -> a real ``specdeck api`` process -> two upstream fixtures
(``tests/support/upstream.py``), on Postgres and on SQLite, with test_gateway.py's fixtures.

A replica is a deployments row naming its deployment in ``replica_of``; here it is made by
test_gateway.py's ``deploy`` and then named a replica (before the project's routes are first
asked for, so no gateway ever sees it as a deployment of its own).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from tests.integration.test_gateway import (  # noqa: F401 (gateway, upstream: fixtures)
    MESSAGES,
    UPSTREAM_KEY,
    Gateway,
    Key,
    assert_error,
    control,
    deploy,
    gateway,
    make_key,
    tag,
    upstream,
    usage_rows,
)
from tests.support.upstream import Upstream, free_port
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def second() -> Iterator[Upstream]:
    """Another engine, for the replicas."""
    with Upstream(UPSTREAM_KEY, models=["any"]) as server:
        yield server


def add_replica(gateway: Gateway, key: Key, deployment_id: str, name: str, index: int,
                status: str = "ready", *, upstream_url: str | None = None) -> str:
    """Replica ``index`` of the deployment, moved to ``status`` as the workers move it."""
    from app.db import session_scope

    row = deploy(gateway, key, name, status, upstream_url=upstream_url)
    with session_scope() as session:
        session.execute(sa.text("UPDATE deployments SET replica_of = :of, replica = :index "
                                "WHERE id = :id"), {"of": deployment_id, "index": index, "id": row})
    return row


def project_keys(n: int) -> list[Key]:
    """``n`` keys of one new project: each has its own rate-limit bucket (10 requests here)."""
    project = f"gw-{uuid.uuid4().hex[:8]}"
    return [make_key(project) for _ in range(n)]


def dead_url() -> str:
    """An upstream address that refuses connections (nothing listens on the port)."""
    return f"http://127.0.0.1:{free_port()}"


def test_sequential_requests_alternate_between_the_ready_replicas(
        gateway: Gateway, second: Upstream) -> None:
    keys = project_keys(5)
    deployment = deploy(gateway, keys[0], "m")
    add_replica(gateway, keys[0], deployment, "m", 1, upstream_url=second.url)
    label = tag()
    sdks = itertools.cycle([gateway.sdk(key) for key in keys])
    for _ in range(40):
        assert next(sdks).chat.completions.create(
            model="m", messages=MESSAGES, extra_body=control(tag=label)).usage
    first, other = len(gateway.upstream.requests(label)), len(second.requests(label))
    assert first + other == 40 and 18 <= first <= 22, (first, other)
    assert all(r["authorized"] for r in second.requests(label))  # the replica's own key
    # Usage names the deployment, whichever replica served.
    wait_for(lambda: len(usage_rows(keys[0].project_id)) >= 40, what="40 usage rows")
    rows = usage_rows(keys[0].project_id)
    assert len(rows) == 40 and {r.deployment_id for r in rows} == {deployment}


def test_a_request_goes_to_the_replica_with_fewer_requests_in_flight(
        gateway: Gateway, second: Upstream) -> None:
    key = make_key()
    deployment = deploy(gateway, key, "m")
    add_replica(gateway, key, deployment, "m", 1, upstream_url=second.url)
    held, quick, after = tag(), tag(), tag()
    sdk = gateway.sdk(key)
    # A stream that would take 4 s stays in flight on one replica while the others are sent.
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key.plaintext}"},
            json={"model": "m", "messages": MESSAGES, "stream": True,
                  **control(tag=held, tokens=20, delay=0.2)}) as stream:
        assert stream.status_code == 200
        busy, idle = ((gateway.upstream, second) if gateway.upstream.requests(held)
                      else (second, gateway.upstream))
        for _ in range(6):
            sdk.chat.completions.create(model="m", messages=MESSAGES,
                                        extra_body=control(tag=quick))
        assert len(idle.requests(quick)) == 6 and busy.requests(quick) == []
    # Closed: no longer in flight once the gateway has closed it (the upstream sees that), and
    # the busy replica, picked longest ago, gets the next request.
    wait_for(lambda: busy.requests(held)[0]["disconnected"], what="the stream to be closed")
    sdk.chat.completions.create(model="m", messages=MESSAGES, extra_body=control(tag=after))
    assert len(busy.requests(after)) == 1


def test_a_replica_that_refuses_connections_is_ejected_and_its_requests_retried(
        gateway: Gateway) -> None:
    keys = project_keys(3)
    sdks = itertools.cycle([gateway.sdk(key) for key in keys])
    # The deployment's own row refuses; its replica answers. The first request goes to replica
    # 0 (neither was picked yet): refused, then retried on replica 1.
    dead = {"plain": dead_url(), "streamed": dead_url()}
    for name, url in dead.items():
        add_replica(gateway, keys[0], deploy(gateway, keys[0], name, upstream_url=url), name, 1)
    label = tag()
    for name, stream, count in (("plain", False, 20), ("streamed", True, 5)):
        for _ in range(count):
            response = next(sdks).chat.completions.create(
                model=name, messages=MESSAGES, stream=stream, extra_body=control(tag=label))
            if stream:
                assert "".join(c.choices[0].delta.content or "" for c in response)
            else:
                assert response.choices[0].message.content
        # Each ejection is logged. Ejected for 5 s after its first refusal, it is tried again
        # only if this took longer (without ejection, every other request would try it).
        ejections = gateway.log.read_text(errors="replace").count(f"upstream {dead[name]}/")
        assert 1 <= ejections <= 2, gateway.output()
    assert len(gateway.upstream.requests(label)) == 25


def test_no_reachable_replica_is_503(gateway: Gateway, second: Upstream) -> None:
    key = make_key()
    # Every replica refuses (the retry too); the only ready replica refuses; the only ready
    # replica has an address the gateway cannot use.
    both = deploy(gateway, key, "both-dead", upstream_url=dead_url())
    add_replica(gateway, key, both, "both-dead", 1, upstream_url=dead_url())
    only = deploy(gateway, key, "only-dead", "starting", upstream_url=second.url)
    add_replica(gateway, key, only, "only-dead", 1, upstream_url=dead_url())
    deploy(gateway, key, "unusable", upstream_url="ftp://127.0.0.1:21")
    label = tag()
    for name in ("both-dead", "only-dead", "unusable"):
        for stream in (False, True):
            response = gateway.chat(key, model=name, stream=stream, **control(tag=label))
            assert_error(response, 503, "upstream_unavailable")
            assert int(response.headers["retry-after"]) >= 1
    assert second.requests(label) == []


def test_replicas_that_are_not_ready_get_no_traffic(gateway: Gateway, second: Upstream) -> None:
    key = make_key()
    # Ready, with a starting and a failed replica: only its own row serves.
    serving = deploy(gateway, key, "m")
    add_replica(gateway, key, serving, "m", 1, "starting", upstream_url=second.url)
    add_replica(gateway, key, serving, "m", 2, "failed", upstream_url=second.url)
    # Its own row starting (a restart), its replica ready: the deployment is ready.
    restarting = deploy(gateway, key, "restarting", "starting")
    add_replica(gateway, key, restarting, "restarting", 1, upstream_url=second.url)
    sdk = gateway.sdk(key)
    assert [m.id for m in sdk.models.list().data] == ["m", "restarting"]
    label = tag()
    for model in ("m", "m", "m", "restarting", "restarting", "restarting"):
        sdk.chat.completions.create(model=model, messages=MESSAGES, extra_body=control(tag=label))
    assert [r["model"] for r in gateway.upstream.requests(label)] == ["m"] * 3
    assert [r["model"] for r in second.requests(label)] == ["restarting"] * 3
