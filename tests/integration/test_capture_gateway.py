"""Traffic capture and per-request acceptance length through the gateway, end to end: the real
``openai`` SDK -> a real ``specdeck api`` process on Postgres -> the upstream double
(``tests/support/upstream.py``). Capture datasets are made with ``app.services.capture.start``
(what ``POST /api/deployments`` calls; its API is tested in test_capture_api.py)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import sqlalchemy as sa

from tests.conftest import PG_ADMIN_URL, ROOT, configure
from tests.integration.test_gateway import (
    EXPECTED,
    GATEWAY_ENV,
    MESSAGES,
    UPSTREAM_KEY,
    Gateway,
    Key,
    control,
    deploy,
    make_key,
    start_api,
    stop_api,
)
from tests.support.upstream import Upstream
from tests.support.waiting import wait_for

CAPTURE_ENV = {**GATEWAY_ENV, "SPECDECK_GATEWAY_CAPTURE_FLUSH_SECONDS": "0.2"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream(UPSTREAM_KEY, models=["any"]) as server:
        yield server


@pytest.fixture(scope="module")
def database(pg_template: str, roots: dict[str, str]) -> Iterator[str]:
    from tests.conftest import REDIS_URL

    name = f"specdeck_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    configure({"SPECDECK_DATABASE_URL": url, "SPECDECK_BROKER_URL": REDIS_URL, **roots})
    try:
        yield url
    finally:
        from app.db import get_engine

        get_engine().dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def api_process(database: str, upstream: Upstream, tmp: Any, **extra: str) -> Gateway:
    env = {**os.environ, **CAPTURE_ENV, **extra, "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    log = tmp / f"api-{uuid.uuid4().hex[:6]}.log"
    url, proc = start_api(env, log)
    return Gateway("postgres", url, env, proc, log, upstream)


@pytest.fixture(scope="module")
def gateway(database: str, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    server = api_process(database, upstream, tmp_path_factory.mktemp("capture"))
    try:
        yield server
    finally:
        stop_api(server.proc)


def capturing(gateway: Gateway, key: Key, name: str, **options: Any) -> tuple[str, str]:
    """A ready deployment that captures into a new dataset: (deployment id, dataset id)."""
    from app.db import session_scope
    from app.db.models import Deployment
    from app.schemas.capture import CaptureOptions
    from app.services import capture

    deployment_id = deploy(gateway, key, name)
    with session_scope() as session:
        dataset = capture.start(session, key.project_id, name,
                                CaptureOptions(**{"sample_rate": 1.0, **options}))
        session.get(Deployment, deployment_id).capture_dataset_id = dataset.id
        return deployment_id, dataset.id


def summary(dataset_id: str) -> dict[str, Any]:
    from app.db import session_scope
    from app.db.models import Dataset
    from app.services.capture import capture_out

    with session_scope() as session:
        return capture_out(session.get(Dataset, dataset_id)).model_dump()


def rows(dataset_id: str) -> list[dict[str, Any]]:
    """The dataset's rows, decrypted, oldest first."""
    from app.db import get_engine
    from app.services.secrets import cipher
    from app.settings import get_settings

    fernet = cipher(get_settings())
    with get_engine().connect() as conn:
        found = conn.execute(sa.text(
            "SELECT ciphertext, num_bytes FROM captured_rows WHERE dataset_id = :d "
            "ORDER BY created_at, id"), {"d": dataset_id}).all()
    out = []
    for ciphertext, num_bytes in found:
        plain = fernet.decrypt(ciphertext.encode())
        assert len(plain) == num_bytes
        out.append(json.loads(plain))
    return out


def stream_text(sdk: openai.OpenAI, model: str, messages: list[dict[str, Any]],
                **extra: Any) -> str:
    stream = sdk.chat.completions.create(model=model, messages=messages, stream=True,
                                         extra_body=extra or None)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# --- tests -------------------------------------------------------------------------------------

def test_sampled_requests_are_captured_encrypted_streaming_or_not(gateway: Gateway) -> None:
    key = make_key()
    _, dataset_id = capturing(gateway, key, "captured")
    sdk = gateway.sdk(key)
    secret = f"my private prompt {uuid.uuid4().hex}"
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": secret}]
    second = [{"role": "user", "content": "stream it please"}]
    reply = sdk.chat.completions.create(model="captured", messages=first)
    assert reply.choices[0].message.content == EXPECTED
    assert stream_text(sdk, "captured", second) == EXPECTED
    # A stream that dies mid-way, and an upstream error: answered, never captured.
    with pytest.raises(openai.APIError, match="mid-stream"):
        stream_text(sdk, "captured", MESSAGES, **control(die_after=2, delay=0.2))
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="captured", messages=MESSAGES,
                                    extra_body=control(fail=400))

    got = wait_for(lambda: len(rows(dataset_id)) >= 2 and rows(dataset_id), what="2 rows")
    assert got == [
        {"messages": [*first, {"role": "assistant", "content": EXPECTED}]},
        {"messages": [*second, {"role": "assistant", "content": EXPECTED}]}]
    from app.db import get_engine

    with get_engine().connect() as conn:  # at rest: ciphertext only
        stored = conn.execute(sa.text("SELECT ciphertext FROM captured_rows WHERE dataset_id = :d"),
                              {"d": dataset_id}).scalars().all()
    assert len(stored) == 2 and not any(secret in c or "stream it" in c for c in stored)
    info = summary(dataset_id)
    assert info["rows"] == 2 and info["bytes"] == sum(
        len(json.dumps(r, separators=(",", ":")).encode()) for r in got)
    assert info["first_at"] <= info["last_at"]
    assert info["dropped"] == {"queue_full": 0, "limit_reached": 0}


def test_a_deployment_without_capture_records_nothing(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "plain")
    _, other = capturing(gateway, key, "captured-too")
    sdk = gateway.sdk(key)
    sdk.chat.completions.create(model="plain", messages=MESSAGES)
    stream_text(sdk, "plain", MESSAGES)
    sdk.chat.completions.create(model="captured-too", messages=MESSAGES)  # a marker after them
    wait_for(lambda: rows(other), what="the marker row")  # written after the others
    assert project_rows(key) == 1


def project_rows(key: Key) -> int:
    from app.db import get_engine

    with get_engine().connect() as conn:
        return conn.execute(sa.text(
            "SELECT count(*) FROM captured_rows r JOIN datasets d ON d.id = r.dataset_id "
            "WHERE d.project_id = :p"), {"p": key.project_id}).scalar()


def test_limits_stop_capture_and_count_the_drops(gateway: Gateway) -> None:
    key = make_key()
    _, by_rows = capturing(gateway, key, "few-rows", max_rows=2)
    _, by_bytes = capturing(gateway, key, "few-bytes", max_bytes=1024)
    sdk = gateway.sdk(key)
    for _ in range(4):
        sdk.chat.completions.create(model="few-rows", messages=MESSAGES)
    long = [{"role": "user", "content": "word " * 120}]  # about 700 bytes a row
    for _ in range(3):
        sdk.chat.completions.create(model="few-bytes", messages=long)
    wait_for(lambda: summary(by_rows)["dropped"]["limit_reached"] == 2, what="2 drops by rows")
    wait_for(lambda: summary(by_bytes)["dropped"]["limit_reached"] == 2, what="2 drops by bytes")
    assert summary(by_rows)["rows"] == 2 and len(rows(by_rows)) == 2
    assert summary(by_bytes)["rows"] == 1 and summary(by_bytes)["bytes"] <= 1024


def test_deleting_the_dataset_deletes_its_rows_and_stops_capture(gateway: Gateway) -> None:
    key = make_key()
    deployment_id, dataset_id = capturing(gateway, key, "deleted")
    _, marker = capturing(gateway, key, "marker")
    sdk = gateway.sdk(key)
    sdk.chat.completions.create(model="deleted", messages=MESSAGES)
    wait_for(lambda: rows(dataset_id), what="a row")
    response = gateway.http(key, "DELETE", f"/api/datasets/{dataset_id}")
    assert response.status_code == 204, response.text
    assert rows(dataset_id) == []
    from app.db import get_engine

    with get_engine().connect() as conn:  # the deployment captures into nothing any more
        assert conn.execute(sa.text("SELECT capture_dataset_id FROM deployments WHERE id = :d"),
                            {"d": deployment_id}).scalar() is None
    # Requests still go through (the route reloads within its TTL): nothing is recorded.
    for _ in range(3):
        assert sdk.chat.completions.create(model="deleted", messages=MESSAGES).choices
    sdk.chat.completions.create(model="marker", messages=MESSAGES)
    wait_for(lambda: rows(marker), what="the marker row")  # queued after the others
    assert project_rows(key) == 1


def test_a_full_queue_drops_and_counts_without_blocking(database: str, upstream: Upstream,
                                                        tmp_path: Any) -> None:
    # One row fits in the queue, and nothing is written until the process stops.
    server = api_process(database, upstream, tmp_path,
                         SPECDECK_GATEWAY_CAPTURE_QUEUE_ROWS="1",
                         SPECDECK_GATEWAY_CAPTURE_FLUSH_SECONDS="600")
    try:
        key = make_key()
        _, dataset_id = capturing(server, key, "queued")
        sdk = server.sdk(key)
        for _ in range(4):
            assert sdk.chat.completions.create(model="queued", messages=MESSAGES).choices
        assert stream_text(sdk, "queued", MESSAGES) == EXPECTED
        assert rows(dataset_id) == []  # all still in memory
    finally:
        stop_api(server.proc)  # the shutdown flushes what waits, and the count
    assert len(rows(dataset_id)) == 1
    assert summary(dataset_id)["dropped"] == {"queue_full": 4, "limit_reached": 0}


def test_per_request_acceptance_length_is_recorded_with_usage(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "measured")
    sdk = gateway.sdk(key)
    sdk.chat.completions.create(model="measured", messages=MESSAGES,
                                extra_body=control(acceptance_length=2.5))
    stream_text(sdk, "measured", MESSAGES, **control(acceptance_length=3.25))
    sdk.chat.completions.create(model="measured", messages=MESSAGES)  # no metrics: null
    # The client asked for usage: it gets vLLM's metrics too, untouched.
    chunks = list(sdk.chat.completions.create(
        model="measured", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        extra_body=control(acceptance_length=1.5)))
    assert chunks[-1].usage is not None and chunks[-1].model_extra["metrics"][
        "speculative_decoding"]["mean_acceptance_length"] == 1.5
    from app.db import get_engine

    def lengths() -> list[Any]:
        with get_engine().connect() as conn:
            return conn.execute(sa.text("SELECT acceptance_length FROM usage WHERE project_id = :p "
                                        "ORDER BY id"), {"p": key.project_id}).scalars().all()

    assert wait_for(lambda: len(lengths()) == 4 and lengths(), what="4 usage rows") == [
        2.5, 3.25, None, 1.5]
