"""What the OpenAPI document now says, held by the server too, on both backends: a 405 names
every method of the path in Allow; names are matched whole; request bodies are not coerced;
and the inputs Schemathesis found answering 500 are client errors that write nothing."""

from __future__ import annotations

import pytest

from tests.conftest import Api, Stack
from tests.integration.test_deployments_api import write_drafter
from tests.integration.test_jobs_api import count_jobs
from tests.support.errors import assert_error

LONG = "x" * 300  # one path component over the OS's 255 bytes


@pytest.mark.parametrize("method, path, allow", [
    ("OPTIONS", "/api/jobs", "GET, POST"),
    ("PUT", "/api/jobs/job_0", "GET"),
    ("PATCH", "/api/secrets/HF_TOKEN", "DELETE, PUT"),
    ("OPTIONS", "/api/deployments/dep_0", "DELETE, GET, PATCH"),
    ("OPTIONS", "/api/keys", "GET, POST"),
    ("GET", "/api/keys/key_0", "DELETE"),
    ("GET", "/api/verifiers/inspect", "POST"),
    ("PUT", "/api/jobs/plan", "GET, POST"),  # GET: /api/jobs/{job_id}
    ("GET", "/v1/chat/completions", "POST"),  # the gateway's fast path takes POST only
])
def test_a_method_not_allowed_names_every_method_of_the_path(api: Api, method: str, path: str,
                                                            allow: str) -> None:
    response = api.client.request(method, path, headers=api.headers())
    error = assert_error(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == allow
    assert allow in error["message"]


def test_names_are_matched_whole(api: Api, job_body, stack: Stack) -> None:
    """A pattern ending in "$" let a trailing newline through: the secret was stored under
    that name, and the job would have been published to it."""
    assert_error(api.client.put("/api/secrets/HF_TOKEN%0A", json={"value": "v"},
                                headers=api.headers()), 422, "invalid_secret_name", "name")
    assert stack.scalar("SELECT count(*) FROM secrets") == 0
    before = count_jobs(stack)
    assert_error(api.post("/api/jobs", json=job_body(publish="org/name\n")), 422,
                 "invalid_value", "publish")
    assert count_jobs(stack) == before
    assert_error(api.post("/api/checkpoints/ckpt_0/publish", json={"repo_id": "org/name\n"}),
                 422, "invalid_value", "repo_id")
    # Ids the Hub's own client refuses (huggingface_hub's validate_repo_id), refused here too:
    # at the API, not half-way through a publish.
    for repo in ("org/x.git", "org/x--y", "org/x..y"):
        error = assert_error(api.post("/api/jobs", json=job_body(publish=repo)), 422,
                             "invalid_value", "publish")
        assert repo in error["message"] or "repo id" in error["message"].lower()
        assert_error(api.post("/api/checkpoints/ckpt_0/publish", json={"repo_id": repo}),
                     422, "invalid_value", "repo_id")
    assert count_jobs(stack) == before


@pytest.mark.parametrize("path, body, param", [
    ("/api/jobs", {"speculator": {"block_size": "16"}}, "speculator.block_size"),
    ("/api/jobs", {"evaluate": {"baseline": "false"}}, "evaluate.baseline"),
    ("/api/deployments", {"num_speculative_tokens": "3"}, "num_speculative_tokens"),
    ("/api/checkpoints/ckpt_0/publish", {"repo_id": "org/name", "private": "false"}, "private"),
])
def test_request_bodies_are_not_coerced(api: Api, job_body, stack: Stack, path: str,
                                        body: dict, param: str) -> None:
    """What the schema calls an integer or a boolean is one: "16" and "false" are refused."""
    full = {**job_body(), **body} if path == "/api/jobs" else body
    if path == "/api/deployments":
        full = {"name": "d", "drafter": write_drafter(stack.models_root),
                "verifier": job_body()["verifier"], **body}
    assert_error(api.post(path, json=full), 422, "invalid_value", param)
    assert count_jobs(stack) == 0
    assert stack.scalar("SELECT count(*) FROM deployments") == 0


def test_a_path_component_over_255_bytes_is_a_client_error(api: Api, job_body,
                                                          stack: Stack) -> None:
    """These answered 500 (OSError: File name too long) before."""
    for overrides, code, param in (
            ({"verifier": LONG}, "invalid_verifier", "verifier"),
            ({"verifier": f"./{LONG}"}, "invalid_path", "verifier"),
            ({"dataset": LONG}, "invalid_path", "dataset"),
            ({"dataset": f"sub/{LONG}.jsonl"}, "invalid_path", "dataset")):
        assert_error(api.post("/api/jobs", json=job_body(**overrides)), 422, code, param)
    drafter = {"name": "d", "verifier": job_body()["verifier"]}
    for name, code in ((LONG, "invalid_drafter"), (f"./{LONG}", "invalid_path")):
        assert_error(api.post("/api/deployments", json={**drafter, "drafter": name}), 422, code,
                     "drafter")
    assert count_jobs(stack) == 0
    assert stack.scalar("SELECT count(*) FROM deployments") == 0
