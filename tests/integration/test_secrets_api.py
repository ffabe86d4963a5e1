"""Secrets: write-only, project-scoped, encrypted at rest, rotatable."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import SPECDECK, Api, Stack
from tests.support.errors import assert_error

TOKEN = "hf_SecretValue1234567890abcdef"


def test_put_list_delete_never_return_values(api: Api, stack: Stack) -> None:
    put = api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=api.headers())
    assert put.status_code == 200, put.text
    assert set(put.json()) == {"object", "name", "created_at", "updated_at"}
    listed = api.get("/api/secrets")
    assert [s["name"] for s in listed.json()["data"]] == ["HF_TOKEN"]
    assert TOKEN not in put.text + listed.text
    # Encrypted at rest: the plaintext is nowhere in the table.
    stored = stack.scalar("SELECT ciphertext FROM secrets WHERE name = 'HF_TOKEN'")
    assert stored and TOKEN not in stored
    # Overwrite keeps one row.
    api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN + "2"}, headers=api.headers())
    assert stack.scalar("SELECT count(*) FROM secrets") == 1
    assert api.delete("/api/secrets/HF_TOKEN").status_code == 204
    assert api.get("/api/secrets").json()["data"] == []
    assert_error(api.delete("/api/secrets/HF_TOKEN"), 404, "not_found")


def test_secrets_are_scoped_to_the_project(api: Api, make_api, stack: Stack) -> None:
    api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=api.headers())
    other = make_api(api)
    assert other.get("/api/secrets").json()["data"] == []
    assert_error(other.delete("/api/secrets/HF_TOKEN"), 404, "not_found")
    assert [s["name"] for s in api.get("/api/secrets").json()["data"]] == ["HF_TOKEN"]


def test_bad_secret_input(api: Api, stack: Stack) -> None:
    for name in ("1BAD", "has-dash", "x" * 65):
        assert_error(api.client.put(f"/api/secrets/{name}", json={"value": "v"},
                                    headers=api.headers()), 422, "invalid_secret_name", "name")
    assert_error(api.client.put("/api/secrets/OK", json={"value": ""}, headers=api.headers()),
                 422, "invalid_value", "value")
    assert_error(api.client.put("/api/secrets/OK", json={"value": "v", "extra": 1},
                                headers=api.headers()), 422, "unknown_field", "extra")
    assert stack.scalar("SELECT count(*) FROM secrets") == 0


def test_rotation_reencrypts_under_the_new_key(api: Api, stack: Stack) -> None:
    from tests.conftest import configure

    from app.db import session_scope
    from app.services.secrets import reveal
    from app.settings import get_settings

    api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=api.headers())
    project = stack.scalar("SELECT project_id FROM secrets")
    before = stack.scalar("SELECT ciphertext FROM secrets")
    old_key = get_settings().secret_key
    new_env = {"SPECDECK_SECRET_KEY": "n" * 40, "SPECDECK_SECRET_KEY_PREVIOUS": old_key}
    env = {**os.environ, **stack.env, **new_env}
    out = subprocess.run([SPECDECK, "admin", "secrets", "rotate"], env=env, capture_output=True, text=True,
                         check=True)
    assert "re-encrypted 1 secret" in out.stdout
    assert stack.scalar("SELECT ciphertext FROM secrets") != before
    configure({"SPECDECK_SECRET_KEY": "n" * 40, "SPECDECK_SECRET_KEY_PREVIOUS": ""})
    try:
        with session_scope() as session:
            assert reveal(session, project, "HF_TOKEN", get_settings()) == TOKEN
    finally:
        configure({"SPECDECK_SECRET_KEY": old_key})
