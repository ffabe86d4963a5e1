"""Webhook deliveries end to end: real Postgres (and SQLite for the first), the in-process API, real ``specdeck worker``
processes (test-only pipeline stages) and a real HTTP receiver on 127.0.0.1 that checks each
signature with the ``standardwebhooks`` library."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from tests.conftest import Api, Stack
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver, receiver, webhook_env  # noqa: F401 (fixtures)

FAST_JOB = {"metadata": {"test_seconds": "0.1"}}


def subscribe(api: Api, url: str, *events: str) -> tuple[str, str]:
    """A webhook for ``events``: its id and secret."""
    created = api.post("/api/webhooks", json={"url": url, "events": list(events)})
    assert created.status_code == 201, created.text
    return created.json()["id"], created.json()["secret"]


def deliveries(api: Api, webhook_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/api/webhooks/{webhook_id}/deliveries")
    assert response.status_code == 200, response.text
    return response.json()["data"]


def settled(api: Api, webhook_id: str) -> dict[str, Any]:
    """The webhook's one delivery, once it succeeded or failed."""
    return wait_for(lambda: next((d for d in deliveries(api, webhook_id)
                                  if d["status"] in ("succeeded", "failed")), None),
                    30, "the delivery to settle")


def test_job_succeeded_is_signed_and_carries_the_job(api: Api, stack: Stack, job_body,
                                                     webhook_env, receiver: Receiver) -> None:
    """On both backends: Postgres, and the embedded SQLite default."""
    webhook_id, secret = subscribe(api, receiver.url, "job.succeeded")
    stack.start_worker()
    job_id = api.post("/api/jobs", json=job_body(**FAST_JOB)).json()["id"]

    [request] = receiver.wait("job.succeeded")
    payload = request.verify(secret)  # raises unless the signature and timestamp check out
    assert payload["type"] == "job.succeeded" and payload["timestamp"].endswith("Z")
    assert payload["data"] == api.job(job_id)  # the job as GET /api/jobs/{id} shows it
    assert payload["data"]["status"] == "succeeded"
    assert request.headers["webhook-id"].startswith("msg_")
    assert request.headers["content-type"] == "application/json"
    assert request.path == "/hook"
    delivery = settled(api, webhook_id)
    assert delivery["id"] == request.headers["webhook-id"] and delivery["status"] == "succeeded"
    assert [a["status_code"] for a in delivery["attempts"]] == [200]


def test_failed_attempts_are_retried_with_the_same_webhook_id(pg_api: Api, pg_stack: Stack,
                                                              webhook_env) -> None:
    with Receiver(statuses=[500, 500, 200]) as receiver:
        webhook_id, secret = subscribe(pg_api, receiver.url, "job.succeeded")
        pg_stack.start_worker()
        sent = pg_api.post(f"/api/webhooks/{webhook_id}/test")
        assert sent.status_code == 202, sent.text

        requests = receiver.wait("webhook.test", count=3)
        delivery = settled(pg_api, webhook_id)
    assert {r.headers["webhook-id"] for r in requests} == {sent.json()["id"]}
    assert [r.verify(secret)["data"]["webhook_id"] for r in requests] == [webhook_id] * 3
    assert len({r.body for r in requests}) == 1  # the same bytes each time
    assert delivery["status"] == "succeeded" and delivery["attempt_count"] == 3
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]
    assert all(a["error"] is None and a["duration_ms"] >= 0 for a in delivery["attempts"])
    assert len(receiver.received) == 3  # nothing more once it succeeded


def test_a_delivery_whose_worker_was_killed_is_sent_again(pg_api: Api, pg_stack: Stack,
                                                          pg_job_body, webhook_env) -> None:
    """The worker dies after the state change and before it records the delivery: made
    deterministic by the receiver itself, which on the first request SIGKILLs the worker's
    process group and waits until it is gone before dropping the connection unanswered. The
    job's success was committed (with its outbox row) before the send began, and the worker
    committed its lease on the delivery before sending; nobody records this attempt's outcome.
    A worker started afterwards takes the delivery over once that lease ran out
    (SPECDECK_WEBHOOK_LEASE_SECONDS=15) and sends it again with the same webhook-id."""
    doomed: list[Any] = []

    def kill_the_sender(index: int, _request: object) -> bool | None:
        if index == 0:
            os.killpg(doomed[0].proc.pid, signal.SIGKILL)
            doomed[0].proc.wait(timeout=30)
            return False  # no answer: the sender is dead
        return None

    with Receiver(on_request=kill_the_sender) as receiver:
        webhook_id, secret = subscribe(pg_api, receiver.url, "job.succeeded")
        doomed.append(pg_stack.start_worker("doomed"))
        job_id = pg_api.post("/api/jobs", json=pg_job_body(**FAST_JOB)).json()["id"]
        receiver.wait("job.succeeded")
        assert doomed[0].proc.wait(timeout=30) == -signal.SIGKILL  # killed by the receiver
        assert pg_api.job(job_id)["status"] == "succeeded"
        [pending] = deliveries(pg_api, webhook_id)
        assert pending["status"] == "delivering" and pending["attempt_count"] == 1

        pg_stack.start_worker("restarted")
        first, second = receiver.wait("job.succeeded", count=2)
        delivery = settled(pg_api, webhook_id)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery["id"]
    assert first.verify(secret) == second.verify(secret)
    assert second.verify(secret)["data"]["id"] == job_id
    assert delivery["status"] == "succeeded" and delivery["attempt_count"] == 2
    lost, delivered = delivery["attempts"]
    assert lost["status_code"] is None and "worker sending it stopped" in lost["error"]
    assert delivered["status_code"] == 200


def test_job_failed_and_job_cancelled(pg_api: Api, pg_stack: Stack, pg_job_body, webhook_env,
                                      receiver: Receiver) -> None:
    _, secret = subscribe(pg_api, receiver.url, "job.failed", "job.cancelled")
    # Cancelled while queued, before any worker exists: the event waits in the outbox.
    cancelled = pg_api.post("/api/jobs", json=pg_job_body(**FAST_JOB)).json()["id"]
    assert pg_api.post(f"/api/jobs/{cancelled}/cancel").json()["status"] == "cancelled"
    pg_stack.start_worker()
    failing = pg_job_body(metadata={"test_seconds": "0.1", "test_exit_code": "3"})
    failed = pg_api.post("/api/jobs", json=failing).json()["id"]

    [on_cancel] = receiver.wait("job.cancelled")
    [on_failure] = receiver.wait("job.failed")
    assert on_cancel.verify(secret)["data"] == pg_api.job(cancelled)
    assert on_failure.verify(secret)["data"] == pg_api.job(failed)
    assert pg_api.job(failed)["status"] == "failed"
    assert not receiver.of_type("job.succeeded")


def test_deployment_ready_and_failed(pg_api: Api, pg_stack: Stack, webhook_env,
                                     receiver: Receiver) -> None:
    """The deployments are moved the way a worker moves them (state.transition); serving for
    real is tests/e2e/test_serving.py's job."""
    from app.db import session_scope
    from app.db.models import Deployment
    from app.services.state import DeploymentStatus, transition
    from tests.conftest import write_verifier
    from tests.integration.test_deployments_api import write_drafter

    _, secret = subscribe(pg_api, receiver.url, "deployment.ready", "deployment.failed")
    verifier, drafter = write_verifier(pg_stack.models_root), write_drafter(pg_stack.models_root)
    ids = [pg_api.post("/api/deployments", json={"name": name, "drafter": drafter,
                                                  "verifier": verifier, "runtime": "local"}
                       ).json()["id"] for name in ("serves", "breaks")]
    for deployment_id, ending in zip(ids, (DeploymentStatus.READY, DeploymentStatus.FAILED)):
        with session_scope() as session:
            deployment = session.get(Deployment, deployment_id)
            transition(session, deployment, DeploymentStatus.STARTING)
            transition(session, deployment, ending, reason="the engine exited")
    pg_stack.start_worker(SPECDECK_WORKER_SERVING_SLOTS="0")

    [ready] = receiver.wait("deployment.ready")
    [failed] = receiver.wait("deployment.failed")
    assert ready.verify(secret)["data"] == pg_api.get(f"/api/deployments/{ids[0]}").json()
    assert failed.verify(secret)["data"] == pg_api.get(f"/api/deployments/{ids[1]}").json()
    assert failed.verify(secret)["data"]["status"] == "failed"


def test_checkpoint_published(pg_api: Api, pg_stack: Stack, pg_job_body, webhook_env,
                              receiver: Receiver, tmp_path) -> None:
    """Published through a real worker by the real huggingface_hub client, against the Hub's
    TEST DOUBLE (tests/support/hub_double.py)."""
    from tests.integration.test_publish_outcomes import checkpoint_on
    from tests.integration.test_publishing import write_safetensors
    from tests.support.hub_double import HubDouble

    token = "hf_webhookTestToken0123456789abcdefgh"
    _, secret = subscribe(pg_api, receiver.url, "checkpoint.published")
    with HubDouble(token=token) as hub:
        pg_stack.start_worker("publisher", SPECDECK_HF_ENDPOINT=hub.url, HF_ENDPOINT=hub.url)
        config = {"aux_hidden_state_layer_ids": [1, 2, 3], "block_size": 4,
                  "draft_vocab_size": 512, "speculators_config": {"verifier": {
                      "name_or_path": "tiny", "architectures": ["Qwen3ForCausalLM"]}}}
        checkpoint_id = checkpoint_on(pg_api, pg_stack, pg_job_body, "publisher", config)
        directory = json.loads(pg_api.get(f"/api/checkpoints/{checkpoint_id}").text)["path"]
        write_safetensors(tmp_path / "model.safetensors", b"weights")
        os.replace(tmp_path / "model.safetensors", f"{directory}/model.safetensors")
        assert pg_api.client.put("/api/secrets/HF_TOKEN", json={"value": token},
                                 headers=pg_api.headers()).status_code == 200
        asked = pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish",
                            json={"repo_id": "specdeck/webhook-draft"})
        assert asked.status_code == 202, asked.text

        [published] = receiver.wait("checkpoint.published", timeout=60)
    data = published.verify(secret)["data"]
    assert data == pg_api.get(f"/api/checkpoints/{checkpoint_id}").json()
    assert data["publish_status"] == "published" and data["hub_repo"] == "specdeck/webhook-draft"
