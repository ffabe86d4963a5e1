"""The jobs API on both backends (Postgres + Redis, SQLite + kombu's SQLAlchemy transport):
validation, idempotency, project isolation, pagination, plan and cancel of a queued job."""

from __future__ import annotations

import json

import os
from pathlib import Path

import pytest

from tests.conftest import Api, Stack
from tests.support.errors import assert_error


def count_jobs(stack: Stack) -> int:
    return stack.scalar("SELECT count(*) FROM jobs")


def test_create_resolves_layer_ids_from_the_verifier_config(api: Api, job_body) -> None:
    response = api.post("/api/jobs", json=job_body())
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "queued"
    # 8 layers: [2, n // 2, n - 3]
    assert job["speculator"]["target_layer_ids"] == [2, 4, 5]
    assert job["speculator"]["block_size"] == 16 and job["speculator"]["num_layers"] == 5
    assert job["speculator"]["max_anchors"] == 3072 and job["speculator"]["total_seq_len"] == 8192
    events = api.events(job["id"])
    assert [e["status"] for e in events if e["kind"] == "status"] == ["queued"]


def test_explicit_layer_ids_are_kept(api: Api, job_body) -> None:
    response = api.post("/api/jobs", json=job_body(speculator={"target_layer_ids": [1, 3, 6]}))
    assert response.status_code == 201, response.text
    assert response.json()["speculator"]["target_layer_ids"] == [1, 3, 6]


def test_idempotent_create(api: Api, job_body, stack: Stack) -> None:
    before = count_jobs(stack)
    headers = {"Idempotency-Key": "ci-run-42"}
    first = api.post("/api/jobs", json=job_body(), headers=headers)
    assert first.status_code == 201
    replay = api.post("/api/jobs", json=job_body(), headers=headers)
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    assert count_jobs(stack) == before + 1

    mismatch = api.post("/api/jobs", json=job_body(mode="offline"), headers=headers)
    assert_error(mismatch, 422, "idempotency_key_reused", "Idempotency-Key")
    assert count_jobs(stack) == before + 1

    # The key is scoped to the project: another project may use the same key.
    without = api.post("/api/jobs", json=job_body())
    assert without.json()["id"] != first.json()["id"]


def test_another_projects_job_is_404_on_every_route(api: Api, make_api, job_body) -> None:
    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    other = make_api(api)
    routes = [("post", f"/api/jobs/{job_id}/cancel"), ("get", f"/api/jobs/{job_id}"),
              ("get", f"/api/jobs/{job_id}/events"), ("get", f"/api/jobs/{job_id}/events/stream"),
              ("get", f"/api/jobs/{job_id}/metrics"), ("get", f"/api/jobs/{job_id}/checkpoints"),
              ("get", f"/api/jobs/{job_id}/plan")]
    for method, path in routes:
        assert_error(getattr(other, method)(path), 404, "not_found")
    assert job_id not in [j["id"] for j in other.get("/api/jobs").json()["data"]]
    assert api.job(job_id)["status"] == "queued"  # the other project's cancel did nothing
    for method, path in routes:  # the owner reaches every route (cancel first: streams end)
        assert getattr(api, method)(path).status_code == 200, path


def test_list_is_newest_first_with_cursor_and_status_filter(api: Api, job_body) -> None:
    ids = [api.post("/api/jobs", json=job_body()).json()["id"] for _ in range(5)]
    api.post(f"/api/jobs/{ids[0]}/cancel")
    page = api.get("/api/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = api.get("/api/jobs", params={"limit": 10, "after": page["last_id"]}).json()
    assert [j["id"] for j in rest["data"]] == ids[::-1][2:] and not rest["has_more"]
    cancelled = api.get("/api/jobs", params={"status": "cancelled"}).json()["data"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    assert_error(api.get("/api/jobs", params={"status": "bogus"}), 422, "invalid_value", "status")
    assert_error(api.get("/api/jobs", params={"limit": 0}), 422, "invalid_value", "limit")


def test_cancel_queued_job_is_immediate_and_idempotent(api: Api, job_body) -> None:
    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    assert api.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert api.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    statuses = [e["status"] for e in api.events(job_id) if e["kind"] == "status"]
    assert statuses == ["queued", "cancelled"]


def test_plan_uses_the_same_builder_as_the_worker(api: Api, job_body, stack: Stack) -> None:
    from app.runtimes import JobPaths, build_plan
    from app.schemas.job_spec import JobSpec
    from app.settings import get_settings

    job = api.post("/api/jobs", json=job_body()).json()
    plan = api.get(f"/api/jobs/{job['id']}/plan").json()
    assert plan["layer_ids"] == {"verifier_server": [2, 4, 5, 8], "trainer": [2, 4, 5]}
    spec = JobSpec.load(stack_spec(stack, job["id"]))
    expected = build_plan(spec, JobPaths.for_job(get_settings(), job["id"]))
    assert [s["argv"] for s in plan["stages"]] == [s.argv for s in expected.stages]


def stack_spec(stack: Stack, job_id: str) -> dict:
    from app.db import session_scope
    from app.db.models import Job

    with session_scope() as session:
        return session.get(Job, job_id).spec


# (g) Bad input answers 4xx in the error shape and writes nothing.

@pytest.mark.parametrize("overrides, code, param", [
    ({"bogus": 1}, "unknown_field", "bogus"),
    ({"speculator": {"unknown": True}}, "unknown_field", "speculator.unknown"),
    ({"speculator": {"target_layer_ids": [4, 2, 5]}}, "invalid_layer_ids", "speculator.target_layer_ids"),
    ({"speculator": {"target_layer_ids": [2, 2, 5]}}, "invalid_layer_ids", "speculator.target_layer_ids"),
    ({"speculator": {"target_layer_ids": [0, 2, 5]}}, "invalid_layer_ids", "speculator.target_layer_ids"),
    ({"speculator": {"target_layer_ids": [2, 4, 8]}}, "invalid_layer_ids", "speculator.target_layer_ids"),
    ({"speculator": {"epochs": 0}}, "invalid_value", "speculator.epochs"),
    ({"speculator": {"epochs": -3}}, "invalid_value", "speculator.epochs"),
    ({"speculator": {"type": "medusa"}}, "invalid_value", "speculator.type"),
    ({"mode": "sideways"}, "invalid_value", "mode"),
    ({"verifier": "../models/tiny"}, "invalid_path", "verifier"),
    ({"verifier": "tiny/../../etc"}, "invalid_path", "verifier"),
    ({"verifier": "/etc"}, "path_outside_root", "verifier"),
    ({"verifier": "not a model id"}, "invalid_verifier", "verifier"),
    ({"dataset": "../../etc/passwd"}, "invalid_path", "dataset"),
    ({"dataset": "/etc/passwd"}, "path_outside_root", "dataset"),
    ({"dataset": "missing.jsonl"}, "dataset_not_found", "dataset"),
    ({"publish": "no slash"}, "invalid_value", "publish"),
    ({"resources": {"trainer_gpus": 0}}, "invalid_value", "resources.trainer_gpus"),
    ({"resources": {"trainer_gpus": 2, "share_verifier_gpus": True}}, "invalid_value", "resources"),
    ({"evaluate": {"prompts": 0}}, "invalid_value", "evaluate.prompts"),
    ({"evaluate": {"prompts": 513}}, "invalid_value", "evaluate.prompts"),
    ({"evaluate": {"max_tokens": 0}}, "invalid_value", "evaluate.max_tokens"),
    ({"evaluate": {"max_tokens": 8193}}, "invalid_value", "evaluate.max_tokens"),
    ({"evaluate": {"temperature": 1}}, "unknown_field", "evaluate.temperature"),
    ({"evaluate": "yes"}, "invalid_value", "evaluate"),
    ({"evaluate": None}, "invalid_value", "evaluate"),
    ({"evaluate": {"baseline": 1}}, "invalid_value", "evaluate.baseline"),
    ({"evaluate": {"checkpoints": "last:0"}}, "invalid_value", "evaluate.checkpoints"),
    ({"evaluate": {"checkpoints": "worst"}}, "invalid_value", "evaluate.checkpoints"),
    ({"data": {"max_samples": 0}}, "invalid_value", "data.max_samples"),
    ({"data": {"temperature": 3}}, "invalid_value", "data.temperature"),
    ({"data": {"regenerate": True, "temperature": 0.7}}, "invalid_value", "data.temperature"),
    ({"data": {"bogus": 1}}, "unknown_field", "data.bogus"),
    ({"gate": {"min_acceptance_length": 0.5}}, "invalid_value", "gate.min_acceptance_length"),
    ({"gate": {"min_speedup": 0}}, "invalid_value", "gate.min_speedup"),
    ({"gate": "strict"}, "invalid_value", "gate"),
    ({"gate": {"min_acceptance_length": 2}, "evaluate": False}, "invalid_value",
     "gate.min_acceptance_length"),
    ({"gate": {"min_speedup": 1.2}, "evaluate": {"baseline": False}}, "invalid_value",
     "gate.min_speedup"),
    ({"gate": {"beat_ngram": True}, "evaluate": {"ngram": False}}, "invalid_value",
     "gate.beat_ngram"),
])
def test_bad_input_is_rejected_and_writes_nothing(api: Api, job_body, stack: Stack,
                                                   overrides, code, param) -> None:
    before = count_jobs(stack)
    assert_error(api.post("/api/jobs", json=job_body(**overrides)), 422, code, param)
    assert count_jobs(stack) == before


def test_evaluation_settings_default_skip_and_explain_errors(api: Api, job_body, stack: Stack) -> None:
    defaults = {"prompts": 8, "max_tokens": 64, "baseline": True, "ngram": True,
                "checkpoints": "best"}
    default = api.post("/api/jobs", json=job_body()).json()
    assert default["evaluate"] == defaults
    stages = [s for s in api.get(f"/api/jobs/{default['id']}/plan").json()["stages"]]
    assert [s["stage"] for s in stages][-3:] == ["evaluating"] * 3
    assert [s["description"].rsplit(", ", 1)[1] for s in stages[-3:]] == [
        "evaluating the trained drafter", "the n-gram (prompt lookup) baseline",
        "the no-speculation baseline"]
    assert default["served_acceptance_length"] is None and default["evaluation"] is None
    custom = api.post("/api/jobs", json=job_body(evaluate={"prompts": 32})).json()
    assert custom["evaluate"] == {**defaults, "prompts": 32}
    assert stack_spec(stack, custom["id"])["evaluate"] == {**defaults, "prompts": 32}
    assert api.post("/api/jobs", json=job_body(evaluate=True)).json()["evaluate"] == defaults
    skipped = api.post("/api/jobs", json=job_body(evaluate=False)).json()
    assert skipped["evaluate"] is False
    assert stack_spec(stack, skipped["id"])["evaluate"] is False
    plan = api.get(f"/api/jobs/{skipped['id']}/plan").json()
    assert "evaluating" not in [s["stage"] for s in plan["stages"]]
    error = assert_error(api.post("/api/jobs", json=job_body(evaluate={"max_tokens": 10**6})),
                         422, "invalid_value", "evaluate.max_tokens")
    assert "less than or equal to 8192" in error["message"]
    error = assert_error(api.post("/api/jobs", json=job_body(evaluate=8)), 422, "invalid_value",
                         "evaluate")
    assert "false to skip the evaluation" in error["message"]


def test_verifier_symlink_out_of_the_models_root_is_rejected(api: Api, job_body, stack: Stack,
                                                              tmp_path: Path) -> None:
    outside = tmp_path / "outside-model"
    outside.mkdir()
    (outside / "config.json").write_text('{"num_hidden_layers": 8, "hidden_size": 8, "vocab_size": 8}')
    link = stack.models_root / f"link-{tmp_path.name}"
    os.symlink(outside, link)
    before = count_jobs(stack)
    assert_error(api.post("/api/jobs", json=job_body(verifier=link.name)), 422,
                 "path_outside_root", "verifier")
    assert_error(api.post("/api/jobs", json=job_body(verifier=str(outside))), 422,
                 "path_outside_root", "verifier")
    assert count_jobs(stack) == before


def test_verifier_too_shallow_for_default_layer_ids(api: Api, job_body, stack: Stack) -> None:
    from tests.conftest import write_verifier

    shallow = write_verifier(stack.models_root, "shallow", layers=4)
    assert_error(api.post("/api/jobs", json=job_body(verifier=shallow)), 422, "invalid_layer_ids",
                 "speculator.target_layer_ids")


def test_body_over_the_size_limit_is_413(api: Api, job_body, stack: Stack) -> None:
    before = count_jobs(stack)
    body = job_body(metadata={f"k{i}": "x" * 500 for i in range(30)})
    big = api.post("/api/jobs", content=("[" + " " * 1_100_000 + "]").encode(),
                   headers={"Content-Type": "application/json"})
    assert_error(big, 413, "request_too_large")
    # No Content-Length (chunked): refused while the route reads it, in the same shape.
    pieces = [b"[" + b" " * 65_536] + [b" " * 65_536] * 17 + [b"]"]
    chunked = api.post("/api/jobs", content=iter(pieces),
                       headers={"Content-Type": "application/json"})
    assert "content-length" not in chunked.request.headers
    assert_error(chunked, 413, "request_too_large")
    assert api.post("/api/jobs", json=body).status_code == 201  # under the limit still works
    assert count_jobs(stack) == before + 1


def test_invalid_json_is_422(api: Api, stack: Stack) -> None:
    response = api.post("/api/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(response, 422, "invalid_json")


@pytest.mark.parametrize("headers, code", [
    ({}, "missing_api_key"),
    ({"Authorization": "Bearer sdk-not-a-real-key"}, "invalid_api_key"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "invalid_api_key"),
])
def test_missing_or_invalid_key_is_401_and_writes_nothing(api: Api, job_body, stack: Stack,
                                                           headers, code) -> None:
    before = count_jobs(stack)
    response = api.client.post("/api/jobs", json=job_body(), headers=headers)
    assert_error(response, 401, code)
    assert response.headers["WWW-Authenticate"] == "Bearer"
    for path in ("/api/jobs", "/api/workers"):
        assert_error(api.client.get(path, headers=headers), 401, code)
    assert count_jobs(stack) == before


def test_keys_are_stored_hashed(api: Api, stack: Stack) -> None:
    import hashlib

    stored = stack.scalar("SELECT key_hash FROM api_keys WHERE key_hash = :h",
                          h=hashlib.sha256(api.key.encode()).hexdigest())
    assert stored is not None
    assert stack.scalar("SELECT count(*) FROM api_keys WHERE key_hash = :k OR prefix = :k",
                        k=api.key) == 0


def test_service_endpoints(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}
    api.get("/api/jobs")
    metrics = api.client.get("/metrics").text
    assert 'specdeck_http_requests_total{method="GET",route="/api/jobs",status="200"}' in metrics


def test_unknown_route_uses_the_error_shape(api: Api) -> None:
    assert_error(api.get("/api/nope"), 404, "not_found")


def test_a_201_means_committed(api: Api, job_body, stack: Stack) -> None:
    """The request's commit happens before the response is sent. Over real HTTP, with commits
    made slow, a GET right after the 201 must find the job (a commit that ran after the
    response would still be sleeping, and the GET would answer 404)."""
    import threading
    import time

    import httpx
    import uvicorn
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from app.main import create_app
    from tests.e2e.conftest import free_port

    def slow_commit(session: Session) -> None:
        time.sleep(0.4)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=api.headers(), timeout=60) as client:
            deadline = time.monotonic() + 60
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.started, "the server did not start"
            event.listen(Session, "before_commit", slow_commit)
            try:
                created = client.post("/api/jobs", json=job_body())
                assert created.status_code == 201, created.text
                fetched = client.get(f"/api/jobs/{created.json()['id']}")
            finally:
                event.remove(Session, "before_commit", slow_commit)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert fetched.status_code == 200, fetched.text


def test_data_and_gate_settings_with_their_defaults(api: Api, job_body, stack: Stack) -> None:
    local = api.post("/api/jobs", json=job_body()).json()
    assert local["data"] == {"regenerate": False, "max_samples": None, "max_tokens": 4096,
                             "temperature": 0.0, "concurrency": 16}
    assert local["gate"] is None  # no default gate on the local runtime
    vllm = api.post("/api/jobs", json=job_body(runtime="vllm")).json()
    assert vllm["gate"] == {"min_acceptance_length": None, "min_speedup": 1.0, "beat_ngram": False}
    assert api.post("/api/jobs", json=job_body(runtime="vllm", gate=False)).json()["gate"] is None
    no_baseline = api.post("/api/jobs", json=job_body(runtime="vllm",
                                                      evaluate={"baseline": False})).json()
    assert no_baseline["gate"] is None  # nothing to measure a speedup against
    gated = api.post("/api/jobs", json=job_body(gate={"min_acceptance_length": 3,
                                                      "beat_ngram": True})).json()
    assert gated["gate"] == {"min_acceptance_length": 3.0, "min_speedup": None, "beat_ngram": True}
    assert stack_spec(stack, gated["id"])["gate"] == gated["gate"]
    regenerated = api.post("/api/jobs", json=job_body(
        data={"regenerate": True, "max_samples": 50},
        speculator={"total_seq_len": 512})).json()
    assert regenerated["data"]["max_tokens"] == 256  # half the training sequence length
    plan = api.get(f"/api/jobs/{regenerated['id']}/plan").json()["stages"]
    server, client = plan[0], plan[1]
    assert server["stage"] == client["stage"] == "regenerating_data"
    assert "--speculative-config" not in server["argv"]  # the verifier alone generates
    assert client["argv"][client["argv"].index("--limit") + 1] == "50"
    assert client["argv"][client["argv"].index("--max-tokens") + 1] == "256"
    assert json.loads(client["argv"][client["argv"].index("--sampling-params") + 1]) == {
        "temperature": 0.0}


def test_jobs_reference_datasets_by_id(api: Api, job_body, stack: Stack, make_api) -> None:
    upload = api.post("/api/datasets", files={"file": ("chat.jsonl", (stack.data_root / "chat.jsonl").read_bytes())})
    assert upload.status_code == 201, upload.text
    dataset_id = upload.json()["id"]
    job = api.post("/api/jobs", json=job_body(dataset=dataset_id))
    assert job.status_code == 201, job.text
    assert job.json()["dataset"] == dataset_id
    plan = api.get(f"/api/jobs/{job.json()['id']}/plan").json()
    prep = next(s for s in plan["stages"] if s["stage"] == "preparing_data")["argv"]
    # An OpenAI `messages` file reaches prepare-data as a `conversations` copy.
    assert prep[prep.index("--data") + 1].endswith(f"{job.json()['id']}/conversations.jsonl")
    assert_error(api.delete(f"/api/datasets/{dataset_id}"), 409, "dataset_in_use")
    # Another project cannot train on it.
    before = count_jobs(stack)
    assert_error(make_api(api).post("/api/jobs", json=job_body(dataset=dataset_id)), 422,
                 "dataset_not_found", "dataset")
    public = api.post("/api/datasets", json={"public": "ultrachat"}).json()["id"]
    # A public preset holds other models' replies: it is trained on after the verifier
    # regenerates them, never as it is.
    assert_error(api.post("/api/jobs", json=job_body(dataset=public, data={"regenerate": False})),
                 422, "invalid_value", "data.regenerate")
    assert count_jobs(stack) == before
    preset_job = api.post("/api/jobs", json=job_body(dataset=public))
    assert preset_job.status_code == 201, preset_job.text
    assert preset_job.json()["data"]["regenerate"] is True
    plan = api.get(f"/api/jobs/{preset_job.json()['id']}/plan").json()
    assert [s["stage"] for s in plan["stages"]][:2] == ["regenerating_data", "regenerating_data"]
    regenerate = plan["stages"][1]["argv"]
    assert regenerate[regenerate.index("--dataset") + 1] == "ultrachat"
    assert "--resume" in regenerate
    prep = next(s for s in plan["stages"] if s["stage"] == "preparing_data")["argv"]
    assert prep[prep.index("--data") + 1].endswith(f"{preset_job.json()['id']}/regenerated.jsonl")


def add_metrics(job_id: str, *rows: tuple[int | None, int | None, str]) -> None:
    """Metric rows as the worker writes them: (step, epoch, name), in this order of ids."""
    from app.db import session_scope
    from app.db.models import JobMetric

    with session_scope() as session:
        for step, epoch, name in rows:
            session.add(JobMetric(job_id=job_id, step=step, epoch=epoch, name=name, value=1.0))
            session.flush()  # ids in the order given


def test_progress_is_the_latest_training_step_with_a_1_based_epoch(api: Api, job_body,
                                                                    stack: Stack) -> None:
    from sqlalchemy import event

    from app.db import get_engine

    training, fresh = (api.post("/api/jobs", json=job_body(speculator={"epochs": 3})).json()
                       for _ in range(2))
    assert training["progress"] is None and fresh["progress"] is None
    # Data regeneration (a step, no epoch) and validation (an epoch, no step) are no training.
    add_metrics(training["id"], (40, None, "data/regenerated_conversations"),
                (None, 0, "val/loss_epoch"))
    assert api.job(training["id"])["progress"] is None
    # The trainer's first epoch is its epoch 0; the latest row counts (by id), not the highest
    # step: a resumed trainer goes back to its checkpoint's step.
    add_metrics(training["id"], (10, 0, "train/loss"), (10, 0, "lr/AdamW"), (25, 1, "train/loss"),
                (None, 1, "val/loss_epoch"), (20, 1, "train/loss"))
    # The steps of an epoch are not known yet: no total, percent or time left.
    expected = {"epoch": 2, "epochs": 3, "step": 20, "steps_done": 21, "total_steps": None,
                "percent": None, "eta_seconds": None}
    assert api.job(training["id"])["progress"] == expected

    statements: list[str] = []

    def record(_conn, _cursor, statement, *_args) -> None:  # noqa: ANN001
        statements.append(statement)

    event.listen(get_engine(), "before_cursor_execute", record)
    try:
        page = api.get("/api/jobs").json()["data"]
    finally:
        event.remove(get_engine(), "before_cursor_execute", record)
    assert {j["id"]: j["progress"] for j in page} == {training["id"]: expected, fresh["id"]: None}
    assert len([s for s in statements if "job_metrics" in s]) == 1  # one query for the page

    cancelled = api.post(f"/api/jobs/{training['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["progress"] == expected


def test_progress_has_a_total_a_percent_and_the_time_left_once_an_epoch_is_trained(
        api: Api, job_body) -> None:
    from datetime import timedelta

    from app.db import session_scope
    from app.db.models import Job, JobMetric, utcnow

    job_id = api.post("/api/jobs", json=job_body(speculator={"epochs": 2})).json()["id"]
    start = utcnow()
    with session_scope() as session:
        # Epoch 0 was steps 0-9 (10 steps, the worker records it when the epoch completes),
        # trained at one step a second; the latest line is step 14 of epoch 1.
        session.get(Job, job_id).steps_per_epoch = 10
        for step in (0, 9, 14):
            session.add(JobMetric(job_id=job_id, step=step, epoch=step // 10, name="train/loss",
                                  value=1.0, created_at=start + timedelta(seconds=step)))
            session.flush()
    progress = api.job(job_id)["progress"]
    # 15 of 20 steps done; 14 steps took 14 s, so the 5 left take about 5 s.
    assert progress == {"epoch": 2, "epochs": 2, "step": 14, "steps_done": 15,
                        "total_steps": 20, "percent": 75.0, "eta_seconds": 5.0}
    with session_scope() as session:
        session.add(JobMetric(job_id=job_id, step=19, epoch=1, name="train/loss", value=1.0,
                              created_at=start + timedelta(seconds=19)))
    assert api.job(job_id)["progress"] == {**progress, "step": 19, "steps_done": 20,
                                          "percent": 100.0, "eta_seconds": 0.0}


def test_a_named_job_is_shown_and_found_by_its_name(api: Api, job_body) -> None:
    named = api.post("/api/jobs", json=job_body(name="Qwen chat v2 (50%_off)")).json()
    other = api.post("/api/jobs", json=job_body(name="baseline")).json()
    unnamed = api.post("/api/jobs", json=job_body()).json()
    assert named["name"] == "Qwen chat v2 (50%_off)" and unnamed["name"] is None
    assert api.job(named["id"])["name"] == named["name"]

    def found(text: str) -> list[str]:
        return [j["id"] for j in api.get("/api/jobs", params={"name": text}).json()["data"]]

    assert found("chat V2") == [named["id"]]  # any part, any case
    assert found("50%_") == [named["id"]] and found("%") == [named["id"]]  # no wildcards
    assert found("line") == [other["id"]] and found("nothing like it") == []
    assert len(found("")) == 3  # an empty filter is none
    for bad in ("", "   ", "x" * 101, 7):
        assert_error(api.post("/api/jobs", json=job_body(name=bad)), 422, "invalid_value", "name")
