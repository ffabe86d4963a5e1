"""A bake-off on the CPU, end to end, as a CI pipeline runs it: `specdeck jobs create --wait`
against a real `specdeck api` and real workers; three candidates (DFlash, a smaller DFlash,
EAGLE-3) trained one after another against one vLLM hidden-states server, then served side by
side with n-gram drafting and the verifier alone, in turns, in rounds.

Along the way one candidate's trainer is killed (it fails with its reason; the others go on)
and the worker is stopped mid-training (another worker finishes the job without training the
finished candidate again). The CLI prints the leaderboard and exits 0; each finished kind is
then deployed and answers the OpenAI SDK through the gateway with the verifier's own text."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import ROOT, SPECDECK, Api, Stack
from tests.e2e.conftest import cmdline, job_processes
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE
from tests.e2e.test_serving import MAX_TOKENS, PROMPTS, counters, deploy, greedy_reference
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# One epoch each: the worker is stopped during EAGLE-3's, which the next worker trains again.
CANDIDATES = [{"type": "dflash"},
              {"type": "dflash", "name": "small", "block_size": 4, "num_layers": 1},
              {"type": "eagle3"}]


def events(api: Api, job_id: str) -> list[dict[str, Any]]:
    """Every event of the job, page after page."""
    found: list[dict[str, Any]] = []
    while True:
        params = {"limit": 100} | ({"after": found[-1]["id"]} if found else {})
        page = api.get(f"/api/jobs/{job_id}/events", params=params).json()
        found += page["data"]
        if not page["has_more"]:
            return found


def candidate(api: Api, job_id: str, name: str) -> dict[str, Any]:
    return next(c for c in api.job(job_id)["candidates"] if c["name"] == name)


def training(api: Api, job_id: str, name: str) -> bool:
    """The candidate's trainer has begun an epoch (its imports and first steps are behind it)."""
    return any(e["kind"] == "epoch" and e["message"].startswith(f"{name}: training epoch")
               and "started" in e["message"] for e in events(api, job_id))


def trainer_launchers(job_id: str, name: str) -> list[int]:
    """The processes the worker started for the candidate's trainer."""
    marker = f"/candidates/{name}/checkpoints".encode()
    return [pid for pid in job_processes(job_id)
            if b"workers.runtimes.local.train" in cmdline(pid) and marker in cmdline(pid)]


def test_a_bakeoff_loses_a_candidate_and_a_worker_and_still_serves_its_winner(
        pg_api: Api, pg_stack: Stack, small_demo, gateway: str, demo_assets,
        tmp_path: Path) -> None:
    # Its trainers get no grace to save: EAGLE-3, stopped during its only epoch, has nothing
    # kept, and is trained again (a trainer given the time saves, and the epoch may well be
    # complete by then: tests/e2e/test_pipeline.py checks a save on stop).
    first = pg_stack.start_worker("first", **REAL_PIPELINE, SPECDECK_TRAINER_STOP_GRACE_SECONDS="0")
    job_file = tmp_path / "bakeoff.json"
    job_file.write_text(json.dumps({
        **small_demo, "name": "bake-off", "runtime": "local",
        "speculator": {**CPU_SPECULATOR, "epochs": 1, "lr": 0.003}, "candidates": CANDIDATES,
        "evaluate": {"prompts": 4, "max_tokens": 48, "rounds": 2}}))
    env = {**os.environ, "SPECDECK_URL": gateway, "SPECDECK_API_KEY": pg_api.key}
    cli = subprocess.Popen([SPECDECK, "jobs", "create", "-f", str(job_file), "--wait",
                            "--timeout", "1500"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=(tmp_path / "cli.err").open("wb"), text=True)
    try:
        created = wait_for(lambda: re.search(r"created (job_\w+)", (tmp_path / "cli.err").read_text()),
                           60, "the CLI to create the job")
        job_id = created.group(1)

        # 1. The smaller DFlash's trainer is killed mid-training: that candidate fails, with
        # its reason and its trainer's last lines, and the next one trains.
        wait_for(lambda: training(pg_api, job_id, "small"), 600, "small's first epoch")
        [launcher] = trainer_launchers(job_id, "small")
        os.killpg(os.getpgid(launcher), signal.SIGKILL)
        small = wait_for(lambda: (c := candidate(pg_api, job_id, "small"))["status"] == "failed"
                         and c, 120, "small to fail")
        assert small["error_code"] == "host_oom_killed", small
        assert "killed by SIGKILL" in small["status_reason"] and small["log_tail"]

        # 2. The worker stops (SIGTERM, as systemd or `specdeck run` would) while EAGLE-3
        # trains: the job is handed back, DFlash stays trained, and another worker resumes.
        wait_for(lambda: training(pg_api, job_id, "eagle3"), 600, "eagle3's first epoch")
        first.stop()
        assert pg_api.job(job_id)["status"] == "queued"
        states = {c["name"]: c["status"] for c in pg_api.job(job_id)["candidates"]}
        assert states == {"dflash": "trained", "small": "failed", "eagle3": "training"}, states
        pg_stack.start_worker("rescuer", **REAL_PIPELINE)

        # 3. The CLI follows it all and prints the leaderboard.
        out, _ = cli.communicate(timeout=1200)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    err = (tmp_path / "cli.err").read_text()
    assert cli.returncode == 0, (out, err[-3000:])
    job = pg_api.job(job_id)
    assert job["status"] == "succeeded" and job["attempt"] == 2, job
    by_name = {c["name"]: c for c in job["candidates"]}
    winner = by_name[job["winner"]]
    assert re.search(rf"^{job_id} succeeded: winner {job['winner']}, served AL", out, re.M), out
    assert re.search(rf"^1\s+{job['winner']} \(winner\)\s+{winner['kind']}\s+evaluated\s+"
                     r"\d+\.\d\dx ±\d+\.\d\d", out, re.M), out
    assert re.search(r"^small failed: .*killed by SIGKILL", out, re.M), out

    # DFlash trained once, on the first worker; EAGLE-3 resumed after its first epoch.
    log = events(pg_api, job_id)
    trainers = [e["message"] for e in log if e["kind"] == "process"
                and e["message"].startswith("starting: speculators trainer")]
    assert trainers == ["starting: speculators trainer on the CPU (gloo) (dflash)",
                        "starting: speculators trainer on the CPU (gloo) (small)",
                        "starting: speculators trainer on the CPU (gloo) (eagle3)",
                        "starting: speculators trainer on the CPU (gloo) (eagle3)"], trainers
    assert any(e["message"] == "dflash is trained already: not trained again" for e in log)
    assert any(e["message"] == "small is failed already: not trained again" for e in log)
    assert [(e["attempt"], e["message"]) for e in log if e["kind"] == "claimed" or
            e["message"].startswith("claimed by")] == [(1, "claimed by first (attempt 1)"),
                                                       (2, "claimed by rescuer (attempt 2)")]

    # Every finished candidate served on the same prompts, lossless, with its spread; the
    # winner is the fastest of them unless it ties, and is what the job's evaluation shows.
    finished = [c for c in job["candidates"] if c["status"] == "evaluated"]
    assert {c["name"] for c in finished} == {"dflash", "eagle3"}
    for c in finished:
        assert c["lossless"] is True and c["outputs_identical_to_baseline"] == "4/4", c
        assert c["speedup"] > 0 and c["speedup_spread"] >= 0 and c["served_acceptance_length"] >= 1
        assert c["train_seconds"] > 0 and c["train_cpu_seconds"] > 0 and c["checkpoint_id"]
        assert len(c["evaluation"]["speedups"]) == 2
    loser = next(c for c in finished if not c["winner"])
    assert winner["rank"] == 1 and loser["rank"] == 2
    assert winner["speedup"] >= loser["speedup"] or loser["name"] in winner["tied_with"]
    assert job["evaluation"]["checkpoint_id"] == winner["checkpoint_id"]
    assert job["evaluation"]["leaderboard"]["ranking"] == [winner["name"], loser["name"]]
    assert job_processes(job_id) == []

    # 4. Each finished kind deployed from its own checkpoint, through the gateway.
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=pg_api.key, max_retries=0)
    expected = greedy_reference(demo_assets[0], PROMPTS[0])
    for c in finished:
        served = deploy(pg_api, {"name": f"bake-{c['name']}", "checkpoint_id": c["checkpoint_id"],
                                 "runtime": "local"})
        assert served["status"] == "ready" and served["kind"] == c["kind"], served
        upstream = pg_stack.scalar("SELECT upstream_url FROM deployments WHERE id = :id",
                                   id=served["id"])
        before = counters(upstream)
        reply = client.chat.completions.create(
            model=f"bake-{c['name']}", max_tokens=MAX_TOKENS, temperature=0,
            messages=[{"role": "user", "content": PROMPTS[0]}])
        assert reply.choices[0].message.content == expected  # lossless, as the verifier alone
        drafts = counters(upstream)["vllm:spec_decode_num_drafts_total"]
        assert drafts > before.get("vllm:spec_decode_num_drafts_total", 0)  # it drafted
        pg_api.delete(f"/api/deployments/{served['id']}")
        wait_for(lambda: job_processes(served["id"]) == [], 60, "the engine to exit")
