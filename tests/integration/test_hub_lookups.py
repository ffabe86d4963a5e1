"""Issue 9, point 8: a verifier or drafter named by its Hub id is read from the Hub with no
database connection held, no threadpool thread waiting, and a short, configurable timeout, so a
Hub that hangs never makes other requests wait.

The Hub is ``HubDouble`` (a TEST DOUBLE at the HTTP level: the real Hub cannot be reached from
here), which can hold every file download until the test releases it."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import Api, Stack, new_key, write_dataset
from tests.support.waiting import wait_for
from tests.support.api_server import start_api, stop_api
from tests.support.hub_double import HubDouble

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 8,
          "hidden_size": 64, "vocab_size": 512, "torch_dtype": "float32"}
DRAFTER = {"speculators_model_type": "dflash", "block_size": 8}
# More concurrent creates than the API has threadpool threads (40) and pooled connections (30).
CONCURRENT = 50


@pytest.fixture
def hub() -> Iterator[HubDouble]:
    with HubDouble(token=f"hf_{uuid.uuid4().hex}") as double:
        double.seed("acme/verifier", {"config.json": json.dumps(CONFIG).encode()})
        double.seed("acme/drafter", {"config.json": json.dumps(DRAFTER).encode()})
        double.seed("acme/broken", {"config.json": b"{not json"})
        yield double
        double.release_resolve()


def _use_hub(stack: Stack, hub: HubDouble, timeout: float) -> None:
    from tests.conftest import configure

    configure({**stack.env, "SPECDECK_HF_ENDPOINT": hub.url,
               "SPECDECK_HUB_TIMEOUT_SECONDS": str(timeout)})


def test_hub_ids_are_read_from_the_hub(pg_stack: Stack, hub: HubDouble) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app

    _use_hub(pg_stack, hub, timeout=60)  # the double answers at once; generous on a busy machine
    dataset = write_dataset(pg_stack.data_root, "hub.jsonl")
    with TestClient(create_app()) as client:
        api = Api(client, new_key())
        created = api.post("/api/jobs", json={"verifier": "acme/verifier", "dataset": dataset,
                                              "runtime": "local"})
        assert created.status_code == 201, created.text
        assert created.json()["speculator"]["target_layer_ids"] == [2, 4, 5]
        deployment = api.post("/api/deployments", json={
            "name": "hub", "drafter": "acme/drafter", "verifier": "acme/verifier",
            "runtime": "local"})
        assert deployment.status_code == 201, deployment.text
        assert deployment.json()["num_speculative_tokens"] == 7

        missing = api.post("/api/jobs", json={"verifier": "acme/nothing", "dataset": dataset})
        assert missing.status_code == 422, missing.text
        assert missing.json()["error"]["code"] == "verifier_not_found"
        broken = api.post("/api/jobs", json={"verifier": "acme/broken", "dataset": dataset})
        assert broken.status_code == 422, broken.text
        assert broken.json()["error"]["code"] == "invalid_verifier_config"


def test_a_hub_that_does_not_answer_times_out_with_503(pg_stack: Stack, hub: HubDouble) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app

    _use_hub(pg_stack, hub, timeout=0.5)
    dataset = write_dataset(pg_stack.data_root, "hub.jsonl")
    hub.stall_resolve()
    with TestClient(create_app()) as client:
        api = Api(client, new_key())
        answer = api.post("/api/jobs", json={"verifier": "acme/other", "dataset": dataset})
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"]
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("hub_unavailable", "verifier")
        assert "SPECDECK_HUB_TIMEOUT_SECONDS" in error["message"]
        assert api.get("/api/jobs").json()["data"] == []


def test_a_hanging_hub_does_not_stall_other_requests(pg_stack: Stack, hub: HubDouble,
                                                      tmp_path: Path) -> None:
    _use_hub(pg_stack, hub, timeout=400)  # the lookups hang for the whole test
    env = {**os.environ, **pg_stack.env, "SPECDECK_HF_ENDPOINT": hub.url,
           "SPECDECK_HUB_TIMEOUT_SECONDS": "400", "SPECDECK_QUOTA_ACTIVE_JOBS": "0",
           "PYTHONPATH": str(Path.cwd())}
    url, proc = start_api(env, tmp_path / "api.log")
    key = new_key()
    headers = {"Authorization": f"Bearer {key}"}
    dataset = write_dataset(pg_stack.data_root, "hub.jsonl")
    hub.stall_resolve()

    def create(i: int) -> httpx.Response:
        return httpx.post(f"{url}/api/jobs", headers=headers, timeout=480, json={
            "verifier": "acme/verifier", "dataset": dataset, "runtime": "local",
            "metadata": {"i": str(i)}})

    try:
        with ThreadPoolExecutor(CONCURRENT) as pool:
            creates = [pool.submit(create, i) for i in range(CONCURRENT)]
            # Every create is waiting on the Hub at once: none holds a thread or a connection.
            wait_for(lambda: hub.resolving == CONCURRENT, 60,
                     f"{CONCURRENT} lookups held by the Hub double")
            for path in ("/healthz", "/readyz", "/api/jobs", "/api/deployments", "/v1/models"):
                answer = httpx.get(url + path, headers=headers, timeout=30)
                assert answer.status_code == 200, (path, answer.text)
            # ... answered while the Hub still held every lookup: nobody waited for it.
            assert hub.resolving == CONCURRENT
            hub.release_resolve()
            statuses = [c.result().status_code for c in creates]
        assert statuses == [201] * CONCURRENT
        listed = httpx.get(f"{url}/api/jobs", headers=headers, params={"limit": 100}, timeout=30)
        assert len(listed.json()["data"]) == CONCURRENT
    finally:
        hub.release_resolve()
        stop_api(proc)
