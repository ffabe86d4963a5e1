"""On-policy data for real on the CPU: the verifier served alone, `speculators
regenerate-responses` against it, prepare-data on its pre-tokenized rows, then training.

- an upload with ``data.regenerate`` trains on the verifier's own greedy ids;
- a public preset goes through the same path, its download stood in for by a local copy under
  the mirror directory (SPECDECK_PUBLIC_DATASETS_MIRROR); a worker killed mid-regeneration is
  resumed where it stopped;
- a cancel during regeneration stops everything.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.conftest import Api, Stack
from tests.e2e.conftest import job_processes
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE, event_seen
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SMALL_EVALUATION = {"prompts": 4, "max_tokens": 32, "baseline": False, "ngram": False,
                    "rounds": 1}


def work_dir(stack: Stack, job_id: str) -> Path:
    return Path(stack.env["SPECDECK_WORK_ROOT"]) / job_id


def regenerated_ids(stack: Stack, job_id: str) -> list[str]:
    path = work_dir(stack, job_id) / "regenerated.jsonl"
    return [json.loads(line)["primary_id"] for line in path.read_text().splitlines() if line]


def greedy_share(model_dir: Path, data_dir: Path) -> tuple[int, int]:
    """How many prepared rows' supervised tokens are exactly the verifier's greedy
    continuation of their prompt, of how many rows."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = load_from_disk(str(data_dir)).with_format(None)
    same = 0
    with torch.inference_mode():
        for ids, mask in zip(rows["input_ids"], rows["loss_mask"], strict=True):
            first = mask.index(1)
            supervised = [t for t, m in zip(ids, mask, strict=True) if m]
            assert supervised == ids[first:first + len(supervised)]  # one reply per row
            out = model.generate(torch.tensor([ids[:first]]), max_new_tokens=len(supervised),
                                 do_sample=False)
            same += out[0, first:].tolist() == supervised
    return same, len(rows)


def test_an_upload_is_regenerated_by_the_verifier_and_trained_on(pg_api: Api, pg_stack: Stack,
                                                                  demo, demo_assets) -> None:
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    created = pg_api.post("/api/jobs", json={
        **demo, "runtime": "local", "speculator": {**CPU_SPECULATOR, "epochs": 1},
        "data": {"regenerate": True, "max_samples": 60, "max_tokens": 96},
        "evaluate": SMALL_EVALUATION})
    assert created.status_code == 201, created.text
    job = pg_api.wait_status(created.json()["id"], {"succeeded", "failed"}, timeout=900)
    assert job["status"] == "succeeded", (job, pg_api.get(f"/api/jobs/{job['id']}/logs").text)

    events = pg_api.events(job["id"])
    stages = [e["stage"] for e in events if e["kind"] == "status" and e["stage"]]
    assert stages == ["regenerating_data", "starting_verifier", "preparing_data", "training",
                      "evaluating"]
    [done] = [e for e in events if e["kind"] == "regenerated"]
    assert done["data"]["done"] == done["data"]["total"] == 60, done
    assert any(e["kind"] == "progress" and "of 60 conversations" in e["message"] for e in events)
    metrics = pg_api.get(f"/api/jobs/{job['id']}/metrics",
                         params={"name": "data/regenerated_conversations"}).json()["data"]
    assert metrics and max(m["value"] for m in metrics) == 60
    # The generating server was the verifier alone, and it was stopped before the
    # hidden-states server took its place.
    [server] = [e for e in events if e["kind"] == "process" and e["message"].startswith("starting")
                and "generating the verifier's own replies" in e["message"]]
    assert "--speculative-config" not in server["data"]["argv"]
    assert len(set(regenerated_ids(pg_stack, job["id"]))) == 60

    # The drafter trained on the verifier's exact token ids.
    same, rows = greedy_share(demo_assets[0], work_dir(pg_stack, job["id"]) / "data")
    assert rows >= 50 and same / rows >= 0.95, (same, rows)

    # The evaluation's held-out prompts are validation rows' own prompt ids.
    [checkpoint] = pg_api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
    assert checkpoint["evaluation"]["prompt_source"] == "validation split"
    assert checkpoint["evaluation"]["prompts"] == 4
    assert job_processes(job["id"]) == []


def test_a_public_preset_is_regenerated_and_resumed_after_a_killed_worker(
        pg_api: Api, pg_stack: Stack, demo_assets, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copy(demo_assets[1], mirror / "sharegpt.jsonl")  # stands in for the Hub download
    shutil.copytree(demo_assets[0], pg_stack.models_root / "demo", dirs_exist_ok=True)
    env = {**REAL_PIPELINE, "SPECDECK_PUBLIC_DATASETS_MIRROR": str(mirror)}
    first = pg_stack.start_worker("doomed", **env)
    preset = pg_api.post("/api/datasets", json={"public": "sharegpt"})
    assert preset.status_code in (200, 201), preset.text
    created = pg_api.post("/api/jobs", json={
        "verifier": "demo", "dataset": preset.json()["id"], "runtime": "local",
        "speculator": {**CPU_SPECULATOR, "epochs": 1}, "data": {"max_samples": 40},
        "evaluate": False})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert created.json()["data"]["regenerate"] is True  # the default for a preset

    def some_done() -> bool:
        path = work_dir(pg_stack, job_id) / "regenerated.jsonl"
        return path.is_file() and len(path.read_text().splitlines()) >= 5
    wait_for(some_done, 300, "the first regenerated conversations")
    first.kill()  # the host dies, and everything it ran
    for pid in job_processes(job_id):
        os.kill(pid, signal.SIGKILL)
    kept = len(set(regenerated_ids(pg_stack, job_id)))
    pg_stack.start_worker("rescuer", **env)
    job = pg_api.wait_status(job_id, {"succeeded", "failed"}, timeout=900)
    assert job["status"] == "succeeded", (job, pg_api.get(f"/api/jobs/{job_id}/logs").text)
    assert job["attempt"] == 2

    started = [e for e in pg_api.events(job_id) if e["kind"] == "regeneration_started"]
    assert started[0]["data"]["source"] == str((mirror / "sharegpt.jsonl").resolve())
    assert started[-1]["data"]["done"] >= kept > 0  # the second attempt went on from there
    assert f"({started[-1]['data']['done']} conversations already done)" in started[-1]["message"]
    ids = regenerated_ids(pg_stack, job_id)
    assert len(set(ids)) == 40 and len(ids) == 40  # every conversation once, none twice
    assert job_processes(job_id) == []


def test_cancel_during_regeneration(pg_api: Api, pg_stack: Stack, small_demo) -> None:
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    created = pg_api.post("/api/jobs", json={
        **small_demo, "runtime": "local", "speculator": {**CPU_SPECULATOR, "epochs": 1},
        "data": {"regenerate": True}, "evaluate": False})
    job_id = created.json()["id"]
    wait_for(lambda: event_seen(pg_api, job_id, "regeneration_started"), 300,
             "the regeneration to start")
    assert job_processes(job_id)
    pg_api.post(f"/api/jobs/{job_id}/cancel")
    # Generous deadlines for a busy machine: how fast a cancel is, is not a pass/fail matter.
    done = pg_api.wait_status(job_id, {"cancelled"}, timeout=120)
    assert done["status"] == "cancelled"
    wait_for(lambda: job_processes(job_id) == [], 120, "processes to go")
