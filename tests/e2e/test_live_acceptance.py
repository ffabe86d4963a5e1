"""Live acceptance on the CPU, end to end: a real worker serves a deployment with the local
engine, scrapes its /metrics into the deployment's series (GET /api/deployments/{id}/metrics)
while chat requests go through the gateway, each response carrying its own acceptance; and a
drafter swapped for an untrained one raises the acceptance-drop alert (event and signed webhook).

No drafter is trained here (minutes on 2 cores). Real acceptance comes from n-gram drafting
(prompt lookup: the demo verifier repeats itself), the serve path the evaluation's baseline
uses; the alert from an untrained DFlash drafter, made by speculators' own constructor, deployed
as a checkpoint whose evaluation says a trained one's AL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Api, Stack, write_dataset
from tests.support.waiting import wait_for
from tests.support.drafters import write_untrained_drafter
from tests.support.webhook_receiver import Receiver, receiver, webhook_env  # noqa: F401 (fixtures)

# Generous: run on its own, a test also makes the session's demo assets (minutes on 2 cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Scrape every 0.5 s (health checks every 0.3 s); a few requests make enough drafts to judge.
LIVE_ENV = {"SPECDECK_HEALTH_CHECK_SECONDS": "0.3", "SPECDECK_LIVE_METRICS_SECONDS": "0.5",
            "SPECDECK_DRIFT_MIN_DRAFTS": "40", "SPECDECK_DRIFT_WINDOW_SECONDS": "600"}
MAX_TOKENS = 32
EVALUATED_AL = 2.2  # what a trained demo drafter reaches (dflash-facts §4: 2.13 after 1 epoch)


def prompts(count: int) -> list[list[dict[str, str]]]:
    from workers.runtimes.local.demo import demo_prompts

    return demo_prompts(count)


def chat(api: Api, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    response = api.post("/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def stream_chunks(api: Api, model: str, messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    response = api.post("/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.splitlines()
             if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def wait_ready(api: Api, deployment_id: str) -> dict[str, Any]:
    deployment = wait_for(lambda: (d := api.get(f"/api/deployments/{deployment_id}").json())
                          ["status"] in ("ready", "failed") and d, 300, "the deployment")
    assert deployment["status"] == "ready", deployment
    return deployment


def series(api: Api, deployment_id: str, **params: Any) -> dict[str, Any]:
    response = api.get(f"/api/deployments/{deployment_id}/metrics", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def ngram_deployment(api: Api, stack: Stack, name: str) -> str:
    """A deployment row drafting by prompt lookup (the API deploys DFlash drafters only; the
    worker serves any serve spec), placed by the scheduler like any other."""
    from app.db import session_scope
    from app.db.models import Deployment
    from app.services import state
    from app.services.scheduling import schedule
    from app.settings import get_settings

    project_id = api.get("/api/me").json()["project"]["id"]
    verifier = str((stack.models_root / "demo").resolve())
    spec = {"source": {"kind": "path", "drafter": "ngram", "verifier": "demo"},
            "drafter": "ngram", "method": "ngram", "verifier": verifier, "block_size": 5,
            "num_speculative_tokens": 4, "runtime": "local",
            "resources": {"tensor_parallel_size": 1}}
    with session_scope() as session:
        deployment = Deployment(project_id=project_id, name=name, spec=spec)
        state.initialize(session, deployment, "deployment created (test factory)")
        schedule(session, get_settings())
        return deployment.id


def test_the_series_records_live_acceptance_and_responses_carry_their_own(
        pg_api: Api, pg_stack: Stack, demo_assets: tuple[Path, Path]) -> None:
    shutil.copytree(demo_assets[0], pg_stack.models_root / "demo", dirs_exist_ok=True)
    deployment_id = ngram_deployment(pg_api, pg_stack, "demo-ngram")
    pg_stack.start_worker("live-worker", **LIVE_ENV)
    wait_ready(pg_api, deployment_id)
    assert series(pg_api, deployment_id)["data"] == []  # nothing served, nothing recorded

    per_request = []
    for messages in prompts(4):
        reply = chat(pg_api, "demo-ngram", messages)
        acceptance = reply["metrics"]["speculative_decoding"]  # vLLM's per-request field
        assert acceptance["num_spec_tokens"] == 4
        assert acceptance["num_spec_steps"] == sum(acceptance["acceptance_histogram"])
        assert acceptance["mean_acceptance_length"] == pytest.approx(
            1 + acceptance["num_accepted_draft_tokens"] / acceptance["num_spec_steps"])
        per_request.append(acceptance)
    chunks = stream_chunks(pg_api, "demo-ngram", prompts(1)[0])
    assert [i for i, c in enumerate(chunks) if c.get("metrics")] == [len(chunks) - 1]  # last
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    per_request.append(chunks[-1]["metrics"]["speculative_decoding"])
    drafts = sum(a["num_spec_steps"] for a in per_request)
    accepted = sum(a["num_accepted_draft_tokens"] for a in per_request)
    assert accepted > 0, per_request

    # The worker's scrapes add up to what the responses report, request for request: waited
    # for as a whole (requests, drafts, accepted tokens), not on the request count alone, so
    # that the test does not depend on every count reaching the series in the same scrape.
    def scraped() -> dict[str, Any] | None:
        b = series(pg_api, deployment_id)
        points = b["data"]
        done = (b["window"]["requests"] == 5
                and sum(p["num_drafts"] for p in points) == drafts
                and sum(p["num_accepted_tokens"] for p in points) == accepted)
        return b if done else None

    body = wait_for(scraped, 120, "the scrapes of the five requests and their drafts")
    points = body["data"]
    drafted = [p for p in points if p["num_drafts"]]
    assert drafted and all(p["acceptance_length"] > 1 or p["num_accepted_tokens"] == 0
                           for p in drafted)
    assert any(p["acceptance_length"] > 1 for p in drafted)
    for p in drafted:
        assert len(p["per_position_acceptance"]) == 4
        assert p["per_position_acceptance"] == sorted(p["per_position_acceptance"], reverse=True)
        assert p["acceptance_length"] == pytest.approx(1 + sum(p["per_position_acceptance"]))
        assert p["tokens_per_second"] > 0 and p["drafter"] == "ngram"
    window = body["window"]
    assert window["acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert window["num_drafts"] == drafts and window["drafter"] == "ngram"
    assert window["evaluated_acceptance_length"] is None and window["alert_below"] is None

    # Paging: one point a page, oldest first, the cursor and `since`.
    first = series(pg_api, deployment_id, limit=1)
    assert [p["id"] for p in first["data"]] == [points[0]["id"]] and first["has_more"] is (len(points) > 1)
    rest = series(pg_api, deployment_id, after=first["last_id"], limit=1000)
    assert [p["id"] for p in rest["data"]] == [p["id"] for p in points[1:]]
    later = series(pg_api, deployment_id, since=points[-1]["created_at"])
    assert [p["id"] for p in later["data"]] == [points[-1]["id"]]
    # A Hub or path drafter has no evaluation: no alert, whatever the acceptance.
    assert pg_stack.scalar("SELECT count(*) FROM deployment_events WHERE deployment_id = :id "
                           "AND kind = 'acceptance_dropped'", id=deployment_id) == 0


def test_an_untrained_drafter_raises_the_acceptance_drop_alert_once(
        pg_api: Api, pg_stack: Stack, demo_assets: tuple[Path, Path], webhook_env,
        receiver: Receiver) -> None:
    from app.db import session_scope
    from app.db.models import Checkpoint

    shutil.copytree(demo_assets[0], pg_stack.models_root / "demo", dirs_exist_ok=True)
    job = pg_api.post("/api/jobs", json={"verifier": "demo", "runtime": "local",
                                         "dataset": write_dataset(pg_stack.data_root)}).json()
    assert pg_api.post(f"/api/jobs/{job['id']}/cancel").status_code == 200  # no worker yet
    # Its checkpoint: evaluated at a trained drafter's AL, but the weights are untrained.
    path = Path(pg_stack.env["SPECDECK_WORK_ROOT"]) / job["id"] / "checkpoints" / "0"
    write_untrained_drafter(demo_assets[0], path)
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job["id"], epoch=0, path=str(path), is_best=True,
                                evaluation={"mean_acceptance_length": EVALUATED_AL})
        session.add(checkpoint)
        session.flush()
        checkpoint_id = checkpoint.id
    hook = pg_api.post("/api/webhooks", json={"url": receiver.url,
                                              "events": ["deployment.acceptance_dropped"]})
    assert hook.status_code == 201, hook.text

    pg_stack.start_worker("drift-worker", **LIVE_ENV)
    created = pg_api.post("/api/deployments", json={"name": "swapped", "checkpoint_id": checkpoint_id})
    assert created.status_code == 201, created.text
    deployment_id = created.json()["id"]
    wait_ready(pg_api, deployment_id)
    for messages in prompts(4):
        reply = chat(pg_api, "swapped", messages)
        assert reply["metrics"]["speculative_decoding"]["num_spec_tokens"] == 3

    [request] = receiver.wait("deployment.acceptance_dropped", timeout=120)
    payload = request.verify(hook.json()["secret"])
    assert payload["data"]["id"] == deployment_id
    numbers = payload["data"]["acceptance"]
    assert numbers["evaluated_acceptance_length"] == EVALUATED_AL
    assert numbers["acceptance_length"] < 0.8 * EVALUATED_AL == pytest.approx(numbers["threshold"])
    assert numbers["num_drafts"] >= 40 and numbers["checkpoint_id"] == checkpoint_id

    # More traffic at the same low acceptance: still one alert in this episode.
    for messages in prompts(6)[4:]:
        chat(pg_api, "swapped", messages)
    wait_for(lambda: series(pg_api, deployment_id)["window"]["requests"] == 6, 120, "the scrapes")
    events = [e for e in pg_api.get(f"/api/deployments/{deployment_id}/events").json()["data"]
              if e["kind"] in ("acceptance_dropped", "acceptance_recovered")]
    assert [e["kind"] for e in events] == ["acceptance_dropped"]
    assert events[0]["data"]["acceptance_length"] == numbers["acceptance_length"]
    window = series(pg_api, deployment_id)["window"]
    assert window["evaluated_acceptance_length"] == EVALUATED_AL
    assert window["acceptance_length"] < window["alert_below"] == pytest.approx(0.8 * EVALUATED_AL)
    assert len(receiver.received) == 1
