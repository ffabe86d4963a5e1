"""Deployment replicas through the API on both backends: created with the deployment and
placed apart, scaled up and down by PATCH, each shown with its own status and worker, deleted
together, promoted together, and its rows never shown as deployments of their own. The workers
here are rows nobody runs (placement only); replicas serving through the gateway are in
tests/integration/test_gateway_replicas.py and, on real engines, tests/e2e/test_replicas.py."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Api, Stack
from tests.integration.test_promotions_api import make_checkpoint
from tests.integration.test_scheduling import local_deployment
from tests.support.errors import assert_error
from tests.support.webhook_receiver import webhook_env  # noqa: F401 (fixture)

if TYPE_CHECKING:
    from app.services.state import PromotionStatus


def add_worker(name: str, host: str, serving_slots: int = 2) -> None:
    """A worker row that stays alive and is never run: what is placed on it stays pending."""
    from app.db import session_scope
    from app.db.models import Worker, utcnow

    with session_scope() as session:
        session.add(Worker(id=name, host=host, queue=f"q-{uuid.uuid4().hex[:8]}", gpus=[],
                           capacity=1, serving_slots=serving_slots,
                           last_heartbeat_at=utcnow() + timedelta(hours=1)))


def rows(stack: Stack, deployment_id: str) -> list[tuple[int, str]]:
    """(replica, status) of every row of the deployment, its own included, oldest first."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Deployment

    with session_scope() as session:
        return [(r.replica, r.status) for r in session.scalars(
            select(Deployment).where((Deployment.id == deployment_id)
                                     | (Deployment.replica_of == deployment_id))
            .order_by(Deployment.created_at, Deployment.id))]


def test_replicas_are_created_with_the_deployment_and_placed_apart(api: Api, stack: Stack) -> None:
    add_worker("w-a", "host-a")
    add_worker("w-b", "host-b")
    created = api.post("/api/deployments", json={**local_deployment(stack), "replicas": 2})
    assert created.status_code == 201, created.text
    deployment = created.json()
    assert deployment["replicas"] == 2
    states = deployment["replica_states"]
    assert [s["replica"] for s in states] == [0, 1]
    assert all(s["status"] == "pending" and s["restarts"] == 0 for s in states)
    assert {s["worker"] for s in states} == {"w-a", "w-b"}  # one per host
    assert all(s["drafter"] == deployment["drafter"] for s in states)
    # The replica's row is no deployment of its own: not listed, not found by id.
    assert [d["id"] for d in api.get("/api/deployments").json()["data"]] == [deployment["id"]]
    [replica_id] = [stack.scalar("SELECT id FROM deployments WHERE replica_of = :id",
                                 id=deployment["id"])]
    assert_error(api.get(f"/api/deployments/{replica_id}"), 404, "not_found")
    # The workers' page names the deployment and the replica, never the replica's own row.
    running = {w["id"]: w["running"] for w in api.get("/api/workers").json()["data"]}
    assert sorted((r["id"], r["replica"]) for w in ("w-a", "w-b") for r in running[w]) == [
        (deployment["id"], 0), (deployment["id"], 1)]
    # Its events are the deployment's, marked with the replica.
    events = api.get(f"/api/deployments/{deployment['id']}/events").json()["data"]
    assert {e["replica"] for e in events} == {0, 1}
    assert any(e["replica"] == 1 and e["message"].startswith("replica 1 of deployment")
               for e in events)


def test_a_single_host_takes_replicas_on_slots_of_their_own(api: Api, stack: Stack) -> None:
    add_worker("laptop", "host-a", serving_slots=3)
    deployment = api.post("/api/deployments",
                          json={**local_deployment(stack), "replicas": 3}).json()
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Deployment

    with session_scope() as session:
        slots = sorted(r.allocation["serving"][0] for r in session.scalars(
            select(Deployment).where((Deployment.id == deployment["id"])
                                     | (Deployment.replica_of == deployment["id"]))))
    assert slots == [0, 1, 2]


def test_a_replica_that_finds_no_slot_says_what_holds_it(api: Api, stack: Stack) -> None:
    add_worker("laptop", "host-a", serving_slots=1)
    deployment = api.post("/api/deployments",
                          json={**local_deployment(stack), "replicas": 3}).json()
    first, second, third = deployment["replica_states"]
    assert (first["status"], first["worker"]) == ("pending", "laptop")
    assert second["worker"] is None and second["status_reason"] == (
        f"waiting for a free serving slot: laptop has 0 of 1 free (used by {deployment['id']})")
    assert third["status_reason"] == (f"waiting for a free serving slot; {deployment['id']} "
                                      "(replica 1) is older and first in line")


def test_scaling_up_and_down(api: Api, stack: Stack) -> None:
    deployment = api.post("/api/deployments", json=local_deployment(stack)).json()
    assert deployment["replicas"] == 1 and len(deployment["replica_states"]) == 1
    path = f"/api/deployments/{deployment['id']}"

    up = api.patch(path, json={"replicas": 3})
    assert up.status_code == 200, up.text
    assert up.json()["replicas"] == 3
    assert [s["replica"] for s in up.json()["replica_states"]] == [0, 1, 2]
    assert api.get(path).json()["replicas"] == 3

    down = api.patch(path, json={"replicas": 2})
    assert down.status_code == 200, down.text
    assert [s["replica"] for s in down.json()["replica_states"]] == [0, 1]
    # Pending replicas past the count stop at once; nothing else changed.
    assert rows(stack, deployment["id"]) == [(0, "pending"), (1, "pending"), (2, "stopped")]

    again = api.patch(path, json={"replicas": 3})  # a new row for index 2
    assert [s["status"] for s in again.json()["replica_states"]] == ["pending"] * 3
    assert rows(stack, deployment["id"])[-2:] == [(2, "stopped"), (2, "pending")]

    # Deleting stops every replica.
    assert api.delete(path).json()["status"] == "stopped"
    assert {status for _, status in rows(stack, deployment["id"])} == {"stopped"}
    assert_error(api.patch(path, json={"replicas": 2}), 409, "deployment_not_serving")


@pytest.mark.parametrize(("body", "code"), [
    ({"replicas": 0}, "invalid_value"), ({"replicas": 17}, "invalid_value"),
    ({"replicas": "2"}, "invalid_value"), ({}, "missing_field"),
    ({"replicas": 2, "name": "x"}, "unknown_field"),
])
def test_bad_scaling_is_refused_and_changes_nothing(api: Api, stack: Stack, body, code) -> None:
    deployment = api.post("/api/deployments", json=local_deployment(stack)).json()
    path = f"/api/deployments/{deployment['id']}"
    assert_error(api.patch(path, json=body), 422, code)
    assert rows(stack, deployment["id"]) == [(0, "pending")]
    assert_error(api.post("/api/deployments", json={**local_deployment(stack, "other"),
                                                    "replicas": 0}), 422, "invalid_value",
                 "replicas")
    assert_error(api.patch("/api/deployments/dep_" + "0" * 24, json={"replicas": 2}), 404,
                 "not_found")


def test_another_projects_deployment_cannot_be_scaled(api: Api, stack: Stack, make_api) -> None:
    deployment = api.post("/api/deployments", json=local_deployment(stack)).json()
    other = make_api(api)
    assert_error(other.patch(f"/api/deployments/{deployment['id']}", json={"replicas": 2}), 404,
                 "not_found")
    assert rows(stack, deployment["id"]) == [(0, "pending")]


def test_a_promotion_is_asked_of_every_serving_replica(api: Api, stack: Stack, job_body) -> None:
    from sqlalchemy import select, update

    from app.db import session_scope
    from app.db.models import Deployment, Promotion

    _, checkpoint_id = make_checkpoint(api, stack, job_body)
    _, second = make_checkpoint(api, stack, job_body)
    deployment = api.post("/api/deployments", json={"name": "fast", "checkpoint_id": checkpoint_id,
                                                    "replicas": 3}).json()
    # Replicas 0 and 1 serve (as a worker would have moved them); replica 2 waits for a slot.
    with session_scope() as session:
        session.execute(update(Deployment).where(
            ((Deployment.id == deployment["id"]) | (Deployment.replica_of == deployment["id"]))
            & (Deployment.replica < 2)).values(status="ready"))
    promoted = api.post(f"/api/deployments/{deployment['id']}/promote",
                        json={"checkpoint_id": second})
    assert promoted.status_code == 202, promoted.text
    assert promoted.json()["deployment_id"] == deployment["id"]
    with session_scope() as session:
        replicas = {r.replica: r for r in session.scalars(
            select(Deployment).where(Deployment.replica_of == deployment["id"]))}
        asked = {p.deployment_id: p for p in session.scalars(select(Promotion))}
        assert set(asked) == {deployment["id"], replicas[1].id}
        assert asked[replicas[1].id].target == asked[deployment["id"]].target
        assert asked[replicas[1].id].promotion_of == promoted.json()["id"]
        # The one not started yet starts with the new drafter.
        assert replicas[2].spec["drafter"] == asked[deployment["id"]].target["drafter"]
    # The deployment's history shows its own promotion, once, with each replica's step.
    [shown] = api.get(f"/api/deployments/{deployment['id']}/promotions").json()["data"]
    assert shown["id"] == promoted.json()["id"] and shown["status"] == "pending"
    assert [(r["replica"], r["status"]) for r in shown["replicas"]] == [(0, "pending"),
                                                                         (1, "pending")]
    assert promoted.json()["replicas"] == shown["replicas"]


def move_steps(deployment_id: str, steps: dict[int, tuple[str, str | None]]) -> None:
    """Put each replica's switch at a step (and reason), as its worker would have moved it."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Deployment, Promotion, utcnow

    with session_scope() as session:
        for promotion, replica in session.execute(
                select(Promotion, Deployment.replica).join(
                    Deployment, Deployment.id == Promotion.deployment_id).where(
                    (Deployment.id == deployment_id) | (Deployment.replica_of == deployment_id))):
            status, reason = steps[replica]
            promotion.status, promotion.status_reason = status, reason
            promotion.finished_at = utcnow() if status in ("succeeded", "failed") else None


def two_ready_replicas(api: Api, stack: Stack, job_body, name: str) -> tuple[dict, list[str]]:
    """A deployment of two replicas, both marked ready (as their workers would have), serving
    the first of three checkpoints; (the deployment, the checkpoints' ids)."""
    from sqlalchemy import update

    from app.db import session_scope
    from app.db.models import Deployment

    checkpoints = [make_checkpoint(api, stack, job_body)[1] for _ in range(3)]
    deployment = api.post("/api/deployments", json={"name": name, "checkpoint_id": checkpoints[0],
                                                    "replicas": 2}).json()
    with session_scope() as session:
        session.execute(update(Deployment).where(
            (Deployment.id == deployment["id"]) | (Deployment.replica_of == deployment["id"]))
            .values(status="ready"))
    return deployment, checkpoints


def test_a_promotion_is_as_far_as_its_slowest_replica(api: Api, stack: Stack, job_body) -> None:
    """The whole switch's step: the least advanced while any replica's is under way (and no
    other switch may start), succeeded once every replica's did, failed (saying which replica)
    if one's failed."""
    deployment, (_, second, third) = two_ready_replicas(api, stack, job_body, "fast")
    path = f"/api/deployments/{deployment['id']}"
    promoted = api.post(f"{path}/promote", json={"checkpoint_id": second})
    assert promoted.status_code == 202, promoted.text

    def shown() -> dict:
        [promotion] = api.get(f"{path}/promotions").json()["data"]
        return promotion

    move_steps(deployment["id"], {0: ("draining", None), 1: ("starting", None)})
    assert (shown()["status"], shown()["finished_at"]) == ("starting", None)
    # Replica 0 is done, replica 1 still switching: no other switch may start yet.
    move_steps(deployment["id"], {0: ("succeeded", None), 1: ("draining", None)})
    assert shown()["status"] == "draining"
    refused = assert_error(api.post(f"{path}/promote", json={"checkpoint_id": third}), 409,
                           "promotion_in_progress")
    assert promoted.json()["id"] in refused["message"]

    move_steps(deployment["id"], {0: ("succeeded", None), 1: ("succeeded", None)})
    done = shown()
    assert done["status"] == "succeeded" and done["finished_at"] is not None
    assert [r["status"] for r in done["replicas"]] == ["succeeded", "succeeded"]

    move_steps(deployment["id"], {0: ("succeeded", None), 1: ("failed", "the engine exited")})
    failed = shown()
    assert (failed["status"], failed["status_reason"]) == ("failed",
                                                           "replica 1: the engine exited")


def test_a_deployment_whose_own_row_fails_stops_its_other_replicas(api: Api, stack: Stack) -> None:
    """Replica 0 gave up (the worker's ending, replicas.failed): the deployment reads failed and
    can't be scaled, so the replicas serving beside it stop rather than serve on unmanaged. A
    replica past 0 that fails stops nothing."""
    from sqlalchemy import select, update

    from app.db import session_scope
    from app.db.models import Deployment
    from app.services import replicas
    from app.services.state import DeploymentStatus, transition

    deployment = api.post("/api/deployments", json={**local_deployment(stack), "replicas": 3}).json()
    with session_scope() as session:
        session.execute(update(Deployment).where(Deployment.replica_of == deployment["id"])
                        .values(status="ready"))
    with session_scope() as session:  # replica 1 fails for good: nothing else moves
        one = session.scalars(select(Deployment).where(Deployment.replica_of == deployment["id"],
                                                       Deployment.replica == 1)).one()
        transition(session, one, DeploymentStatus.FAILED, reason="engine crashed 5 times")
        replicas.failed(session, one)
    assert rows(stack, deployment["id"]) == [(0, "pending"), (1, "failed"), (2, "ready")]
    with session_scope() as session:  # the deployment's own row fails for good
        own = session.get(Deployment, deployment["id"])
        transition(session, own, DeploymentStatus.FAILED, reason="gave up after 5 restarts")
        replicas.failed(session, own)
    assert rows(stack, deployment["id"]) == [(0, "failed"), (1, "failed"), (2, "stopping")]
    shown = api.get(f"/api/deployments/{deployment['id']}").json()
    assert shown["status"] == "failed"
    events = api.get(f"/api/deployments/{deployment['id']}/events").json()["data"]
    assert any(e["replica"] == 2 and e["status"] == "stopping" and e["message"] == (
        f"deployment {deployment['id']} failed: gave up after 5 restarts") for e in events), events


def move_step(replica: int, promotion_id: str, to: "PromotionStatus",
              reason: str | None = None) -> None:
    """Move one replica's step of a promotion, as its worker does: to draining by switching
    its route (``switch_route``, to an engine nobody runs), else by ``move_promotion``."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Deployment, Promotion
    from app.services.promotions import switch_route
    from app.services.state import PromotionStatus, move_promotion

    with session_scope() as session:
        [row] = [p for p, r in session.execute(
            select(Promotion, Deployment.replica)
            .join(Deployment, Deployment.id == Promotion.deployment_id)
            .where((Promotion.id == promotion_id) | (Promotion.promotion_of == promotion_id)))
            if r == replica]
        deployment = session.get(Deployment, row.deployment_id)
        if to == PromotionStatus.DRAINING:
            switch_route(session, deployment, row, "http://127.0.0.1:9/v1", None)
        else:
            move_promotion(session, row, deployment, to, f"{to.value}: the test moved it",
                           reason=reason)


def test_a_switch_ends_with_one_webhook_event_however_close_its_replicas_end(
        api: Api, stack: Stack, job_body, webhook_env) -> None:  # noqa: F811
    """``deployment.promotion_succeeded`` (or ``..._failed``) is written once, when the last
    replica's step ends: here both replicas' last steps are written at the same moment, from
    two threads behind a barrier, on both databases."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import WebhookDelivery
    from app.services.state import PromotionStatus

    webhook = api.post("/api/webhooks", json={
        "url": "http://127.0.0.1:9/hook",  # allowed by name (webhook_env); nothing is sent
        "events": ["deployment.promotion_succeeded", "deployment.promotion_failed"]})
    assert webhook.status_code == 201, webhook.text
    deployment, checkpoints = two_ready_replicas(api, stack, job_body, "told")
    path = f"/api/deployments/{deployment['id']}"

    def at_once(promotion_id: str, ends: dict[int, tuple[PromotionStatus, str | None]]) -> None:
        barrier = threading.Barrier(len(ends))
        errors: list[BaseException] = []

        def end(replica: int) -> None:
            try:
                barrier.wait(timeout=30)
                move_step(replica, promotion_id, *ends[replica])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=end, args=(replica,)) for replica in ends]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [], errors

    def outbox() -> list[dict]:
        with session_scope() as session:
            return [json.loads(body) for body in session.scalars(
                select(WebhookDelivery.body).where(WebhookDelivery.webhook_id == webhook.json()["id"])
                .order_by(WebhookDelivery.id))]

    promoted = api.post(f"{path}/promote", json={"checkpoint_id": checkpoints[1]}).json()
    for to in (PromotionStatus.STARTING, PromotionStatus.DRAINING):
        for replica in (0, 1):
            move_step(replica, promoted["id"], to)
    assert outbox() == []  # nothing while the switch is under way
    at_once(promoted["id"], {0: (PromotionStatus.SUCCEEDED, None), 1: (PromotionStatus.SUCCEEDED, None)})
    [event] = outbox()
    [shown] = [p for p in api.get(f"{path}/promotions").json()["data"] if p["id"] == promoted["id"]]
    assert event["type"] == "deployment.promotion_succeeded"
    assert event["data"]["id"] == deployment["id"] and event["data"]["promotion"] == shown
    assert shown["status"] == "succeeded"

    # Replica 1's new engine never became ready: the switch failed, saying which replica.
    second = api.post(f"{path}/promote", json={"checkpoint_id": checkpoints[2]}).json()
    for replica in (0, 1):
        move_step(replica, second["id"], PromotionStatus.STARTING)
    move_step(0, second["id"], PromotionStatus.DRAINING)
    at_once(second["id"], {0: (PromotionStatus.SUCCEEDED, None),
                           1: (PromotionStatus.FAILED, "the engine exited")})
    first, event = outbox()
    assert event["type"] == "deployment.promotion_failed"
    assert event["data"]["promotion"]["id"] == second["id"]
    assert event["data"]["promotion"]["status_reason"] == "replica 1: the engine exited"
