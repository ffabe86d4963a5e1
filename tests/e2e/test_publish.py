"""A demo job that publishes its best checkpoint to the Hugging Face Hub, for real through
`huggingface_hub`, against the HubDouble test double (the Hub cannot be reached from here).
The token must never show in argv (/proc/*/cmdline), in a log file or in an API response."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.services.publishing import _fmt
from tests.conftest import Api, Stack
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE
from tests.support.waiting import wait_for
from tests.support.hub_double import HubDouble

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
TOKEN = "hf_e2eSecretTokenValue0123456789abcd"
REPO = "specdeck/demo-dflash"


class CmdlineWatcher(threading.Thread):
    """Scans every process's command line, all the time, for the token."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.hits: list[str] = []
        self.scans = 0
        self.stop = threading.Event()

    def run(self) -> None:
        needle = TOKEN.encode()
        while not self.stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if needle in cmdline.read_bytes():
                        self.hits.append(str(cmdline))
                except OSError:
                    continue
            self.scans += 1
            self.stop.wait(0.02)  # keep scanning often, without starving the test of the GIL


def test_a_job_publishes_to_the_hub_and_the_token_never_leaks(pg_api: Api, pg_stack: Stack, demo) -> None:
    watcher = CmdlineWatcher()
    watcher.start()
    responses: list[str] = []
    with HubDouble(token=TOKEN) as hub:
        pg_stack.start_worker("publisher", **REAL_PIPELINE, SPECDECK_HF_ENDPOINT=hub.url,
                              HF_ENDPOINT=hub.url)
        put = pg_api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=pg_api.headers())
        responses.append(put.text)
        # A short evaluation: what is published is under test here, not the evaluation
        # (tests/unit/test_evaluate.py, test_pipeline.py).
        created = pg_api.post("/api/jobs", json={
            **demo, "runtime": "local", "publish": REPO,
            "speculator": {**CPU_SPECULATOR, "epochs": 1},
            "evaluate": {"prompts": 4, "max_tokens": 32, "baseline": False, "ngram": False}})
        responses.append(created.text)
        job = pg_api.wait_status(created.json()["id"], {"succeeded", "failed"}, timeout=600)
        assert job["status"] == "succeeded", (job, pg_api.get(f"/api/jobs/{job['id']}/logs").text)

        files = hub.files(REPO)
        assert set(files) >= {"config.json", "model.safetensors", "README.md"}
        assert not {f for f in files if "optimizer" in f or "scheduler" in f}
        [best] = [c for c in pg_api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"] if c["is_best"]]
        assert files["model.safetensors"] == (Path(best["path"]) / "model.safetensors").read_bytes()
        card = files["README.md"].decode()
        layer_ids = ", ".join(map(str, job["speculator"]["target_layer_ids"]))
        assert '"method": "dflash"' in card and REPO in card and layer_ids in card
        # the evaluation ran before publishing: its numbers are in the card, not a placeholder
        evaluation = best["evaluation"]
        assert evaluation["mean_acceptance_length"] > 1.0, evaluation
        section = card.split("## Evaluation: served acceptance", 1)[1].split("## Training data", 1)[0]
        assert "Not evaluated yet" not in card
        assert (f"| Served mean acceptance length | {_fmt(evaluation['mean_acceptance_length'])} |"
                in section)
        assert f"| Trainer's eal (an estimate) | {_fmt(evaluation['trainer_eal_estimate'])} |" in section
        assert (f"| Acceptance rate per position | {_fmt(evaluation['acceptance_rate_per_position'])} |"
                in section)
        assert f"| Prompts | {evaluation['prompts']} (validation split)" in section
        assert ("| Runtime | local (vLLM with the DFlash drafter (CPU), evaluating the trained "
                "drafter) |") in section
        assert hub.repo(REPO)["private"] is True
        commits = len(hub.commits(REPO))
        assert best["publish_status"] == "published" and best["hub_commit"]
        events = pg_api.events(job["id"])
        assert any(e["kind"] == "published" for e in events)

        # Publishing again with nothing changed makes no new commit.
        again = pg_api.post(f"/api/checkpoints/{best['id']}/publish", json={"repo_id": REPO})
        assert again.status_code == 202, again.text
        responses.append(again.text)
        done = wait_for(lambda: (c := pg_api.get(f"/api/checkpoints/{best['id']}").json())
                        ["publish_status"] != "publishing" and c, 120, "the second publish")
        responses.append(str(done))
        assert done["publish_status"] == "published", done
        assert done["hub_commit"] == best["hub_commit"]
        assert len(hub.commits(REPO)) == commits

        # Every response, log and request the double saw (but the Authorization header).
        for extra in ("/api/secrets", f"/api/jobs/{job['id']}", f"/api/jobs/{job['id']}/events",
                      f"/api/jobs/{job['id']}/logs", f"/api/checkpoints/{best['id']}"):
            responses.append(pg_api.get(extra).text)
        assert all(TOKEN not in request.transcript() for request in hub.requests)
    watcher.stop.set()
    watcher.join()
    assert watcher.scans > 10 and watcher.hits == []
    assert all(TOKEN not in text for text in responses)
    logs = [p for root in (pg_stack.env["SPECDECK_LOGS_ROOT"], pg_stack.env["SPECDECK_WORK_ROOT"])
            for p in Path(root).rglob("*") if p.is_file() and p.suffix in (".log", ".txt", ".json", ".md")]
    assert logs and all(TOKEN not in p.read_text(errors="replace") for p in logs)
    assert all(TOKEN not in w.log.read_text() for w in pg_stack.workers)


def test_a_missed_acceptance_gate_blocks_publishing(pg_api: Api, pg_stack: Stack, small_demo) -> None:
    """A gate the drafter cannot meet: the job fails with the numbers, nothing reaches the Hub,
    and the checkpoint is kept, so it can still be published by hand."""
    with HubDouble(token=TOKEN) as hub:
        pg_stack.start_worker("gated", **REAL_PIPELINE, SPECDECK_HF_ENDPOINT=hub.url,
                              HF_ENDPOINT=hub.url)
        pg_api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=pg_api.headers())
        created = pg_api.post("/api/jobs", json={
            **small_demo, "runtime": "local", "publish": REPO,
            "speculator": {**CPU_SPECULATOR, "epochs": 1},
            # The served AL alone decides (no baseline servers: vLLM starts on the CPU); the
            # gate's other figures: tests/unit/test_evaluate.py.
            "evaluate": {"prompts": 4, "max_tokens": 32, "baseline": False, "ngram": False},
            "gate": {"min_acceptance_length": 7.5}})
        assert created.status_code == 201, created.text
        job = pg_api.wait_status(created.json()["id"], {"succeeded", "failed"}, timeout=600)
        assert job["status"] == "failed" and job["error_code"] == "acceptance_gate_failed", job
        al = job["served_acceptance_length"]
        assert al is not None and al < 7.5
        assert f"served mean acceptance length {al:.2f} < 7.50 required" in job["status_reason"]
        assert "can be published by hand" in job["status_reason"]
        verdict = job["evaluation"]["gate"]
        assert verdict["passed"] is False and verdict["required"]["min_acceptance_length"] == 7.5
        stages = [e["stage"] for e in pg_api.events(job["id"]) if e["kind"] == "status" and e["stage"]]
        assert "publishing" not in stages
        assert REPO not in hub.repo_ids() and hub.requests == []  # nothing reached the Hub
        [checkpoint] = pg_api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
        assert checkpoint["publish_status"] is None and checkpoint["served_acceptance_length"] == al
        by_hand = pg_api.post(f"/api/checkpoints/{checkpoint['id']}/publish", json={"repo_id": REPO})
        assert by_hand.status_code == 202, by_hand.text
        done = wait_for(lambda: (c := pg_api.get(f"/api/checkpoints/{checkpoint['id']}").json())
                        ["publish_status"] != "publishing" and c, 120, "the publish by hand")
        assert done["publish_status"] == "published", done


def test_publish_needs_the_token_secret(pg_api: Api, pg_stack: Stack) -> None:
    from app.db import session_scope
    from app.db.models import Checkpoint
    from tests.conftest import write_dataset, write_verifier
    from tests.support.errors import assert_error

    job = pg_api.post("/api/jobs", json={"verifier": write_verifier(pg_stack.models_root),
                                         "dataset": write_dataset(pg_stack.data_root)}).json()
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job["id"], epoch=0, path="/nowhere", is_best=True)
        session.add(checkpoint)
        session.flush()
        checkpoint_id = checkpoint.id
    assert_error(pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish", json={"repo_id": REPO}),
                 422, "missing_secret", "HF_TOKEN")
    pg_api.client.put("/api/secrets/HF_TOKEN", json={"value": TOKEN}, headers=pg_api.headers())
    assert_error(pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish", json={"repo_id": REPO}),
                 409, "checkpoint_offline")
    assert_error(pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish", json={"repo_id": "bad id"}),
                 422, "invalid_value", "repo_id")
