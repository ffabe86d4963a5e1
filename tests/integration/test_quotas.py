"""Per-project quotas on both backends: active jobs, active deployments and dataset bytes. Going
past one answers 429 ``quota_exceeded`` in the one error shape and creates nothing; freeing
capacity allows creating again; an idempotent replay still replays; other projects are not
affected. On Postgres, a request racing another one past the limit waits for it and is refused."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import Api, Stack, configure, write_verifier
from tests.integration.test_datasets_api import project_of, stored, upload
from tests.integration.test_deployments_api import write_drafter
from tests.support.errors import assert_error


@pytest.fixture
def quotas(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``quotas(active_jobs=2, ...)`` sets SPECDECK_QUOTA_<NAME> for the rest of the test."""

    def set_quotas(**values: int) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"SPECDECK_QUOTA_{name.upper()}", str(value))
        # Webhooks to 127.0.0.1 (nothing is sent to it here).
        monkeypatch.setenv("SPECDECK_WEBHOOK_ALLOWED_HOSTS", "127.0.0.1")
        configure({})

    yield set_quotas
    monkeypatch.undo()
    configure({})


def assert_quota_exceeded(response: Any, setting: str, param: str | None = None) -> str:
    error = assert_error(response, 429, "quota_exceeded")
    assert error["type"] == "rate_limit_error" and error["param"] == param
    assert f"SPECDECK_{setting}" in error["message"]
    return error["message"]


def rows(stack: Stack, *tables: str) -> dict[str, int]:
    return {table: stack.scalar(f"SELECT count(*) FROM {table}") for table in tables}


# Active jobs -------------------------------------------------------------------------------

def test_active_jobs_quota(api: Api, make_api, job_body, stack: Stack, quotas) -> None:
    quotas(active_jobs=2)
    first = api.post("/api/jobs", json=job_body())
    assert first.status_code == 201, first.text
    # One below the limit: still created (with an idempotency key, replayed below).
    second = api.post("/api/jobs", json=job_body(), headers={"Idempotency-Key": "run-2"})
    assert second.status_code == 201, second.text

    before = rows(stack, "jobs", "job_events")
    message = assert_quota_exceeded(api.post("/api/jobs", json=job_body()), "QUOTA_ACTIVE_JOBS")
    assert "already has 2 active jobs" in message and "quota is 2" in message
    assert_quota_exceeded(api.post("/api/jobs", json=job_body(),
                                   headers={"Idempotency-Key": "run-3"}), "QUOTA_ACTIVE_JOBS")
    assert rows(stack, "jobs", "job_events") == before

    # A replay at the limit is still a replay, not a refusal.
    replay = api.post("/api/jobs", json=job_body(), headers={"Idempotency-Key": "run-2"})
    assert replay.status_code == 200, replay.text
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == second.json()["id"]

    # Another project has its own quota.
    other = make_api(api)
    for _ in range(2):
        assert other.post("/api/jobs", json=job_body()).status_code == 201
    assert_quota_exceeded(other.post("/api/jobs", json=job_body()), "QUOTA_ACTIVE_JOBS")

    # A cancelled job no longer counts; the refused key was not used up.
    cancelled = api.post(f"/api/jobs/{first.json()['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = api.post("/api/jobs", json=job_body(), headers={"Idempotency-Key": "run-3"})
    assert again.status_code == 201, again.text
    assert_quota_exceeded(api.post("/api/jobs", json=job_body()), "QUOTA_ACTIVE_JOBS")

    quotas(active_jobs=0)  # no limit
    assert api.post("/api/jobs", json=job_body()).status_code == 201


# Active deployments ------------------------------------------------------------------------

def test_active_deployments_quota(api: Api, make_api, stack: Stack, quotas) -> None:
    verifier, drafter = write_verifier(stack.models_root), write_drafter(stack.models_root)

    def body(name: str) -> dict[str, Any]:
        return {"name": name, "drafter": drafter, "verifier": verifier, "runtime": "local"}

    quotas(active_deployments=2)
    first = api.post("/api/deployments", json=body("a"))
    assert first.status_code == 201, first.text
    assert api.post("/api/deployments", json=body("b")).status_code == 201  # one below the limit

    before = rows(stack, "deployments", "deployment_events")
    message = assert_quota_exceeded(api.post("/api/deployments", json=body("c")),
                                    "QUOTA_ACTIVE_DEPLOYMENTS")
    assert "already has 2 active deployments" in message and "quota is 2" in message
    assert rows(stack, "deployments", "deployment_events") == before

    other = make_api(api)
    for name in ("a", "b"):
        assert other.post("/api/deployments", json=body(name)).status_code == 201

    # A deleted (stopped) deployment no longer counts.
    deleted = api.delete(f"/api/deployments/{first.json()['id']}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "stopped"
    assert api.post("/api/deployments", json=body("c")).status_code == 201
    assert_quota_exceeded(api.post("/api/deployments", json=body("d")),
                          "QUOTA_ACTIVE_DEPLOYMENTS")


# Dataset bytes -----------------------------------------------------------------------------

def conversations(n: int) -> bytes:
    """``n`` conversations, unique to this call (the upload store is shared by the tests)."""
    tag = uuid.uuid4().hex
    return b"".join(json.dumps({"messages": [
        {"role": "user", "content": f"{tag} question {i}"},
        {"role": "assistant", "content": f"answer {i}"}]}).encode() + b"\n" for i in range(n))


def test_dataset_bytes_quota(api: Api, make_api, stack: Stack, quotas) -> None:
    a, b, c = conversations(3), conversations(2), conversations(1)
    quotas(dataset_bytes=len(a) + len(b) - 1)
    first = upload(api, a)
    assert first.status_code == 201, first.text

    before, files = rows(stack, "datasets"), stored(stack)
    message = assert_quota_exceeded(upload(api, b), "QUOTA_DATASET_BYTES", param="file")
    assert f"hold {len(a)} bytes" in message and f"upload of {len(b)} bytes" in message
    assert rows(stack, "datasets") == before and stored(stack) == files  # no row, no file

    quotas(dataset_bytes=len(a) + len(b))  # exactly full still fits
    assert upload(api, b).status_code == 201
    files = stored(stack)
    assert_quota_exceeded(upload(api, c), "QUOTA_DATASET_BYTES", param="file")
    assert stored(stack) == files
    # The same content again stores nothing new: it is the existing dataset, even when full.
    same = upload(api, a)
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]

    # Another project's bytes are its own, even for content this project stores too.
    other = make_api(api)
    assert upload(other, a).status_code == 201 and upload(other, c).status_code == 201

    # Deleting a dataset frees its bytes.
    assert api.delete(f"/api/datasets/{first.json()['id']}").status_code == 204
    assert upload(api, c).status_code == 201


# API keys ----------------------------------------------------------------------------------

def test_api_keys_quota(api: Api, make_api, stack: Stack, quotas) -> None:
    quotas(api_keys=2)
    extra = api.post("/api/keys", json={"name": "second"})
    assert extra.status_code == 201, extra.text
    before = rows(stack, "api_keys")
    message = assert_quota_exceeded(api.post("/api/keys", json={"name": "third"}),
                                    "QUOTA_API_KEYS")
    assert "already has 2 API keys not revoked" in message
    assert rows(stack, "api_keys") == before  # the refused key was rolled back
    # Another project's keys are its own.
    assert make_api(api).post("/api/keys", json={}).status_code == 201
    # A revoked key frees its share (and stays listed).
    assert api.delete(f"/api/keys/{extra.json()['id']}").status_code == 200
    assert api.post("/api/keys", json={"name": "third"}).status_code == 201


# Webhook endpoints -------------------------------------------------------------------------

def test_webhooks_quota(api: Api, make_api, stack: Stack, quotas) -> None:
    quotas(webhooks=2)
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["job.succeeded"]}
    created = [api.post("/api/webhooks", json=hook) for _ in range(2)]
    assert [r.status_code for r in created] == [201, 201], created[-1].text
    message = assert_quota_exceeded(api.post("/api/webhooks", json=hook), "QUOTA_WEBHOOKS")
    assert "already has 2 webhook endpoints" in message
    assert rows(stack, "webhooks") == {"webhooks": 2}
    assert make_api(api).post("/api/webhooks", json=hook).status_code == 201  # its own quota
    assert api.delete(f"/api/webhooks/{created[0].json()['id']}").status_code == 204
    assert api.post("/api/webhooks", json=hook).status_code == 201  # deleting one frees it


# Concurrent creates (Postgres) -------------------------------------------------------------

class Racer(threading.Thread):
    """A POST sent from another thread while the test holds a transaction open."""

    def __init__(self, api: Api, path: str, body: dict[str, Any], **headers: str) -> None:
        super().__init__()
        self.call = lambda: api.post(path, json=body, headers=headers)
        self.response: Any = None

    def run(self) -> None:
        self.response = self.call()

    def wait_blocked_or_done(self, stack: Stack) -> bool:
        """Whether it is blocked on a lock (False: it ended without waiting)."""
        deadline = time.monotonic() + 60  # only against a hang
        while self.is_alive():
            if stack.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'"):
                return True
            assert time.monotonic() < deadline, "the racing request neither waited nor ended"
            time.sleep(0.05)
        return False


@pytest.mark.parametrize("key, status", [(None, 429), ("same-key", 200)])
def test_a_racing_create_waits_for_the_other_and_is_refused(
        pg_api: Api, pg_job_body, pg_stack: Stack, quotas, key: str | None, status: int) -> None:
    """A request that would pass the check next to an uncommitted job waits for it, then sees
    it: with another key it is refused; with the same key it is that job's replay."""
    from app.db import get_sessionmaker
    from app.schemas.jobs import JobCreate
    from app.services.jobs import create_job
    from app.settings import get_settings

    quotas(active_jobs=1)
    with get_sessionmaker()() as session:
        job, created = create_job(session, project_of(pg_stack, pg_api),
                                  JobCreate.model_validate(pg_job_body()),
                                  settings=get_settings(), hub={}, idempotency_key="same-key")
        assert created  # and not committed yet
        racer = Racer(pg_api, "/api/jobs", pg_job_body(), **({"Idempotency-Key": key} if key else {}))
        racer.start()
        assert racer.wait_blocked_or_done(pg_stack), \
            f"the racing request did not wait: {racer.response.text}"
        session.commit()
    racer.join()
    assert racer.response.status_code == status, racer.response.text
    if status == 429:
        assert_quota_exceeded(racer.response, "QUOTA_ACTIVE_JOBS")
    else:
        assert racer.response.json()["id"] == job.id
    assert pg_stack.scalar("SELECT count(*) FROM jobs") == 1


def test_two_inserted_jobs_checking_in_turn_do_not_deadlock(
        pg_api: Api, pg_job_body, pg_stack: Stack, quotas) -> None:
    """Inserting a job locks its project row KEY SHARE (the foreign key); the quota's lock must
    not wait for that, or two requests that both inserted would wait for each other."""
    from app.db import get_sessionmaker
    from app.db.models import Job
    from app.errors import APIError
    from app.services import quotas as service, state
    from app.settings import get_settings

    quotas(active_jobs=1)
    with get_sessionmaker()() as session:
        job = Job(project_id=project_of(pg_stack, pg_api), spec={})
        state.initialize(session, job)  # inserted, not checked yet, not committed
        racer = Racer(pg_api, "/api/jobs", pg_job_body())
        racer.start()
        assert not racer.wait_blocked_or_done(pg_stack), "the request waited for the KEY SHARE"
        with pytest.raises(APIError) as refused:
            service.check_active(session, job, get_settings())
        assert refused.value.status_code == 429 and refused.value.code == "quota_exceeded"
        session.rollback()
    racer.join()
    assert racer.response.status_code == 201, racer.response.text
    assert pg_stack.scalar("SELECT count(*) FROM jobs") == 1
