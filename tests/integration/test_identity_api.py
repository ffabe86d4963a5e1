"""GET /api/me on both backends: the caller's project and the key making the request."""

from __future__ import annotations

from tests.conftest import Api, Stack
from tests.support.errors import assert_error


def test_me_names_the_project_and_the_key_in_use(api: Api, make_api, stack: Stack) -> None:
    response = api.get("/api/me")
    assert response.status_code == 200, response.text
    me = response.json()
    assert set(me) == {"object", "project", "key"} and me["object"] == "specdeck.identity"
    project_id = stack.scalar("SELECT project_id FROM api_keys WHERE prefix = :p", p=api.key[:12])
    assert me["project"] == {
        "id": project_id, "name": stack.scalar("SELECT name FROM projects WHERE id = :id",
                                               id=project_id)}
    key = me["key"]
    assert key["object"] == "specdeck.api_key" and key["prefix"] == api.key[:12]
    assert key["revoked_at"] is None and "key" not in key and "key_hash" not in key
    assert key == api.get("/api/keys").json()["data"][0]  # the KeyOut the list shows

    # Another key of the project: the same project, that key.
    created = api.post("/api/keys", json={"name": "second"}).json()
    second = Api(api.client, created["key"]).get("/api/me").json()
    assert second["project"] == me["project"]
    assert second["key"]["id"] == created["id"] != key["id"] and second["key"]["name"] == "second"

    # Another project's key: its own project.
    other = make_api(api).get("/api/me").json()
    assert other["project"]["id"] != project_id and other["key"]["id"] != key["id"]


def test_me_without_a_valid_key_is_401(api: Api) -> None:
    assert_error(api.client.get("/api/me"), 401, "missing_api_key")
    assert_error(Api(api.client, "sdk-not-a-key").get("/api/me"), 401, "invalid_api_key")
    created = api.post("/api/keys", json={"name": "gone"}).json()
    assert api.delete(f"/api/keys/{created['id']}").status_code == 200
    assert_error(Api(api.client, created["key"]).get("/api/me"), 401, "invalid_api_key")
