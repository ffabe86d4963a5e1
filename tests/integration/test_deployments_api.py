"""/api/deployments on both backends: validation, sources, isolation, name reuse, deletion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Api, Stack, write_verifier
from tests.support.errors import assert_error


def write_drafter(models_root: Path, name: str = "drafter", block_size: int = 8) -> str:
    path = models_root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "speculators_model_type": "dflash", "block_size": block_size,
        "aux_hidden_state_layer_ids": [2, 4, 5], "draft_vocab_size": 512}))
    return name


@pytest.fixture
def body(stack: Stack):
    verifier, drafter = write_verifier(stack.models_root), write_drafter(stack.models_root)

    def make(**overrides):
        return {"name": "demo-fast", "drafter": drafter, "verifier": verifier, "runtime": "local",
                **overrides}
    return make


def count(stack: Stack) -> int:
    return stack.scalar("SELECT count(*) FROM deployments")


def test_create_from_a_drafter_waits_for_a_worker(api: Api, body, stack: Stack) -> None:
    response = api.post("/api/deployments", json=body())
    assert response.status_code == 201, response.text
    deployment = response.json()
    assert deployment["status"] == "pending"
    assert deployment["num_speculative_tokens"] == 7  # block_size - 1
    assert deployment["status_reason"] == "waiting for a worker to come online"
    assert deployment["drafter"] == str((stack.models_root / "drafter").resolve())
    assert api.get(f"/api/deployments/{deployment['id']}").json()["id"] == deployment["id"]
    assert [d["id"] for d in api.get("/api/deployments").json()["data"]] == [deployment["id"]]


def test_create_from_a_checkpoint_uses_the_jobs_verifier(api: Api, body, job_body, stack: Stack) -> None:
    from app.db import session_scope
    from app.db.models import Checkpoint

    job = api.post("/api/jobs", json=job_body()).json()
    ckpt_dir = Path(stack.env["SPECDECK_WORK_ROOT"]) / job["id"] / "checkpoints" / "0"
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "config.json").write_text(json.dumps({"speculators_model_type": "dflash", "block_size": 16}))
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job["id"], epoch=0, path=str(ckpt_dir), is_best=True)
        session.add(checkpoint)
        session.flush()
        checkpoint_id = checkpoint.id
    response = api.post("/api/deployments", json={"name": "from-job", "checkpoint_id": checkpoint_id})
    assert response.status_code == 201, response.text
    deployment = response.json()
    assert deployment["source"] == {"kind": "checkpoint", "checkpoint_id": checkpoint_id, "job_id": job["id"]}
    assert deployment["drafter"] == str(ckpt_dir)
    assert deployment["verifier"] == str((stack.models_root / "tiny").resolve())
    assert deployment["num_speculative_tokens"] == 15


def test_delete_pending_stops_and_frees_the_name(api: Api, body, stack: Stack) -> None:
    first = api.post("/api/deployments", json=body()).json()
    assert_error(api.post("/api/deployments", json=body()), 409, "deployment_name_in_use", "name")
    deleted = api.delete(f"/api/deployments/{first['id']}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "stopped"
    assert api.post("/api/deployments", json=body()).status_code == 201


def test_another_projects_deployment_is_404(api: Api, body, make_api, stack: Stack) -> None:
    deployment = api.post("/api/deployments", json=body()).json()
    other = make_api(api)
    for method, path in [("get", f"/api/deployments/{deployment['id']}"),
                         ("get", f"/api/deployments/{deployment['id']}/events"),
                         ("delete", f"/api/deployments/{deployment['id']}")]:
        assert_error(getattr(other, method)(path), 404, "not_found")
    assert other.get("/api/deployments").json()["data"] == []
    assert api.get(f"/api/deployments/{deployment['id']}").json()["status"] == "pending"
    # Their checkpoints are not theirs to deploy either.
    assert_error(other.post("/api/deployments", json={"name": "x", "checkpoint_id": "ckpt_" + "0" * 24}),
                 422, "checkpoint_not_found", "checkpoint_id")


def test_events_are_oldest_first_with_a_cursor(api: Api, body, stack: Stack) -> None:
    first = api.post("/api/deployments", json=body()).json()
    second = api.post("/api/deployments", json=body(name="other")).json()
    api.delete(f"/api/deployments/{first['id']}")  # pending: stopped at once
    path = f"/api/deployments/{first['id']}/events"
    events = api.get(path).json()
    assert events["object"] == "list" and not events["has_more"]
    assert [(e["kind"], e["status"]) for e in events["data"]] == [
        ("status", "pending"), ("waiting", "pending"), ("status", "stopped")]
    assert events["data"][0]["message"] == "deployment created"
    assert {e["object"] for e in events["data"]} == {"specdeck.deployment.event"}
    assert {e["stage"] for e in events["data"]} == {None}
    assert events["last_id"] == events["data"][-1]["id"] > events["data"][0]["id"]
    # Only this deployment's events: the other one has its own, written in between.
    theirs = api.get(f"/api/deployments/{second['id']}/events").json()["data"]
    assert [e["status"] for e in theirs] == ["pending", "pending"]
    assert events["data"][0]["id"] < theirs[0]["id"] < events["data"][-1]["id"]

    page = api.get(path, params={"limit": 2}).json()
    assert page["data"] == events["data"][:2] and page["has_more"]
    rest = api.get(path, params={"after": page["last_id"]}).json()
    assert rest["data"] == events["data"][2:] and not rest["has_more"]
    done = api.get(path, params={"after": rest["last_id"]}).json()
    assert done == {"object": "list", "data": [], "has_more": False, "last_id": None}

    assert_error(api.get("/api/deployments/dep_" + "0" * 24 + "/events"), 404, "not_found")
    for params, param in [({"after": -1}, "after"), ({"after": 2**63}, "after"),
                          ({"limit": 0}, "limit"), ({"limit": 101}, "limit")]:
        assert_error(api.get(path, params=params), 422, "invalid_value", param)


@pytest.mark.parametrize("overrides, code, param", [
    ({"verifier": None}, "invalid_value", None),
    ({"drafter": None}, "invalid_value", None),
    ({"checkpoint_id": "ckpt_" + "0" * 24}, "invalid_value", None),
    ({"drafter": "../../etc"}, "invalid_path", "drafter"),
    ({"drafter": "/etc"}, "path_outside_root", "drafter"),
    ({"drafter": "tiny"}, "invalid_drafter", "drafter"),  # a verifier is no DFlash drafter
    ({"verifier": "not a model"}, "invalid_verifier", "verifier"),
    ({"name": "has space"}, "invalid_value", "name"),
    ({"num_speculative_tokens": 0}, "invalid_value", "num_speculative_tokens"),
    ({"resources": {"gpus": 2}}, "unknown_field", "resources.gpus"),
    ({"bogus": 1}, "unknown_field", "bogus"),
])
def test_bad_input_is_rejected_and_writes_nothing(api: Api, body, stack: Stack, overrides, code, param) -> None:
    payload = {k: v for k, v in body(**overrides).items() if v is not None}
    error = assert_error(api.post("/api/deployments", json=payload), 422, code, param)
    assert error["message"]
    assert count(stack) == 0


def test_a_hub_drafter_resolves_through_the_hub_client(api: Api, body, stack: Stack, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-training path: a Hub drafter id, resolved by huggingface_hub from its cache (a
    local directory laid out as a Hub snapshot; offline, as nothing can be downloaded here)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--z-lab--tiny-dflash" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"speculators_model_type": "dflash", "block_size": 16}))
    (cache / "models--z-lab--tiny-dflash" / "refs").mkdir()
    (cache / "models--z-lab--tiny-dflash" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    response = api.post("/api/deployments", json=body(drafter="z-lab/tiny-dflash"))
    assert response.status_code == 201, response.text
    assert response.json()["drafter"] == "z-lab/tiny-dflash"
    assert response.json()["source"]["kind"] == "hub"
    assert response.json()["num_speculative_tokens"] == 15
