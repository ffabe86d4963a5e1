"""POST /api/jobs/plan on both backends: the plan of the job a body would create, the same as
GET /api/jobs/{id}/plan shows once it is created (but for the job's id), with the same client
errors as POST /api/jobs, and nothing written: no job, no event, no allocation, no quota used."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Api, Stack
from tests.support.errors import assert_error
from tests.integration.test_quotas import quotas  # noqa: F401 (a fixture)

PLAN = "/api/jobs/plan"


def row_counts(stack: Stack) -> dict[str, int]:
    from app.db.models import Base

    return {table: stack.scalar(f"SELECT count(*) FROM {table}") for table in Base.metadata.tables}


@pytest.mark.parametrize("overrides", [
    {},
    {"speculator": {"target_layer_ids": [1, 3, 6], "epochs": 2}, "evaluate": False},
    {"data": {"regenerate": True, "max_samples": 5}, "evaluate": {"prompts": 2, "ngram": False}},
    {"runtime": "vllm", "resources": {"verifier": {"tensor_parallel_size": 2},
                                      "trainer_gpus": 2}},
])
def test_the_dry_run_is_the_plan_of_the_job_it_would_create(api: Api, job_body, stack: Stack,
                                                            overrides: dict[str, Any]) -> None:
    before = row_counts(stack)
    dry = api.post(PLAN, json=job_body(**overrides))
    assert dry.status_code == 200, dry.text
    plan = dry.json()
    assert plan["job_id"] is None and plan["stages"]
    assert row_counts(stack) == before

    job = api.post("/api/jobs", json=job_body(**overrides))
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    real = api.get(f"/api/jobs/{job_id}/plan").json()
    assert json.loads(json.dumps({**plan, "job_id": job_id}).replace("<job_id>", job_id)) == real
    assert "<job_id>" in json.dumps(plan) and "<job_id>" not in json.dumps(real)


def test_a_dry_run_writes_nothing_and_uses_no_quota(api: Api, job_body, stack: Stack,
                                                   quotas) -> None:  # noqa: F811
    quotas(active_jobs=1)
    upload = api.client.post("/api/datasets", headers=api.headers(), files={"file": (
        "chat.jsonl", b'{"messages": [{"role": "user", "content": "hi"}, '
                      b'{"role": "assistant", "content": "yo"}]}\n')})
    assert upload.status_code == 201, upload.text
    before = row_counts(stack)
    for body in (job_body(), job_body(dataset=upload.json()["id"]), job_body(evaluate=False)):
        assert api.post(PLAN, json=body).status_code == 200
    assert row_counts(stack) == before
    # The project's one active job is still free to create; a dry run beside it still answers.
    assert api.post("/api/jobs", json=job_body()).status_code == 201
    assert api.post(PLAN, json=job_body()).status_code == 200
    assert api.post("/api/jobs", json=job_body()).status_code == 429


@pytest.mark.parametrize("overrides, code, param", [
    ({"verifier": "no-such-model"}, "invalid_verifier", "verifier"),
    ({"dataset": "missing.jsonl"}, "dataset_not_found", "dataset"),
    ({"dataset": "ds_0123456789abcdef01234567"}, "dataset_not_found", "dataset"),
    ({"speculator": {"target_layer_ids": [5, 3]}}, "invalid_layer_ids",
     "speculator.target_layer_ids"),
    ({"speculator": {"target_layer_ids": [1, 8]}}, "invalid_layer_ids",
     "speculator.target_layer_ids"),
    ({"gate": {"min_speedup": 1.2}, "evaluate": False}, "invalid_value", "gate.min_speedup"),
    ({"data": {"regenerate": True, "temperature": 0.7}}, "invalid_value", "data.temperature"),
    ({"speculator": {"block_size": "16"}}, "invalid_value", "speculator.block_size"),
    ({"resources": {"gpus": 2}}, "unknown_field", "resources.gpus"),
])
def test_bad_bodies_get_the_errors_of_job_creation(api: Api, job_body, stack: Stack,
                                                   overrides: dict[str, Any], code: str,
                                                   param: str) -> None:
    before = row_counts(stack)
    assert_error(api.post(PLAN, json=job_body(**overrides)), 422, code, param)
    assert_error(api.post("/api/jobs", json=job_body(**overrides)), 422, code, param)
    assert row_counts(stack) == before


def test_another_projects_dataset_and_a_missing_key(api: Api, make_api, job_body,
                                                    stack: Stack) -> None:
    other = make_api(api)
    theirs = other.client.post("/api/datasets", headers=other.headers(), files={"file": (
        "chat.jsonl", b'{"messages": [{"role": "user", "content": "a"}, '
                      b'{"role": "assistant", "content": "b"}]}\n')}).json()["id"]
    assert_error(api.post(PLAN, json=job_body(dataset=theirs)), 422, "dataset_not_found",
                 "dataset")
    before = row_counts(stack)
    assert_error(api.client.post(PLAN, json=job_body()), 401, "missing_api_key")
    assert row_counts(stack) == before
