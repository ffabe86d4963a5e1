"""/api/webhooks on both backends: the secret shown once and stored encrypted, listing, paging,
deletion, isolation between projects, refused URLs and events, the test event, and the outbox
row written in the transaction of the state change (to subscribed endpoints of that project
only). Delivery itself: test_webhook_delivery.py."""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import Api, Stack
from tests.support.errors import assert_error
from tests.support.webhook_receiver import webhook_env  # noqa: F401 (fixture)

URL = "http://127.0.0.1:9/hook"  # allowed by name (webhook_env); nothing is sent in these tests


@pytest.fixture(autouse=True)
def _allowed(webhook_env) -> None:
    """127.0.0.1 allowed, as for a receiver in a test."""


def create(api: Api, **overrides) -> dict:
    response = api.post("/api/webhooks", json={"url": URL, "events": ["job.succeeded"],
                                               **overrides})
    assert response.status_code == 201, response.text
    return response.json()


def test_the_secret_is_shown_once_and_stored_encrypted(api: Api, stack: Stack) -> None:
    response = api.post("/api/webhooks", json={
        "url": URL, "events": ["job.succeeded", "job.failed", "job.succeeded"],
        "description": "CI"})
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    created = response.json()
    secret = created["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert created["events"] == ["job.succeeded", "job.failed"]  # once each
    assert created["id"].startswith("wh_") and created["description"] == "CI"

    shown = api.get(f"/api/webhooks/{created['id']}")
    assert shown.status_code == 200
    assert shown.json() == {k: v for k, v in created.items() if k != "secret"}
    listed = api.get("/api/webhooks")
    assert secret not in shown.text and secret not in listed.text
    assert [w["id"] for w in listed.json()["data"]] == [created["id"]]
    stored = stack.scalar("SELECT secret_ciphertext FROM webhooks")
    assert secret not in stored and secret[6:] not in stored


def test_list_is_newest_first_with_a_cursor_and_delete(api: Api, stack: Stack) -> None:
    ids = [create(api)["id"] for _ in range(3)]
    first = api.get("/api/webhooks", params={"limit": 2}).json()
    assert [w["id"] for w in first["data"]] == ids[:0:-1] and first["has_more"] is True
    rest = api.get("/api/webhooks", params={"limit": 2, "after": first["last_id"]}).json()
    assert [w["id"] for w in rest["data"]] == ids[:1] and rest["has_more"] is False

    assert api.post(f"/api/webhooks/{ids[0]}/test").status_code == 202
    deleted = api.delete(f"/api/webhooks/{ids[0]}")
    assert deleted.status_code == 204
    assert_error(api.get(f"/api/webhooks/{ids[0]}"), 404, "not_found")
    assert_error(api.delete(f"/api/webhooks/{ids[0]}"), 404, "not_found")
    # its pending delivery went with it: it is never sent
    assert stack.scalar("SELECT count(*) FROM webhook_deliveries") == 0
    assert [w["id"] for w in api.get("/api/webhooks").json()["data"]] == ids[:0:-1]


def test_another_projects_webhook_is_404_on_every_route(api: Api, make_api) -> None:
    webhook_id = create(api)["id"]
    other = make_api(api)
    for response in (other.get(f"/api/webhooks/{webhook_id}"),
                     other.get(f"/api/webhooks/{webhook_id}/deliveries"),
                     other.post(f"/api/webhooks/{webhook_id}/test"),
                     other.delete(f"/api/webhooks/{webhook_id}")):
        assert_error(response, 404, "not_found")
    assert other.get("/api/webhooks").json()["data"] == []
    assert api.get(f"/api/webhooks/{webhook_id}").status_code == 200


@pytest.mark.parametrize("body, code, param", [
    ({"events": ["job.exploded"]}, "invalid_value", "events.0"),
    ({"events": []}, "invalid_value", "events"),
    ({"events": "job.succeeded"}, "invalid_value", "events"),
    ({"url": "http://10.0.0.5/hook"}, "invalid_url", "url"),
    ({"url": "http://169.254.169.254/latest/meta-data/"}, "invalid_url", "url"),
    ({"url": "http://[fd00:ec2::254]/"}, "invalid_url", "url"),
    ({"url": "http://localhost:8080/hook"}, "invalid_url", "url"),  # only 127.0.0.1 is allowed
    ({"url": "http://192.168.1.1/"}, "invalid_url", "url"),
    ({"url": "ftp://127.0.0.1/hook"}, "invalid_url", "url"),
    ({"url": "http://user:pass@127.0.0.1/hook"}, "invalid_url", "url"),
    ({"url": "http://no-such-host.invalid/hook"}, "invalid_url", "url"),
    ({"url": "not a url"}, "invalid_url", "url"),
    ({"url": "http://127.0.0.1/" + "a" * 2048}, "invalid_value", "url"),
    ({"description": "d" * 501}, "invalid_value", "description"),
    ({"secret": "whsec_mine"}, "unknown_field", "secret"),
])
def test_bad_input_is_422_and_writes_nothing(api: Api, stack: Stack, body, code, param) -> None:
    response = api.post("/api/webhooks", json={"url": URL, "events": ["job.succeeded"], **body})
    assert_error(response, 422, code, param)
    assert stack.scalar("SELECT count(*) FROM webhooks") == 0


def test_the_test_event_goes_through_the_outbox(api: Api) -> None:
    webhook_id = create(api)["id"]  # subscribed to job.succeeded only: a test event still goes
    response = api.post(f"/api/webhooks/{webhook_id}/test")
    assert response.status_code == 202, response.text
    delivery = response.json()
    assert delivery["id"].startswith("msg_") and delivery["webhook_id"] == webhook_id
    assert delivery["event_type"] == "webhook.test" and delivery["status"] == "pending"
    assert delivery["attempt_count"] == 0 and delivery["attempts"] == []
    assert delivery["next_attempt_at"] is not None
    second = api.post(f"/api/webhooks/{webhook_id}/test").json()
    page = api.get(f"/api/webhooks/{webhook_id}/deliveries", params={"limit": 1}).json()
    assert [d["id"] for d in page["data"]] == [second["id"]] and page["has_more"] is True
    rest = api.get(f"/api/webhooks/{webhook_id}/deliveries",
                   params={"after": page["last_id"]}).json()
    assert [d["id"] for d in rest["data"]] == [delivery["id"]] and rest["has_more"] is False


def test_a_state_change_writes_the_outbox_in_its_own_transaction(api: Api, make_api, job_body,
                                                                 stack: Stack) -> None:
    """Cancelling a queued job writes job.cancelled for the endpoints of its project that
    subscribe to it, and nothing if the change rolls back."""
    from app.db import session_scope
    from app.db.models import Job
    from app.services.state import JobStatus, transition

    subscribed = create(api, events=["job.cancelled", "job.failed"])["id"]
    create(api, events=["job.succeeded"])  # not subscribed to job.cancelled
    create(make_api(api), events=["job.cancelled"])  # another project's
    rolled_back = api.post("/api/jobs", json=job_body()).json()["id"]
    with pytest.raises(RuntimeError), session_scope() as session:
        transition(session, session.get(Job, rolled_back), JobStatus.CANCELLED)
        assert stack.scalar("SELECT count(*) FROM webhook_deliveries") == 0  # not committed
        raise RuntimeError("the unit of work fails after the change")
    assert stack.scalar("SELECT count(*) FROM webhook_deliveries") == 0

    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    assert api.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert stack.scalar("SELECT count(*) FROM webhook_deliveries") == 1
    [delivery] = api.get(f"/api/webhooks/{subscribed}/deliveries").json()["data"]
    assert delivery["event_type"] == "job.cancelled" and delivery["status"] == "pending"
    body = json.loads(stack.scalar("SELECT body FROM webhook_deliveries"))
    assert body["type"] == "job.cancelled" and body["data"] == api.job(job_id)


def test_secrets_rotate_re_encrypts_webhook_secrets(api: Api, stack: Stack,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from app.db import session_scope
    from app.db.models import Webhook
    from app.services.secrets import rotate
    from app.services.webhooks import signing_secret
    from app.settings import Settings

    created = create(api)
    old = Settings()
    new = Settings(secret_key="a-new-key-" + "x" * 32, secret_key_previous=old.secret_key)
    with session_scope() as session:
        assert rotate(session, new) == 1
    after = Settings(secret_key=new.secret_key)  # the old key dropped
    with session_scope() as session:
        ciphertext = session.get(Webhook, created["id"]).secret_ciphertext
    assert signing_secret(created["id"], ciphertext, after) == created["secret"]
    with pytest.raises(RuntimeError, match="cannot be decrypted"):
        signing_secret(created["id"], ciphertext, old)
