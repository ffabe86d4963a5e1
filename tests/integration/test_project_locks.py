"""Per-project locks over real HTTP, on both databases: a ``specdeck api`` process, and requests
of one project sent from threads released together by a barrier (each on a connection of its
own, opened before), so they really overlap. Keys revoking each other leave the project an
active key; creates racing at a quota minus one make exactly one of them and refuse the rest."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.conftest import Stack, write_dataset, write_verifier
from tests.integration.test_deployments_api import write_drafter
from tests.integration.test_quotas import assert_quota_exceeded, conversations
from tests.support.api_server import start_api, stop_api
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from app.services.keys import NewKey

QUOTA = 3  # each per-project quota of the API process (dataset bytes: QUOTA uploads)
RACERS = 6
ROUNDS = 5
UPLOAD_BYTES = len(conversations(1))  # the same for every call: only its random tag differs

VERIFIER, DRAFTER, DATASET = "tiny", "drafter", "chat.jsonl"

Call = Callable[[httpx.Client], httpx.Response]


@dataclass
class Server:
    url: str
    stack: Stack

    def scalar(self, sql: str, **params: object) -> object:
        return self.stack.scalar(sql, **params)


@pytest.fixture
def server(stack: Stack, tmp_path: Path) -> Iterator[Server]:
    """``specdeck api`` on the stack's database, its quotas lowered to QUOTA; the files that
    jobs and deployments name are in place."""
    write_verifier(stack.models_root, VERIFIER)
    write_drafter(stack.models_root, DRAFTER)
    write_dataset(stack.data_root, DATASET)
    quotas = {"ACTIVE_JOBS": QUOTA, "ACTIVE_DEPLOYMENTS": QUOTA, "API_KEYS": QUOTA,
              "WEBHOOKS": QUOTA, "DATASET_BYTES": QUOTA * UPLOAD_BYTES}
    env = {**os.environ, **stack.env, "SPECDECK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
           **{f"SPECDECK_QUOTA_{name}": str(value) for name, value in quotas.items()}}
    url, proc = start_api(env, tmp_path / "api.log")
    try:
        yield Server(url, stack)
    finally:
        stop_api(proc)


def race(url: str, calls: list[Call]) -> list[httpx.Response]:
    """Each call in a thread of its own, all released at once; their answers, in order."""
    barrier = threading.Barrier(len(calls))

    def run(call: Call) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=60) as client:
            client.get("/healthz").raise_for_status()  # connected before the start
            barrier.wait(timeout=30)
            return call(client)

    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(run, call) for call in calls]]


def auth(plaintext: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {plaintext}"}


def project_keys(n: int) -> list[NewKey]:
    """``n`` keys of a new project (made in this process, as `specdeck admin keys create` does)."""
    from app.db import session_scope
    from app.services.keys import create_key

    project = f"locks-{uuid.uuid4().hex[:8]}"
    with session_scope() as session:
        return [create_key(session, project) for _ in range(n)]


def active_keys(server: Server, project_id: str) -> int:
    return int(server.scalar("SELECT count(*) FROM api_keys WHERE project_id = :p "
                             "AND revoked_at IS NULL", p=project_id))


def revoke(key: NewKey, other: NewKey) -> Call:
    return lambda client: client.delete(f"/api/keys/{other.key.id}", headers=auth(key.plaintext))


# Keys revoking each other ----------------------------------------------------------------

def test_two_keys_revoking_each_other_leave_one_active(server: Server) -> None:
    for _ in range(ROUNDS):
        a, b = project_keys(2)
        answers = race(server.url, [revoke(a, b), revoke(b, a)])
        codes = sorted(r.status_code for r in answers)
        # The loser was revoked before it was authenticated (401), or after (409 last_key).
        assert codes in ([200, 401], [200, 409]), [r.text for r in answers]
        assert active_keys(server, a.key.project_id) == 1


def test_three_keys_revoking_in_a_cycle_leave_one_active(server: Server) -> None:
    for _ in range(ROUNDS):
        a, b, c = project_keys(3)
        answers = race(server.url, [revoke(a, b), revoke(b, c), revoke(c, a)])
        assert {r.status_code for r in answers} <= {200, 401, 409}, [r.text for r in answers]
        assert active_keys(server, a.key.project_id) >= 1


# Creates racing at a quota minus one -------------------------------------------------------

@dataclass
class Quota:
    setting: str
    create: Callable[[httpx.Client, str, str], httpx.Response]  # (client, key, a unique tag)
    sql: str  # how much of it the project :p holds, in creates
    param: str | None = None

    def held(self, server: Server, project: str) -> int:
        return int(server.scalar(self.sql, p=project))  # a Decimal on Postgres (its sum)


def create_job(client: httpx.Client, key: str, tag: str) -> httpx.Response:
    body = {"verifier": VERIFIER, "dataset": DATASET, "runtime": "local"}
    return client.post("/api/jobs", json=body, headers=auth(key))


def create_deployment(client: httpx.Client, key: str, tag: str) -> httpx.Response:
    body = {"name": f"d-{tag}", "drafter": DRAFTER, "verifier": VERIFIER, "runtime": "local"}
    return client.post("/api/deployments", json=body, headers=auth(key))


def upload(client: httpx.Client, key: str, tag: str) -> httpx.Response:
    file = (f"{tag}.jsonl", conversations(1), "application/jsonl")
    return client.post("/api/datasets", files={"file": file}, headers=auth(key))


def create_key(client: httpx.Client, key: str, tag: str) -> httpx.Response:
    return client.post("/api/keys", json={"name": tag}, headers=auth(key))


def create_webhook(client: httpx.Client, key: str, tag: str) -> httpx.Response:
    hook = {"url": f"http://127.0.0.1:9/hook-{tag}", "events": ["job.succeeded"]}
    return client.post("/api/webhooks", json=hook, headers=auth(key))


QUOTAS = {  # no worker runs: every job and deployment stays active
    "jobs": Quota("QUOTA_ACTIVE_JOBS", create_job,
                  "SELECT count(*) FROM jobs WHERE project_id = :p"),
    "deployments": Quota("QUOTA_ACTIVE_DEPLOYMENTS", create_deployment,
                         "SELECT count(*) FROM deployments WHERE project_id = :p"),
    # QUOTA uploads of UPLOAD_BYTES fill it exactly.
    "dataset_bytes": Quota("QUOTA_DATASET_BYTES", upload, "SELECT coalesce(sum(num_bytes), 0) / "
                           f"{UPLOAD_BYTES} FROM datasets WHERE project_id = :p", param="file"),
    # The project's first key counts too.
    "api_keys": Quota("QUOTA_API_KEYS", create_key,
                      "SELECT count(*) FROM api_keys WHERE project_id = :p AND revoked_at IS NULL"),
    "webhooks": Quota("QUOTA_WEBHOOKS", create_webhook,
                      "SELECT count(*) FROM webhooks WHERE project_id = :p"),
}


@pytest.mark.parametrize("name", QUOTAS)
def test_creates_racing_at_a_quota_minus_one_make_exactly_one(server: Server, name: str) -> None:
    quota = QUOTAS[name]
    [key] = project_keys(1)
    project = key.key.project_id
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(QUOTA - 1 - quota.held(server, project)):
            made = quota.create(client, key.plaintext, f"setup-{i}")
            assert made.status_code == 201, made.text
    assert quota.held(server, project) == QUOTA - 1

    answers = race(server.url, [
        lambda client, i=i: quota.create(client, key.plaintext, f"racer-{i}")
        for i in range(RACERS)])
    codes = [r.status_code for r in answers]
    assert sorted(codes) == [201] + [429] * (RACERS - 1), [r.text for r in answers]
    for refused in (r for r in answers if r.status_code == 429):
        assert_quota_exceeded(refused, quota.setting, param=quota.param)
    assert quota.held(server, project) == QUOTA


# Scalings racing --------------------------------------------------------------------------

def test_scalings_racing_leave_one_replica_per_index(server: Server) -> None:
    """Six PATCHes of one deployment's replicas at once: whatever order they run in, the
    deployment ends with one active row per index below the count the last one set."""
    [key] = project_keys(1)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        made = create_deployment(client, key.plaintext, "scaled")
        assert made.status_code == 201, made.text
    deployment = made.json()["id"]
    for _ in range(ROUNDS):
        answers = race(server.url, [
            lambda client, n=n: client.patch(f"/api/deployments/{deployment}",
                                             json={"replicas": n}, headers=auth(key.plaintext))
            for n in (2, 3, 4, 2, 3, 4)])
        assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            final = client.get(f"/api/deployments/{deployment}", headers=auth(key.plaintext)).json()
        active = "FROM deployments WHERE (id = :d OR replica_of = :d) AND status = 'pending'"
        rows = server.scalar(f"SELECT count(*) {active}", d=deployment)
        indices = server.scalar(f"SELECT count(DISTINCT replica) {active}", d=deployment)
        assert rows == indices == final["replicas"], (rows, indices, final)
        assert [s["replica"] for s in final["replica_states"]] == list(range(final["replicas"]))


def test_a_delete_wins_over_a_scale_sent_at_the_same_moment(server: Server, stack: Stack) -> None:
    """PATCH replicas and DELETE released together, 20 times: whichever runs first, the
    deployment ends deleted, every replica row stopped (none pending, so none for a worker to
    start), and a worker that comes online afterwards starts no engine."""
    from app.db import session_scope
    from app.services.keys import create_key

    with session_scope() as session:
        key = create_key(session, f"proj-{uuid.uuid4().hex[:8]}").plaintext
    outcomes = set()
    for round_ in range(20):
        with httpx.Client(base_url=server.url, headers=auth(key), timeout=60) as client:
            created = client.post("/api/deployments", json={
                "name": f"race-{round_}", "drafter": DRAFTER, "verifier": VERIFIER,
                "runtime": "local"})
            assert created.status_code == 201, created.text
            deployment_id = created.json()["id"]
        scaled, deleted = race(server.url, [
            lambda c: c.patch(f"/api/deployments/{deployment_id}", json={"replicas": 4},
                              headers=auth(key)),
            lambda c: c.delete(f"/api/deployments/{deployment_id}", headers=auth(key))])
        assert deleted.status_code == 200, deleted.text
        # First, it scaled and the delete stopped the new replicas too; second, it found the
        # deployment deleted.
        assert scaled.status_code in (200, 409), scaled.text
        if scaled.status_code == 409:
            assert scaled.json()["error"]["code"] == "deployment_not_serving"
        outcomes.add(scaled.status_code)
        rows = server.scalar("SELECT count(*) FROM deployments WHERE id = :id OR replica_of = :id",
                             id=deployment_id)
        left = server.scalar("SELECT count(*) FROM deployments WHERE (id = :id OR replica_of = :id)"
                             " AND status != 'stopped'", id=deployment_id)
        assert left == 0 and rows >= 1, (round_, scaled.text)
    # A worker online afterwards: its reconciler schedules what waits, every round; after two of
    # its heartbeats nothing was placed on it, nor runs.
    stack.start_worker("late")
    beats: set[object] = set()
    wait_for(lambda: beats.add(server.scalar(
        "SELECT last_heartbeat_at FROM workers WHERE id = 'late'")) or len(beats) >= 3, 30,
        "the worker's rounds")
    assert server.scalar("SELECT count(*) FROM deployments WHERE status != 'stopped'") == 0
    assert server.scalar("SELECT count(*) FROM allocations") == 0
