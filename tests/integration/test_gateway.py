"""The OpenAI-compatible gateway, end to end over real HTTP: the real ``openai`` SDK (and raw
httpx where the SDK hides the wire) -> a real ``specdeck api`` process -> the upstream fixture
(``tests/support/upstream.py``), on Postgres and on SQLite.

One ``specdeck api`` per backend serves the whole module; every test makes its own project and
keys, so caches and rate-limit buckets never carry over between tests. Deployments are rows
inserted through the ORM and moved with ``app.services.state`` (their API and workers are tested
elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa

from tests.conftest import PG_ADMIN_URL, ROOT, configure
from tests.support.api_server import start_api, stop_api
from tests.support.errors import assert_error as assert_shape
from tests.support.upstream import TOKENS, Upstream, free_port
from tests.support.waiting import wait_for

UPSTREAM_KEY = "upstream-internal-" + secrets.token_hex(8)
MAX_TOKENS = 256  # SPECDECK_GATEWAY_MAX_TOKENS of the gateway under test
MAX_BODY = 65_536  # SPECDECK_MAX_BODY_BYTES
# Every test sends at most RATE_BURST requests per key, so none depends on the bucket
# refilling; and the refill (RATE_RPM: one token per 10 s) is slow next to the time the rate
# limit test's requests take, on a busy machine too.
RATE_BURST = 10
RATE_RPM = 6
STARTING_RETRY_AFTER = "7"
AUTH_CACHE_SECONDS = 1.0
GATEWAY_ENV = {
    "SPECDECK_GATEWAY_RATE_LIMIT_RPM": str(RATE_RPM),
    "SPECDECK_GATEWAY_RATE_LIMIT_BURST": str(RATE_BURST),
    "SPECDECK_GATEWAY_AUTH_CACHE_SECONDS": str(AUTH_CACHE_SECONDS),
    "SPECDECK_GATEWAY_ROUTE_CACHE_SECONDS": "0.5",
    "SPECDECK_GATEWAY_USAGE_FLUSH_SECONDS": "0.2",
    "SPECDECK_GATEWAY_MAX_TOKENS": str(MAX_TOKENS),
    "SPECDECK_GATEWAY_STARTING_RETRY_AFTER_SECONDS": STARTING_RETRY_AFTER,
    "SPECDECK_MAX_BODY_BYTES": str(MAX_BODY),
    "SPECDECK_GATEWAY_UPSTREAM_TIMEOUT_SECONDS": "3",
}
MESSAGES = [{"role": "user", "content": "say hello to the gateway"}]  # 5 prompt tokens
EXPECTED = "".join(TOKENS[i % len(TOKENS)] for i in range(8))


# --- fixtures ----------------------------------------------------------------------------------

@dataclass
class Key:
    plaintext: str
    id: str
    project_id: str


@dataclass
class Gateway:
    backend: str
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path
    upstream: Upstream

    def sdk(self, key: Key | str) -> openai.OpenAI:
        token = key.plaintext if isinstance(key, Key) else key
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=token, max_retries=0,
                             timeout=30)

    def http(self, key: Key | None, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {**({"Authorization": f"Bearer {key.plaintext}"} if key else {}),
                   **kw.pop("headers", {})}
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def chat(self, key: Key, **body: Any) -> httpx.Response:
        return self.http(key, "POST", "/v1/chat/completions",
                         json={"messages": MESSAGES, **body})

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream(UPSTREAM_KEY, models=["any"]) as server:
        yield server


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def gateway(request: pytest.FixtureRequest, upstream: Upstream, roots: dict[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A fresh database (from the migrated template), this process configured on it, and one
    ``specdeck api`` process serving the gateway on a free port."""
    from tests.conftest import REDIS_URL

    tmp = tmp_path_factory.mktemp(f"gateway-{request.param}")
    admin = None
    if request.param == "postgres":
        template = request.getfixturevalue("pg_template")
        name = f"specdeck_test_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        broker = REDIS_URL
    else:
        shutil.copy(request.getfixturevalue("sqlite_template"), tmp / "specdeck.db")
        db_url = f"sqlite:///{tmp / 'specdeck.db'}"
        broker = f"sqla+sqlite:///{tmp / 'broker.db'}"
    configure({"SPECDECK_DATABASE_URL": db_url, "SPECDECK_BROKER_URL": broker, **roots})
    env = {**os.environ, **GATEWAY_ENV, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = tmp / "api.log"
    url, proc = start_api(env, log)
    try:
        yield Gateway(request.param, url, env, proc, log, upstream)
    finally:
        stop_api(proc)
        from app.db import get_engine

        get_engine().dispose()
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def make_key(project: str | None = None, role: str = "admin") -> Key:
    from app.db import session_scope
    from app.services.keys import create_key

    with session_scope() as session:
        new = create_key(session, project or f"gw-{uuid.uuid4().hex[:8]}", role=role)
        return Key(new.plaintext, new.key.id, new.key.project_id)


def deploy(gateway: Gateway, key: Key, name: str, status: str = "ready", *,
           upstream_url: str | None = None, upstream_key: str | None = UPSTREAM_KEY) -> str:
    """A deployment row moved to ``status`` the way the workers move it."""
    from app.db import session_scope
    from app.db.models import Deployment
    from app.services.secrets import cipher
    from app.services.state import DeploymentStatus as S
    from app.services.state import initialize, transition
    from app.settings import get_settings

    path = {"pending": [], "starting": [S.STARTING], "ready": [S.STARTING, S.READY],
            "stopping": [S.STARTING, S.READY, S.STOPPING],
            "stopped": [S.STARTING, S.READY, S.STOPPING, S.STOPPED],
            "failed": [S.STARTING, S.FAILED]}[status]
    ciphertext = (cipher(get_settings()).encrypt(upstream_key.encode()).decode()
                  if upstream_key else None)
    with session_scope() as session:
        deployment = Deployment(project_id=key.project_id, name=name, spec={})
        initialize(session, deployment)
        for to in path:
            columns = ({"upstream_url": upstream_url or gateway.upstream.url,
                        "api_key_ciphertext": ciphertext} if to == S.STARTING else None)
            transition(session, deployment, to, columns=columns)
        return deployment.id


def tag() -> str:
    return uuid.uuid4().hex


def control(**kw: Any) -> dict[str, Any]:
    return {"upstream_control": kw}


def assert_error(response: httpx.Response, status: int, code: str | None,
                 param: str | None = None) -> dict[str, Any]:
    """The error shape, never holding the upstream's key."""
    assert UPSTREAM_KEY not in response.text
    return assert_shape(response, status, code, param)


def sse_events(text: str) -> list[str]:
    return [e[len("data: "):] for e in text.strip().split("\n\n") if e.startswith("data: ")]


def usage_rows(project_id: str) -> list[Any]:
    from app.db import get_engine

    with get_engine().connect() as conn:
        return conn.execute(sa.text(
            "SELECT api_key_id, deployment_id, model, prompt_tokens, completion_tokens "
            "FROM usage WHERE project_id = :p ORDER BY id"), {"p": project_id}).all()


# --- the happy paths, with the real SDK --------------------------------------------------------

def test_models_lists_the_ready_deployments_of_the_callers_project_only(gateway: Gateway) -> None:
    key, other = make_key(), make_key()
    deploy(gateway, key, "ready-b")
    deploy(gateway, key, "org/ready-a")  # served names may contain a slash
    for status in ("pending", "starting", "stopping", "stopped", "failed"):
        deploy(gateway, key, f"m-{status}", status)
    deploy(gateway, other, "theirs")

    sdk = gateway.sdk(key)
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["org/ready-a", "ready-b"]
    assert {m.owned_by for m in models.data} == {"specdeck"} and models.data[0].created > 0
    assert sdk.models.retrieve("org/ready-a").id == "org/ready-a"
    for name in ("theirs", "m-starting", "nope"):
        with pytest.raises(openai.NotFoundError) as err:
            sdk.models.retrieve(name)
        assert err.value.code == "model_not_found"
    assert [m.id for m in gateway.sdk(other).models.list().data] == ["theirs"]


def test_chat_completion_through_the_sdk(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "drafted")
    label = tag()
    completion = gateway.sdk(key).chat.completions.create(
        model="drafted", messages=MESSAGES, temperature=0, extra_body=control(tag=label))
    assert completion.choices[0].message.content == EXPECTED
    assert completion.model == "drafted"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 8)

    [seen] = gateway.upstream.requests(label)
    assert seen["authorized"]  # the gateway sent the deployment's own key, not the caller's
    # Forwarded as sent: no max_tokens asked, none added (the engine knows its context room).
    assert "max_tokens" not in seen["body"] and "stream_options" not in seen["body"]
    assert seen["body"]["temperature"] == 0 and seen["body"]["messages"] == MESSAGES

    label = tag()
    gateway.sdk(key).chat.completions.create(model="drafted", messages=MESSAGES, max_tokens=12,
                                             extra_body=control(tag=label))
    [seen] = gateway.upstream.requests(label)
    assert seen["body"]["max_tokens"] == 12

    # An explicit null is replaced, not duplicated (the body is rewritten, not appended to).
    label = tag()
    response = gateway.chat(key, model="drafted", stream=True, max_tokens=None,
                            stream_options=None, **control(tag=label))
    assert response.status_code == 200 and sse_events(response.text)[-1] == "[DONE]"
    [seen] = gateway.upstream.requests(label)
    assert seen["body"]["stream_options"] == {"include_usage": True}
    assert seen["body"]["max_tokens"] is None

    # Served by a plain ASGI route ahead of FastAPI's (openai.CHAT_ROUTE), counted under its path.
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert re.search(r'specdeck_http_requests_total\{method="POST",route="/v1/chat/completions",'
                     r'status="200"\} [1-9]', metrics), metrics[:2000]


def test_idle_upstream_connections_closed_by_the_upstream_are_replaced(gateway: Gateway) -> None:
    """The gateway keeps upstream connections alive for 4 s; this upstream closes them after 1 s.
    A request on a connection the upstream has closed goes out again on a fresh one."""
    with Upstream(UPSTREAM_KEY, keep_alive=1) as eager:
        key = make_key()
        deploy(gateway, key, "eager", upstream_url=eager.url)
        sdk = gateway.sdk(key)
        for _ in range(3):
            assert sdk.chat.completions.create(model="eager", messages=MESSAGES).usage
            assert "".join(c.choices[0].delta.content or "" for c in sdk.chat.completions.create(
                model="eager", messages=MESSAGES, stream=True)) == EXPECTED
            time.sleep(1.5)
        assert len(eager.requests()) == 6


def test_streaming_through_the_sdk(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "drafted")
    sdk = gateway.sdk(key)

    label = tag()
    chunks = list(sdk.chat.completions.create(model="drafted", messages=MESSAGES, stream=True,
                                              extra_body=control(tag=label)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == EXPECTED
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The gateway asked for usage (to record it) and dropped the usage chunk: not asked for.
    assert all(c.choices and c.usage is None for c in chunks)
    [seen] = gateway.upstream.requests(label)
    assert seen["body"]["stream_options"] == {"include_usage": True} and seen["completed"]

    chunks = list(sdk.chat.completions.create(model="drafted", messages=MESSAGES, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == 5

    raw = gateway.chat(key, model="drafted", stream=True)
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert all('"usage":{' not in e for e in events)


def test_usage_is_recorded_per_key(gateway: Gateway) -> None:
    first = make_key()
    project = first.project_id
    from app.db import session_scope
    from app.db.models import ApiKey, Project

    with session_scope() as session:
        project_name = session.get(Project, project).name
    second = make_key(project_name)
    assert second.project_id == project
    deployment = deploy(gateway, first, "metered")
    a, b = gateway.sdk(first), gateway.sdk(second)
    a.chat.completions.create(model="metered", messages=MESSAGES)
    list(a.chat.completions.create(model="metered", messages=MESSAGES, stream=True,
                                   extra_body=control(tokens=3)))
    b.chat.completions.create(model="metered", messages=[{"role": "user", "content": "hi"}],
                              extra_body=control(tokens=2))
    with pytest.raises(openai.BadRequestError):  # refused requests use nothing
        b.chat.completions.create(model="metered", messages=MESSAGES, n=2)

    wait_for(lambda: len(usage_rows(project)) >= 3, what="3 usage rows")
    # Nothing more arrives: usage is written in the order it was recorded, so once a marker
    # request's row (another project's, sent last) is in, so is anything recorded before it.
    marker = make_key()
    deploy(gateway, marker, "metered")
    gateway.sdk(marker).chat.completions.create(model="metered", messages=MESSAGES)
    wait_for(lambda: usage_rows(marker.project_id), what="the marker's usage row")
    rows = usage_rows(project)
    per_key = {(r.api_key_id, r.prompt_tokens, r.completion_tokens) for r in rows}
    assert len(rows) == 3 and per_key == {(first.id, 5, 8), (first.id, 5, 3), (second.id, 1, 2)}
    assert {(r.deployment_id, r.model) for r in rows} == {(deployment, "metered")}
    with session_scope() as session:
        assert session.get(ApiKey, first.id).last_used_at is not None


# --- every error class -------------------------------------------------------------------------

def test_every_role_chats_an_inference_key_only_chats(gateway: Gateway) -> None:
    admin = make_key()
    deploy(gateway, admin, "m")
    project = admin.project_id
    from app.db import session_scope
    from app.db.models import Project

    with session_scope() as session:
        name = session.get(Project, project).name
    for role in ("inference", "member"):
        key = make_key(name, role)
        assert gateway.sdk(key).chat.completions.create(model="m", messages=MESSAGES).choices
        assert [m.id for m in gateway.sdk(key).models.list()] == ["m"]
    inference = make_key(name, "inference")
    assert_error(gateway.http(inference, "GET", "/api/deployments"), 403, "key_role")


def test_missing_invalid_and_revoked_keys_are_401(gateway: Gateway) -> None:
    assert_error(gateway.http(None, "GET", "/v1/models"), 401, "missing_api_key")
    assert_error(gateway.chat(Key("sdk-nope", "", ""), model="x"), 401, "invalid_api_key")
    response = gateway.http(None, "GET", "/v1/models", headers={"Authorization": "Basic abc"})
    assert_error(response, 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError) as err:
        gateway.sdk("sdk-not-a-key").chat.completions.create(model="x", messages=MESSAGES)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"

    key = make_key()
    deploy(gateway, key, "m")
    assert gateway.chat(key, model="m").status_code == 200
    from app.db import session_scope
    from app.db.models import ApiKey, utcnow

    with session_scope() as session:
        session.get(ApiKey, key.id).revoked_at = utcnow()
    # Cached for at most SPECDECK_GATEWAY_AUTH_CACHE_SECONDS (counted from the lookup, which
    # came before the revocation): the first request after that is refused, however slow.
    time.sleep(AUTH_CACHE_SECONDS + 0.1)
    assert_error(gateway.chat(key, model="m"), 401, "invalid_api_key")


def test_keys_taking_turns_on_one_keep_alive_connection(gateway: Gateway) -> None:
    """The gateway keeps the hash of the last key sent on a client connection
    (``Gateway.caller``): a connection whose requests change keys is answered for each key, and
    a key revoked while its connection stays open is refused on that connection."""
    mine, theirs = make_key(), make_key()
    deploy(gateway, mine, "mine-on-one-connection")
    deploy(gateway, theirs, "theirs-on-one-connection")
    ports = set()
    with httpx.Client(base_url=gateway.url, timeout=30) as client:

        def chat(key: Key, model: str) -> httpx.Response:
            response = client.post("/v1/chat/completions", json={"messages": MESSAGES,
                                   "model": model},
                                   headers={"Authorization": f"Bearer {key.plaintext}"})
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
            return response

        assert chat(mine, "mine-on-one-connection").status_code == 200
        assert_error(chat(mine, "theirs-on-one-connection"), 404, "model_not_found", "model")
        assert chat(theirs, "theirs-on-one-connection").status_code == 200
        assert_error(chat(theirs, "mine-on-one-connection"), 404, "model_not_found", "model")
        assert_error(chat(Key("sdk-nope", "", ""), "mine-on-one-connection"), 401,
                     "invalid_api_key")
        assert chat(mine, "mine-on-one-connection").status_code == 200
        from app.db import session_scope
        from app.db.models import ApiKey, utcnow

        with session_scope() as session:
            session.get(ApiKey, mine.id).revoked_at = utcnow()
        time.sleep(AUTH_CACHE_SECONDS + 0.1)  # as in the test above
        assert_error(chat(mine, "mine-on-one-connection"), 401, "invalid_api_key")
        assert chat(theirs, "theirs-on-one-connection").status_code == 200
    assert len(ports) == 1  # every request went over the one connection


def test_unknown_model_and_another_projects_model_are_404(gateway: Gateway) -> None:
    mine, theirs = make_key(), make_key()
    deploy(gateway, theirs, "private-model")
    label = tag()
    for model in ("private-model", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as err:
            gateway.sdk(mine).chat.completions.create(model=model, messages=MESSAGES,
                                                      extra_body=control(tag=label))
        assert err.value.code == "model_not_found" and err.value.param == "model"
        assert_error(gateway.chat(mine, model=model, stream=True), 404, "model_not_found", "model")
    assert gateway.upstream.requests(label) == []
    assert gateway.chat(theirs, model="private-model").status_code == 200  # the owner's works
    huge = "m" * 50_000  # quoted back cut, not whole
    error = assert_error(gateway.chat(mine, model=huge), 404, "model_not_found", "model")
    assert len(error["message"]) < 300 and "(50000 characters)" in error["message"]


def test_deployment_status_decides_503_or_404(gateway: Gateway) -> None:
    key = make_key()
    for status in ("pending", "starting", "stopping", "stopped", "failed"):
        deploy(gateway, key, status, status)
    # Several rows by one name: the newest one not stopped decides. (All rows first: the
    # project's routes are cached for SPECDECK_GATEWAY_ROUTE_CACHE_SECONDS once asked for.)
    for name, older, newer in (("redeployed", "ready", "starting"),
                               ("rolled-back", "ready", "stopped"),
                               ("broken", "ready", "failed")):
        deploy(gateway, key, name, older)
        deploy(gateway, key, name, newer)
    for status in ("pending", "starting"):
        with pytest.raises(openai.InternalServerError) as err:
            gateway.sdk(key).chat.completions.create(model=status, messages=MESSAGES)
        assert err.value.status_code == 503 and err.value.code == "model_not_ready"
        assert err.value.response.headers["retry-after"] == STARTING_RETRY_AFTER
        assert_error(gateway.chat(key, model=status, stream=True), 503, "model_not_ready")
    for status in ("stopping", "stopped", "failed"):
        assert_error(gateway.chat(key, model=status), 404, "model_not_found", "model")

    assert_error(gateway.chat(key, model="redeployed"), 503, "model_not_ready")
    assert gateway.chat(key, model="rolled-back").status_code == 200
    assert_error(gateway.chat(key, model="broken"), 404, "model_not_found")


def test_rate_limit_is_429_with_retry_after_per_key(gateway: Gateway) -> None:
    """The burst, then refused. The bucket refills one token per 10 s (RATE_RPM): far longer
    than these 12 requests take, on a busy machine too."""
    from app.db import session_scope
    from app.db.models import Project

    key = make_key()
    sdk = gateway.sdk(key)
    for _ in range(RATE_BURST):
        sdk.models.list()
    with pytest.raises(openai.RateLimitError) as err:
        sdk.models.list()
    assert err.value.code == "rate_limit_exceeded"
    retry_after = err.value.response.headers["retry-after"]
    assert retry_after.isdigit() and 1 <= int(retry_after) <= 60 / RATE_RPM
    assert_error(gateway.chat(key, model="m"), 429, "rate_limit_exceeded")
    # Another key, even of the same project, has its own bucket.
    with session_scope() as session:
        project_name = session.get(Project, key.project_id).name
    same_project = make_key(project_name)
    assert same_project.project_id == key.project_id
    assert gateway.http(same_project, "GET", "/v1/models").status_code == 200
    time.sleep(int(retry_after) + 0.1)
    assert gateway.http(key, "GET", "/v1/models").status_code == 200


def test_request_limits_are_400(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "m")
    label = tag()
    sdk = gateway.sdk(key)
    cases = [({"n": 2}, "n"), ({"max_tokens": MAX_TOKENS + 1}, "max_tokens"),
             ({"max_completion_tokens": MAX_TOKENS + 1}, "max_completion_tokens"),
             ({"max_tokens": 0}, "max_tokens")]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model="m", messages=MESSAGES, extra_body={
                **extra, **control(tag=label)})
        assert err.value.status_code == 400 and err.value.param == param, extra
        assert err.value.code == "invalid_value"
    assert_error(gateway.chat(key, model="m", n=3, stream=True), 400, "invalid_value", "n")
    assert_error(gateway.chat(key, model="m", stream="yes"), 400, "invalid_value", "stream")
    assert_error(gateway.chat(key), 400, "missing_field", "model")
    response = gateway.http(key, "POST", "/v1/chat/completions", content=b"{not json",
                            headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_json")
    assert_error(gateway.http(key, "POST", "/v1/chat/completions", json=[1]), 400, "invalid_json")
    assert gateway.upstream.requests(label) == []
    assert gateway.chat(key, model="m", n=1, max_tokens=MAX_TOKENS).status_code == 200


def test_body_over_the_limit_is_413(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "m")
    big = [{"role": "user", "content": "x" * (MAX_BODY + 1)}]
    with pytest.raises(openai.APIStatusError) as err:
        gateway.sdk(key).chat.completions.create(model="m", messages=big)
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
    # Without a Content-Length (chunked): caught while reading, still 413 in the same shape.
    payload = json.dumps({"model": "m", "messages": big}).encode()
    pieces = [payload[i:i + 8192] for i in range(0, len(payload), 8192)]
    chunked = gateway.http(key, "POST", "/v1/chat/completions", content=iter(pieces),
                           headers={"Content-Type": "application/json"})
    assert_error(chunked, 413, "request_too_large")


def test_upstream_failures(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "m")
    deploy(gateway, key, "wrong-key", upstream_key="not-the-upstream-key")
    sdk = gateway.sdk(key)
    for stream in (False, True):
        # 5xx upstream: 502 (a failure before the first chunk is an HTTP error when streaming).
        with pytest.raises(openai.InternalServerError) as err:
            response = sdk.chat.completions.create(model="m", messages=MESSAGES, stream=stream,
                                                   extra_body=control(fail=500))
            list(response) if stream else None
        assert err.value.status_code == 502 and err.value.code == "upstream_error"
        # 4xx upstream: passed through in the same shape.
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model="m", messages=MESSAGES, stream=stream,
                                        extra_body=control(fail=400))
        assert err.value.code == "upstream_test_failure"
        assert "upstream failure 400" in err.value.message
        assert_error(gateway.chat(key, model="m", stream=stream, **control(fail=429)), 429,
                     "upstream_test_failure")
        # The upstream refusing the gateway's credentials is the gateway's problem: 502.
        assert_error(gateway.chat(key, model="m", stream=stream, **control(fail=401)), 502,
                     "upstream_auth_failed")
    error = assert_error(gateway.chat(key, model="wrong-key"), 502, "upstream_auth_failed")
    assert "not-the-upstream-key" not in json.dumps(error)
    assert gateway.chat(key, model="m", **control(fail=429)).headers["retry-after"] == "2"


def test_engine_errors_come_back_in_openais_shape(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "m")
    sdk = gateway.sdk(key)
    # vLLM's own shape (type: an exception name, code: the status as a number) comes back in
    # OpenAI's: the type for the status, a code that says what, the message cut to a sane size.
    too_long = "This model's maximum context length is 2048 tokens. " + "x" * 50_000
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="m", messages=MESSAGES,
                                    extra_body=control(fail=400, vllm_error=too_long))
    relayed = err.value.body
    assert relayed["type"] == "invalid_request_error" and err.value.code == "context_length_exceeded"
    assert relayed["message"].startswith("This model's maximum") and len(relayed["message"]) < 2100
    with pytest.raises(openai.NotFoundError) as err:
        sdk.chat.completions.create(model="m", messages=MESSAGES,
                                    extra_body=control(fail=404, vllm_error="no such adapter"))
    assert err.value.body["type"] == "not_found_error" and err.value.code == "not_found"


def test_unreachable_upstream_is_503_with_retry_after(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "gone", upstream_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(openai.InternalServerError) as err:
        gateway.sdk(key).chat.completions.create(model="gone", messages=MESSAGES)
    assert err.value.status_code == 503 and err.value.code == "upstream_unavailable"
    for stream in (False, True):
        response = gateway.chat(key, model="gone", stream=stream)
        assert_error(response, 503, "upstream_unavailable")
        assert int(response.headers["retry-after"]) >= 1


def test_upstream_timeouts(gateway: Gateway) -> None:
    """SPECDECK_GATEWAY_UPSTREAM_TIMEOUT_SECONDS (3 s here): for the answer, then per chunk."""
    key = make_key()
    deploy(gateway, key, "slow")
    # The upstream would answer after 3 x 10 s: a 504 is the gateway giving up first, and it
    # cannot give up before its 3 s (only a lower bound: a busy machine is slower, never faster).
    label = tag()
    started = time.monotonic()
    response = gateway.chat(key, model="slow", **control(tag=label, tokens=3, delay=10))
    assert_error(response, 504, "upstream_timeout")
    assert time.monotonic() - started > 2.5
    wait_for(lambda: gateway.upstream.requests(label)[0]["disconnected"],
             what="the upstream to see the gateway give up")

    # Streaming: the first chunk comes at once, then nothing for far longer than the timeout.
    raw = gateway.chat(key, model="slow", stream=True, **control(tokens=2, delay=10))
    assert raw.status_code == 200
    events = sse_events(raw.text)
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "upstream_timeout"


def test_upstream_dying_mid_stream_ends_with_an_error_event(gateway: Gateway) -> None:
    key = make_key()
    deploy(gateway, key, "m")
    # Chunks 0.2 s apart, as an engine sends them: the gateway has relayed each before the
    # connection drops (aiohttp reports a dropped connection ahead of bytes still unread).
    stream = gateway.sdk(key).chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_body=control(die_after=3, delay=0.2))
    received = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "".join(TOKENS[:3])
    assert err.value.code == "upstream_error" and "mid-stream" in err.value.message

    raw = gateway.chat(key, model="m", stream=True, **control(die_after=2, delay=0.2))
    assert raw.status_code == 200  # the headers went out with the first chunk
    events = sse_events(raw.text)
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert set(last) == {"error"} and last["error"]["code"] == "upstream_error"
    assert set(last["error"]) == {"message", "type", "param", "code"}


def test_client_disconnect_aborts_the_upstream_request(gateway: Gateway) -> None:
    """The upstream sees the disconnect before it completes: each request would take 60 s,
    longer than the waits below, so only an abort lets them see it (how fast is not timed)."""
    key = make_key()
    deploy(gateway, key, "slow")
    total = 1200  # 0.05 s apart: 60 s if nobody aborted it

    # Streaming, raw: read three events, then hang up.
    label = tag()
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key.plaintext}"},
            json={"model": "slow", "messages": MESSAGES, "stream": True,
                  **control(tag=label, tokens=total, delay=0.05)}) as response:
        assert response.status_code == 200
        events = (line for line in response.iter_lines() if line.startswith("data:"))
        assert [next(events) for _ in range(3)]
    seen = wait_for(lambda: [r for r in gateway.upstream.requests(label) if r["disconnected"]],
                    timeout=45, what="the upstream to see the disconnect")[0]
    assert not seen["completed"]

    # Streaming, with the SDK: close the stream after the first chunk.
    label = tag()
    stream = gateway.sdk(key).chat.completions.create(
        model="slow", messages=MESSAGES, stream=True,
        extra_body=control(tag=label, tokens=total, delay=0.05))
    next(iter(stream))
    stream.close()
    seen = wait_for(lambda: [r for r in gateway.upstream.requests(label) if r["disconnected"]],
                    timeout=45, what="the upstream to see the SDK's disconnect")[0]
    assert not seen["completed"]

    # Not streaming: the client gives up (timeout) while the upstream is still generating.
    label = tag()
    with pytest.raises(httpx.ReadTimeout):  # only the wait for the answer is short
        httpx.post(f"{gateway.url}/v1/chat/completions",
                   headers={"Authorization": f"Bearer {key.plaintext}"},
                   json={"model": "slow", "messages": MESSAGES,
                         **control(tag=label, tokens=total, delay=0.05)},
                   timeout=httpx.Timeout(30, read=0.5))
    seen = wait_for(lambda: [r for r in gateway.upstream.requests(label) if r["disconnected"]],
                    timeout=45, what="the upstream to see the non-streaming disconnect")[0]
    assert not seen["completed"]
    assert "Traceback" not in gateway.output(), gateway.output()


def test_usage_buffered_at_shutdown_is_written(gateway: Gateway, tmp_path: Path) -> None:
    """A flush interval far away: the rows can only come from the flush at shutdown."""
    env = {**gateway.env, "SPECDECK_GATEWAY_USAGE_FLUSH_SECONDS": "3600"}
    url, proc = start_api(env, tmp_path / "api.log")
    key, doomed = make_key(), make_key()
    try:
        for caller in (key, doomed):
            deploy(gateway, caller, "m")
            sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=caller.plaintext, max_retries=0)
            sdk.chat.completions.create(model="m", messages=MESSAGES)
        time.sleep(0.3)
        assert usage_rows(key.project_id) == []
        # A key deleted while its usage is buffered: its row cannot go in; the others still do.
        from app.db import get_engine

        with get_engine().begin() as conn:
            conn.execute(sa.text("DELETE FROM api_keys WHERE id = :id"), {"id": doomed.id})
    finally:
        stop_api(proc)
    log = (tmp_path / "api.log").read_text()
    # uvicorn re-raises SIGTERM once it has shut down gracefully.
    assert proc.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in log, log
    assert [(r.prompt_tokens, r.completion_tokens) for r in usage_rows(key.project_id)] == [(5, 8)]


def test_other_requests_pass_uvicorns_proxy_headers(gateway: Gateway) -> None:
    """`specdeck api` serves chat completions ahead of the app's middleware and applies uvicorn's
    proxy headers middleware to everything else itself: a redirect behind a TLS-terminating
    proxy on this host (X-Forwarded-Proto from 127.0.0.1, trusted by default) says https."""
    key = make_key()

    def redirect(**headers: str) -> str:
        response = httpx.get(f"{gateway.url}/api/jobs/", follow_redirects=False, timeout=30,
                             headers={"Authorization": f"Bearer {key.plaintext}", **headers})
        assert response.status_code == 307, response.text
        return response.headers["location"]

    assert redirect(**{"X-Forwarded-Proto": "https"}) == f"https://{gateway.url.split('://')[1]}/api/jobs"
    assert redirect() == f"{gateway.url}/api/jobs"


def test_a_key_past_its_rate_limit_never_reaches_the_upstream(gateway: Gateway) -> None:
    """Requests may go upstream before the shared limit's answer (app.services.limits), but only
    while Redis last left the key room: past the burst, not one more reaches the engine."""
    key = make_key()
    deploy(gateway, key, "m")
    label = tag()
    statuses = [gateway.chat(key, model="m", **control(tag=label)).status_code
                for _ in range(RATE_BURST + 3)]
    assert statuses == [200] * RATE_BURST + [429] * 3
    assert len(gateway.upstream.requests(label)) == RATE_BURST


def test_a_request_sent_early_and_then_refused_is_aborted_upstream(gateway: Gateway) -> None:
    """The shared limit (Redis) gives a key with room left credit to go upstream before the
    answer. When the answer is no (here another process took the bucket meanwhile: the test
    fills it in Redis), the client gets the 429 and the engine's request is aborted."""
    if gateway.backend != "postgres":
        pytest.skip("the in-process limit (embedded broker) answers at once: nothing goes early")
    import redis

    from app.services.limits import BUCKET_PREFIX
    from tests.conftest import REDIS_URL

    def early_refused() -> float:
        found = re.search(r"^specdeck_gateway_early_refused_total (\S+)$",
                          httpx.get(f"{gateway.url}/metrics", timeout=10).text, re.M)
        return float(found.group(1)) if found else 0.0

    key = make_key()
    deploy(gateway, key, "slow")
    assert [gateway.chat(key, model="slow").status_code for _ in range(2)] == [200, 200]
    before = early_refused()
    with redis.Redis.from_url(REDIS_URL) as client:
        seconds, micros = client.time()
        client.set(BUCKET_PREFIX + key.id, str((seconds + 3600) * 1_000_000 + micros), px=60_000)
    label = tag()
    for stream in (False, True):  # each would take 30 s upstream, were it not aborted
        response = gateway.chat(key, model="slow", stream=stream,
                                **control(tag=label, tokens=3, delay=10))
        assert_error(response, 429, "rate_limit_exceeded")
    assert early_refused() == before + 1  # the first went early and was refused; the second waited
    wait_for(lambda: all(r["disconnected"] for r in gateway.upstream.requests(label)),
             what="the upstream to see the early request aborted")
    assert not any(r["completed"] for r in gateway.upstream.requests(label))
