"""Bad input is a client error in the one error shape, never a 500, and writes nothing: bodies
nested too deep, NUL characters and lone surrogates in any text, cursors past what the column
holds, and the name of an unknown field reported as it was sent. On both backends."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.db import get_engine
from tests.conftest import Api, Stack
from tests.integration.test_jobs_api import count_jobs
from tests.support.errors import assert_error

DEEP = "[" * 1000 + "]" * 1000  # deeper than Python's json parser can recurse
BIGINT_MAX = 2**63 - 1


def test_a_body_nested_too_deep_is_a_client_error(api: Api, job_body, stack: Stack) -> None:
    headers = {"Content-Type": "application/json"}
    before = count_jobs(stack)
    gateway = api.post("/v1/chat/completions", headers=headers,
                       content='{"model": "m", "messages": [], "x": ' + DEEP + "}")
    assert gateway.status_code == 400, gateway.text  # not retried by openai-python
    assert gateway.json()["error"]["code"] == "invalid_json"
    jobs = api.post("/api/jobs", headers=headers, content='{"metadata": ' + DEEP + "}")
    assert jobs.status_code == 400 and jobs.json()["error"]["message"], jobs.text  # FastAPI's
    assert count_jobs(stack) == before


def test_the_gateway_refuses_what_pythons_json_cannot_parse_and_no_more(api: Api) -> None:
    """The gateway parses with orjson (1,024 levels), and a body with over 500 brackets with
    Python's json as well, which the engines parse with: deeper than either goes is 400; a
    shallow body with many brackets goes on (here, to the model's lookup)."""
    headers = {"Content-Type": "application/json"}
    for deep in ("[" * 2000 + "]" * 2000, "[" * 1100 + "]" * 1100):
        response = api.post("/v1/chat/completions", headers=headers,
                            content='{"model": "m", "messages": [], "x": ' + deep + "}")
        assert_error(response, 400, "invalid_json")
    wide = "[" + ", ".join(["[{}]"] * 600) + "]"
    response = api.post("/v1/chat/completions", headers=headers,
                        content='{"model": "m", "messages": [], "x": ' + wide + "}")
    assert_error(response, 404, "model_not_found", "model")


@pytest.mark.parametrize("overrides, param", [
    ({"metadata": {"k": "a\u0000b"}}, "metadata"),
    ({"metadata": {"a\u0000b": "v"}}, "metadata"),
    ({"publish": "org/na\u0000me"}, "publish"),
])
def test_nul_in_a_job_body_is_refused(api: Api, job_body, stack: Stack, overrides: dict,
                                      param: str) -> None:
    before = count_jobs(stack)
    error = assert_error(api.post("/api/jobs", json=job_body(**overrides)), 422, "invalid_value",
                         param)
    assert "NUL" in error["message"]
    assert count_jobs(stack) == before


@pytest.mark.parametrize("path", ["/api/jobs", "/api/jobs/plan"])
@pytest.mark.parametrize("metadata", [{"\ud800": "\udfff"}, {"k": "a\udc00b"}])
def test_a_lone_surrogate_is_refused_and_nothing_is_stored(api: Api, job_body, stack: Stack,
                                                           path: str, metadata: dict) -> None:
    # A lone surrogate is valid JSON ("\ud800") but not Unicode text: no database column or
    # response could hold it. json.dumps escapes it, as a hostile client would send it.
    before = count_jobs(stack)
    response = api.post(path, headers={"Content-Type": "application/json"},
                        content=json.dumps(job_body(metadata=metadata)))
    error = assert_error(response, 422, "invalid_value", "metadata")
    assert "surrogate" in error["message"]
    assert count_jobs(stack) == before


def test_a_job_whose_stored_metadata_is_not_text_can_be_listed_read_and_cancelled(
        api: Api, job_body, stack: Stack) -> None:
    """A row written before the door refused lone surrogates (issue 23: it broke the job list,
    the job's page and its cancel, so a running trainer could not be stopped)."""
    job_id = api.post("/api/jobs", json=job_body(metadata={"team": "x"})).json()["id"]
    spec = stack.scalar("SELECT spec FROM jobs WHERE id = :id", id=job_id)
    spec = json.loads(spec) if isinstance(spec, str) else spec
    spec["metadata"] = {"\ud800": "\udfff"}
    with get_engine().begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET spec = :spec WHERE id = :id"),
                     {"spec": json.dumps(spec), "id": job_id})
    listed = api.get("/api/jobs")
    assert listed.status_code == 200, listed.text
    assert job_id in [job["id"] for job in listed.json()["data"]]
    read = api.get(f"/api/jobs/{job_id}")
    assert read.status_code == 200, read.text
    assert read.json()["metadata"] == {"\ufffd": "\ufffd"}  # what is not text, marked
    cancelled = api.post(f"/api/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


def test_nul_in_an_upload_name_is_refused_and_leaves_no_file(api: Api, stack: Stack,
                                                             roots: dict[str, str]) -> None:
    store = Path(roots["SPECDECK_DATA_ROOT"]) / "datasets"
    files_before = set(store.glob("*")) if store.exists() else set()
    rows_before = stack.scalar("SELECT count(*) FROM datasets")
    line = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    response = api.post("/api/datasets", files={"file": ("chat.jsonl", io.BytesIO(line))},
                        data={"name": "bad\u0000name"})
    error = assert_error(response, 422, "invalid_value", "name")
    assert "NUL" in error["message"]
    assert stack.scalar("SELECT count(*) FROM datasets") == rows_before
    assert (set(store.glob("*")) if store.exists() else set()) == files_before


def test_cursors_past_the_column_and_nul_names_are_client_errors(api: Api, job_body) -> None:
    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    for after in (str(BIGINT_MAX + 1), "99999999999999999999"):
        assert_error(api.get(f"/api/jobs/{job_id}/events", params={"after": after}), 422,
                     "invalid_value", "after")
    stream = api.get(f"/api/jobs/{job_id}/events/stream",
                     headers={"Last-Event-ID": "99999999999999999999"})
    assert_error(stream, 422, "invalid_value", "last-event-id")
    assert api.get(f"/api/jobs/{job_id}/events", params={"after": str(BIGINT_MAX)}).json()[
        "data"] == []
    assert_error(api.get(f"/api/jobs/{job_id}/metrics", params={"name": "\u0000"}), 422,
                 "invalid_value", "name")


def test_an_unknown_field_is_named_as_sent(api: Api, job_body) -> None:
    for path, body in (("/api/datasets", {"public": "sharegpt", "path": "x"}),
                       ("/api/jobs", job_body(query="x"))):
        error = assert_error(api.post(path, json=body), 422, "unknown_field")
        assert error["param"] in ("path", "query")
        assert error["message"] == f"Unknown field '{error['param']}'"
