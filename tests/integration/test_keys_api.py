"""The API keys API on both backends: a key is created in the caller's project and shown once,
listed by prefix only (never its hash or plaintext), revoked (the key in use too, which then
gets 401), and another project's keys are neither listed nor revocable (404)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Api, Stack, configure, new_key
from tests.support.errors import assert_error

KEY_FIELDS = {"object", "id", "name", "role", "prefix", "created_at", "last_used_at",
              "revoked_at"}


def count_keys(stack: Stack) -> int:
    return stack.scalar("SELECT count(*) FROM api_keys")


def as_key(api: Api, plaintext: str) -> Api:
    return Api(api.client, plaintext)


def id_of(api: Api) -> str:
    """The id of the key ``api`` uses, found by its prefix."""
    return next(k["id"] for k in api.get("/api/keys", params={"limit": 100}).json()["data"]
                if api.key.startswith(k["prefix"]))


def test_a_new_key_is_shown_once_and_works_in_the_callers_project(
        api: Api, job_body, stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        response = api.post("/api/keys", json={"name": "ci"})
    assert response.status_code == 201, response.text
    assert response.headers["Cache-Control"] == "no-store"
    created = response.json()
    assert set(created) == KEY_FIELDS | {"key"}
    plaintext = created["key"]
    assert plaintext.startswith("sdk-") and plaintext.startswith(created["prefix"])
    assert len(created["prefix"]) < len(plaintext) // 2
    assert created["name"] == "ci" and created["revoked_at"] is None
    assert plaintext not in caplog.text
    # Stored as its hash, never in plaintext.
    digest = hashlib.sha256(plaintext.encode()).hexdigest()
    assert stack.scalar("SELECT key_hash FROM api_keys WHERE id = :id", id=created["id"]) == digest
    assert stack.scalar("SELECT count(*) FROM api_keys WHERE key_hash = :k OR prefix = :k",
                        k=plaintext) == 0

    # The caller's project: a job made with the new key is the caller's.
    new = as_key(api, plaintext)
    job = new.post("/api/jobs", json=job_body())
    assert job.status_code == 201, job.text
    assert api.get(f"/api/jobs/{job.json()['id']}").status_code == 200

    # Never shown again: neither the plaintext nor the hash is in any listing.
    for client in (api, new):
        listing = client.get("/api/keys")
        assert listing.status_code == 200, listing.text
        assert plaintext not in listing.text and digest not in listing.text
        entry = next(k for k in listing.json()["data"] if k["id"] == created["id"])
        assert {**entry, "last_used_at": None} == {k: v for k, v in created.items() if k != "key"}
        assert entry["last_used_at"] is not None  # it made the job above


def test_a_key_records_its_last_use_through_the_api(api: Api, stack: Stack) -> None:
    created = api.post("/api/keys", json={"name": "idle"}).json()
    assert created["last_used_at"] is None
    listed = next(k for k in api.get("/api/keys").json()["data"] if k["id"] == created["id"])
    assert listed["last_used_at"] is None  # listing it is not using it
    assert as_key(api, created["key"]).get("/api/me").status_code == 200
    used = next(k for k in api.get("/api/keys").json()["data"] if k["id"] == created["id"])
    assert used["last_used_at"] is not None and used["last_used_at"] >= created["created_at"]


def test_a_project_keeps_its_last_key(api: Api, stack: Stack) -> None:
    own = id_of(api)
    refused = api.delete(f"/api/keys/{own}")
    error = assert_error(refused, 409, "last_key", "key_id")
    assert "create another admin key" in error["message"]
    assert stack.scalar("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0
    assert api.get("/api/keys").status_code == 200  # still signed in
    # A revoked key does not count: with one other key revoked, the last one is still refused.
    other = api.post("/api/keys", json={"name": "other"}).json()
    assert api.delete(f"/api/keys/{other['id']}").status_code == 200
    assert_error(api.delete(f"/api/keys/{own}"), 409, "last_key", "key_id")
    # Revoking the revoked one again is still fine (nothing changes).
    assert api.delete(f"/api/keys/{other['id']}").status_code == 200


def test_the_list_is_newest_first_with_a_cursor(api: Api) -> None:
    made = [api.post("/api/keys", json={"name": f"k{i}"}).json()["id"] for i in range(3)]
    first = api.get("/api/keys", params={"limit": 2}).json()
    assert [k["id"] for k in first["data"]] == made[::-1][:2]
    assert first["has_more"] is True and first["last_id"] == made[1]
    rest = api.get("/api/keys", params={"limit": 2, "after": first["last_id"]}).json()
    assert [k["id"] for k in rest["data"]] == [made[0], id_of(api)]
    assert rest["has_more"] is False


def test_a_revoked_key_gets_401_and_stays_listed(api: Api, stack: Stack) -> None:
    created = api.post("/api/keys", json={"name": "leaked"}).json()
    leaked = as_key(api, created["key"])
    assert leaked.get("/api/jobs").status_code == 200

    revoked = api.delete(f"/api/keys/{created['id']}")
    assert revoked.status_code == 200, revoked.text
    assert set(revoked.json()) == KEY_FIELDS and revoked.json()["revoked_at"] is not None
    for method, path in (("get", "/api/jobs"), ("get", "/api/keys"), ("post", "/api/keys")):
        assert_error(getattr(leaked, method)(path, **({"json": {}} if method == "post" else {})),
                     401, "invalid_api_key")
    # Revoking again changes nothing; the key stays in the list with when it was revoked.
    again = api.delete(f"/api/keys/{created['id']}")
    assert again.status_code == 200 and again.json() == revoked.json()
    listed = next(k for k in api.get("/api/keys").json()["data"] if k["id"] == created["id"])
    assert listed["revoked_at"] == revoked.json()["revoked_at"]
    assert api.get("/api/jobs").status_code == 200  # the caller's own key is untouched


def test_the_key_in_use_can_revoke_itself(api: Api, stack: Stack) -> None:
    spare = api.post("/api/keys", json={"name": "spare"}).json()["key"]
    own = id_of(api)
    response = api.delete(f"/api/keys/{own}")
    assert response.status_code == 200, response.text
    assert response.json()["id"] == own and response.json()["revoked_at"]
    assert_error(api.get("/api/keys"), 401, "invalid_api_key")
    assert_error(api.delete(f"/api/keys/{own}"), 401, "invalid_api_key")
    assert as_key(api, spare).get("/api/keys").status_code == 200


def test_another_projects_keys_are_not_listed_nor_revocable(api: Api, make_api,
                                                           stack: Stack) -> None:
    other = make_api(api)
    theirs = other.post("/api/keys", json={"name": "theirs"}).json()
    mine = api.get("/api/keys").json()["data"]
    assert theirs["id"] not in [k["id"] for k in mine] and len(mine) == 1
    assert_error(api.delete(f"/api/keys/{theirs['id']}"), 404, "not_found", "key_id")
    assert_error(api.delete(f"/api/keys/{id_of(other)}"), 404, "not_found", "key_id")
    assert stack.scalar("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0
    assert as_key(api, theirs["key"]).get("/api/keys").status_code == 200


@pytest.mark.parametrize("body, code, param", [
    ({"name": "x" * 101}, "invalid_value", "name"),
    ({"name": "a\u0000b"}, "invalid_value", "name"),
    ({"name": 5}, "invalid_value", "name"),
    ({"label": "x"}, "unknown_field", "label"),
    ([], "invalid_value", None),
    (None, "missing_field", None),
])
def test_a_bad_create_is_a_client_error_and_creates_nothing(api: Api, stack: Stack, body,
                                                            code: str, param: str | None) -> None:
    before = count_keys(stack)
    response = api.post("/api/keys", **({} if body is None else {"json": body}))
    assert_error(response, 422, code, param)
    assert count_keys(stack) == before


def test_bad_ids_cursors_and_missing_keys_are_client_errors(api: Api, stack: Stack) -> None:
    assert_error(api.delete("/api/keys/job_0123456789abcdef01234567"), 422, "invalid_value",
                 "key_id")
    assert_error(api.delete("/api/keys/key_0123456789abcdef01234567"), 404, "not_found", "key_id")
    assert_error(api.get("/api/keys", params={"after": "x\u0000"}), 422, "invalid_value", "after")
    assert_error(api.get("/api/keys", params={"limit": 0}), 422, "invalid_value", "limit")
    before = count_keys(stack)
    own = id_of(api)
    for method, path in (("get", "/api/keys"), ("post", "/api/keys"),
                         ("delete", f"/api/keys/{own}")):
        response = api.client.request(method.upper(), path, json={} if method == "post" else None)
        assert_error(response, 401, "missing_api_key")
    assert count_keys(stack) == before
    assert stack.scalar("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0


@pytest.fixture
def short_auth_cache(stack: Stack) -> Iterator[Api]:
    """An app whose gateway caches a key for half a second (the default is 5)."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    os.environ["SPECDECK_GATEWAY_AUTH_CACHE_SECONDS"] = "0.5"
    configure({})
    try:
        with TestClient(create_app()) as client:
            yield Api(client, new_key())
    finally:
        del os.environ["SPECDECK_GATEWAY_AUTH_CACHE_SECONDS"]
        configure({})


def test_the_gateway_refuses_a_revoked_key_once_its_cache_expires(short_auth_cache: Api) -> None:
    api = short_auth_cache
    created = api.post("/api/keys", json={}).json()
    key = as_key(api, created["key"])
    assert key.get("/v1/models").status_code == 200  # now in the gateway's cache
    assert api.delete(f"/api/keys/{created['id']}").status_code == 200
    assert_error(key.get("/api/keys"), 401, "invalid_api_key")  # /api: at once
    deadline = time.monotonic() + 30
    while key.get("/v1/models").status_code != 401:
        assert time.monotonic() < deadline, "the gateway still serves a revoked key"
        time.sleep(0.1)
    assert key.get("/v1/models").json()["error"]["code"] == "invalid_api_key"


# Roles: admin (everything), member (train, deploy, chat), inference (/v1 alone) -------------

def make_role_key(api: Api, role: str) -> Api:
    response = api.post("/api/keys", json={"name": role, "role": role})
    assert response.status_code == 201, response.text
    assert response.json()["role"] == role
    return as_key(api, response.json()["key"])


def test_an_inference_key_is_refused_on_api_and_a_member_on_keys_secrets_and_webhooks(
        api: Api, job_body, stack: Stack) -> None:
    inference, member = make_role_key(api, "inference"), make_role_key(api, "member")
    keys_before = count_keys(stack)
    for path, body in (("/api/keys", {"name": "x"}), ("/api/deployments", {"name": "d"}),
                       ("/api/jobs", job_body()), ("/api/webhooks", {"url": "https://e.x/h"})):
        error = assert_error(inference.post(path, json=body), 403, "key_role")
        assert "inference-only" in error["message"] and "/v1" in error["message"]
    for path in ("/api/me", "/api/jobs", "/api/keys", "/api/deployments", "/api/secrets"):
        assert_error(inference.get(path), 403, "key_role")
    # A member trains and deploys (its requests get past the role check; a bad body is a 422,
    # not a 403), and reads the project; keys, secrets and webhooks are an admin's.
    assert member.post("/api/jobs", json=job_body()).status_code == 201
    assert member.post("/api/deployments", json={}).status_code == 422
    assert member.get("/api/me").json()["key"]["role"] == "member"
    for response in (member.get("/api/keys"), member.post("/api/keys", json={}),
                     member.get("/api/secrets"), member.put("/api/secrets/HF_TOKEN",
                                                            json={"value": "hf_x"}),
                     member.get("/api/webhooks"), member.delete(f"/api/keys/{id_of(api)}")):
        error = assert_error(response, 403, "key_role")
        assert "'member'" in error["message"] and "admin" in error["message"]
    assert count_keys(stack) == keys_before
    assert stack.scalar("SELECT count(*) FROM secrets") == 0


def test_a_new_key_has_the_role_it_is_given_and_at_most_its_makers(api: Api) -> None:
    assert api.get("/api/me").json()["key"]["role"] == "admin"  # specdeck admin keys create
    default = api.post("/api/keys", json={"name": "d"}).json()
    assert default["role"] == "admin"  # the maker's own
    for role in ("admin", "member", "inference"):
        assert make_role_key(api, role).get("/api/me").status_code == (
            403 if role == "inference" else 200)
    assert_error(api.post("/api/keys", json={"role": "owner"}), 422, "invalid_value", "role")
    listed = {k["name"]: k["role"] for k in api.get("/api/keys").json()["data"]}
    assert listed["member"] == "member" and listed["inference"] == "inference"


def test_the_last_admin_key_cannot_be_revoked_but_other_roles_can(api: Api) -> None:
    member = make_role_key(api, "member")
    admin_id = id_of(api)
    member_id = next(k["id"] for k in api.get("/api/keys").json()["data"]
                     if member.key.startswith(k["prefix"]))
    # The member is active, but it can't manage the project: the admin is still its last.
    assert_error(api.delete(f"/api/keys/{admin_id}"), 409, "last_key", "key_id")
    assert api.delete(f"/api/keys/{member_id}").json()["revoked_at"]
