"""POST /api/verifiers/inspect: a verifier read exactly as job creation reads it (a directory
under the models root, or a Hub id through the Hub's HTTP API), with the same 422 and 503
answers, and nothing created. Local verifiers on both backends; the Hub is ``HubDouble`` (a
TEST DOUBLE at the HTTP level: the real Hub cannot be reached from here)."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.conftest import Api, Stack, write_verifier
from tests.integration.test_hub_lookups import _use_hub, hub  # noqa: F401 (a fixture)
from tests.integration.test_jobs_api import count_jobs
from tests.support.errors import assert_error
from tests.support.hub_double import HubDouble

INSPECT = "/api/verifiers/inspect"


def inspect(api: Api, verifier: object) -> object:
    return api.post(INSPECT, json={"verifier": verifier})


def write_config(stack: Stack, config: bytes) -> str:
    """A model directory of its own (the roots are shared by the session) with this config.json."""
    name = f"model-{uuid.uuid4().hex[:8]}"
    (stack.models_root / name).mkdir()
    (stack.models_root / name / "config.json").write_bytes(config)
    return name


@pytest.mark.parametrize("layers, defaults", [(8, [2, 4, 5]), (36, [2, 18, 33]), (4, None)])
def test_a_local_verifier_answers_what_a_job_would_get(api: Api, job_body, stack: Stack,
                                                       layers: int, defaults) -> None:
    name = write_verifier(stack.models_root, f"v{layers}", layers=layers)
    response = inspect(api, name)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "object": "specdeck.verifier", "verifier": name, "source": "local",
        "num_hidden_layers": layers, "hidden_size": 64, "vocab_size": 512, "dtype": "float32",
        "default_target_layer_ids": defaults}
    assert count_jobs(stack) == 0
    job = api.post("/api/jobs", json=job_body(verifier=name))
    if defaults is None:  # too shallow: a job must name its layer ids
        assert_error(job, 422, "invalid_layer_ids", "speculator.target_layer_ids")
    else:
        assert job.json()["speculator"]["target_layer_ids"] == defaults


def test_the_language_model_of_a_multimodal_verifier_is_read(api: Api, stack: Stack) -> None:
    name = write_config(stack, json.dumps({
        "model_type": "qwen2_5_vl", "torch_dtype": "bfloat16", "text_config": {
            "num_hidden_layers": 28, "hidden_size": 2048, "vocab_size": 151936}}).encode())
    body = inspect(api, name).json()
    assert (body["num_hidden_layers"], body["hidden_size"], body["dtype"]) == (28, 2048, "bfloat16")
    assert body["default_target_layer_ids"] == [2, 14, 25]


@pytest.mark.parametrize("config, code", [
    (b"{not json", "invalid_verifier_config"),
    (b"[1, 2]", "invalid_verifier_config"),
    (json.dumps({"num_hidden_layers": 8, "hidden_size": 64}).encode(), "invalid_verifier_config"),
    (json.dumps({"num_hidden_layers": "eight", "hidden_size": 64,
                 "vocab_size": 512}).encode(), "invalid_verifier_config"),
    (b'{"num_hidden_layers": 1e999, "hidden_size": 64, "vocab_size": 512}',
     "invalid_verifier_config"),
    (json.dumps({"num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 512,
                 "torch_dtype": 16}).encode(), "invalid_verifier_config"),
])
def test_a_broken_config_is_a_422_as_for_a_job(api: Api, job_body, stack: Stack, config: bytes,
                                               code: str) -> None:
    name = write_config(stack, config)
    assert_error(inspect(api, name), 422, code, "verifier")
    assert_error(api.post("/api/jobs", json=job_body(verifier=name)), 422, code, "verifier")
    assert count_jobs(stack) == 0


@pytest.mark.parametrize("verifier, code, param", [
    ("no-such-model", "invalid_verifier", "verifier"),
    ("./no-such-model", "verifier_not_found", "verifier"),
    ("../outside", "invalid_path", "verifier"),
    ("/etc", "path_outside_root", "verifier"),
    ("x" * 300, "invalid_verifier", "verifier"),
    ("", "invalid_value", "verifier"),
    ("a\u0000b", "invalid_value", "verifier"),
    (8, "invalid_value", "verifier"),
])
def test_bad_references_are_the_same_client_errors_as_for_a_job(
        api: Api, job_body, stack: Stack, verifier, code: str, param: str) -> None:
    assert_error(inspect(api, verifier), 422, code, param)
    assert_error(api.post("/api/jobs", json=job_body(verifier=verifier)), 422, code, param)
    assert count_jobs(stack) == 0


def test_bad_bodies_and_missing_keys(api: Api, stack: Stack) -> None:
    assert_error(api.post(INSPECT, json={}), 422, "missing_field", "verifier")
    assert_error(api.post(INSPECT, json={"verifier": "tiny", "layers": 3}), 422,
                 "unknown_field", "layers")
    assert_error(api.post(INSPECT, content=b"{", headers={"Content-Type": "application/json"}),
                 422, "invalid_json")
    assert_error(api.client.post(INSPECT, json={"verifier": "tiny"}), 401, "missing_api_key")


def test_a_hub_verifier_is_read_from_the_hub(pg_stack: Stack, hub: HubDouble) -> None:  # noqa: F811
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import new_key

    _use_hub(pg_stack, hub, timeout=60)  # the double answers at once; generous on a busy machine
    with TestClient(create_app()) as client:
        api = Api(client, new_key())
        answer = inspect(api, "acme/verifier")
        assert answer.status_code == 200, answer.text
        assert answer.json()["source"] == "hub"
        assert answer.json()["default_target_layer_ids"] == [2, 4, 5]
        assert_error(inspect(api, "acme/nothing"), 422, "verifier_not_found", "verifier")
        assert_error(inspect(api, "acme/broken"), 422, "invalid_verifier_config", "verifier")


def test_a_hub_that_does_not_answer_is_a_503(pg_stack: Stack, hub: HubDouble) -> None:  # noqa: F811
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import new_key

    _use_hub(pg_stack, hub, timeout=0.5)
    hub.stall_resolve()
    with TestClient(create_app()) as client:
        answer = inspect(Api(client, new_key()), "acme/other")
        error = assert_error(answer, 503, "hub_unavailable", "verifier")
        assert answer.headers["Retry-After"]
        assert "SPECDECK_HUB_TIMEOUT_SECONDS" in error["message"]


def test_a_name_with_no_model_behind_it_is_told_so(api: Api) -> None:
    """A plain name is a directory under the models root that isn't there, not a bad format."""
    error = assert_error(inspect(api, "demo2"), 422, "invalid_verifier", "verifier")
    assert error["message"].startswith("No model 'demo2' under the models root")
    assert "Hugging Face id" in error["message"]


def test_the_verifiers_under_the_models_root_are_listed_by_name(api: Api, stack: Stack,
                                                                tmp_path) -> None:
    """GET /api/verifiers: what the new job form offers. The roots are shared by the session,
    so this test's own models are looked for among the rest."""
    name = write_verifier(stack.models_root, f"listed-{uuid.uuid4().hex[:6]}", layers=8)
    org = f"org-{uuid.uuid4().hex[:6]}"
    nested = write_verifier(stack.models_root / org, "chat", layers=12)
    broken = write_config(stack, b"not json")
    outside = tmp_path / "outside"
    write_verifier(outside, "escaped", layers=8)
    (stack.models_root / f"link-{org}").symlink_to(outside / "escaped")
    response = api.get("/api/verifiers")
    assert response.status_code == 200, response.text
    listed = {v["verifier"]: v for v in response.json()["data"]}
    assert listed[name]["num_hidden_layers"] == 8 and listed[name]["source"] == "local"
    assert listed[f"{org}/{nested}"]["default_target_layer_ids"] == [2, 6, 9]
    assert broken not in listed and f"link-{org}" not in listed
    assert api.post(INSPECT, json={"verifier": f"{org}/{nested}"}).json() == \
        listed[f"{org}/{nested}"]
