"""The whole pipeline for real on the CPU (local runtime): REST API -> a real worker process ->
vLLM's hidden-states server (the CPU wheel) -> speculators prepare-data -> the speculators trainer
-> the evaluation. What a demo job must have done is ``assert_demo_job``, which
tests/e2e/test_serving.py applies to the job it then deploys (one training for both). Here: the
faults, a stopped worker (resume), a killed server, and cancels during training and
evaluation."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from app.runtimes import EVALUATION_MODEL
from tests.conftest import Api, Stack
from tests.e2e.conftest import job_processes
from tests.support.waiting import wait_for
from workers.runtimes.local.demo import DEMO_NUM_LAYERS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REAL_PIPELINE = {"SPECDECK_PIPELINE": "workers.pipeline:PIPELINE",
                 # the verifier server and trainer take seconds to start on 2 cores
                 "SPECDECK_LEASE_SECONDS": "15", "SPECDECK_HEARTBEAT_SECONDS": "1"}
# CPU-sized DFlash settings (dflash-facts.md section 3), with the demo job's shallow drafter.
CPU_SPECULATOR = {"block_size": 8, "num_layers": 2, "max_anchors": 32, "total_seq_len": 512}


def submit(api: Api, demo: dict[str, str], epochs: int, **fields: object) -> dict:
    body = {**demo, "runtime": "local", "speculator": {**CPU_SPECULATOR, "epochs": epochs},
            **fields}
    response = api.post("/api/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def event_seen(api: Api, job_id: str, kind: str, text: str = "") -> bool:
    return any(e["kind"] == kind and text in e["message"] for e in api.events(job_id))


def hidden_state_files(stack: Stack, job_id: str) -> list[Path]:
    work = Path(stack.env["SPECDECK_WORK_ROOT"]) / job_id
    return [p for p in work.rglob("*.safetensors") if "hidden_states" in p.parts]


def assert_demo_job(api: Api, stack: Stack, job_id: str) -> dict:
    """A demo job of two epochs (``submit(api, demo, epochs=2)``) that ended: it trained a
    DFlash drafter on the verifier's hidden states, saved a checkpoint per epoch, served the
    best one on held-out prompts beside the baselines, and left nothing behind. Returns the
    best checkpoint. (tests/e2e/test_serving.py trains it, then deploys it.)"""
    done = api.job(job_id)
    assert done["status"] == "succeeded", (done, api.get(f"/api/jobs/{job_id}/logs").text)
    layer_ids = done["speculator"]["target_layer_ids"]
    assert layer_ids == [2, DEMO_NUM_LAYERS // 2, DEMO_NUM_LAYERS - 3]

    checkpoints = api.get(f"/api/jobs/{job_id}/checkpoints").json()["data"]
    assert [c["epoch"] for c in checkpoints] == [0, 1]
    assert sum(c["is_best"] for c in checkpoints) == 1
    for checkpoint in checkpoints:
        config = json.loads((Path(checkpoint["path"]) / "config.json").read_text())
        assert config["speculators_model_type"] == "dflash"
        assert config["aux_hidden_state_layer_ids"] == layer_ids
        assert (Path(checkpoint["path"]) / "model.safetensors").is_file()
        assert checkpoint["metrics"]["eal_epoch"] > 1

    metrics = api.get(f"/api/jobs/{job_id}/metrics").json()["data"]
    train_loss = [m for m in metrics if m["name"] == "train/loss"]
    assert len(train_loss) >= 10 and len({m["step"] for m in train_loss}) == len(train_loss)
    val_eal = sorted((m["epoch"], m["value"]) for m in metrics if m["name"] == "val/eal_epoch")
    assert [epoch for epoch, _ in val_eal] == [0, 1]
    # The progress' total: the steps of epoch 0 (as the trainer numbered them), times 2; all
    # of them done.
    per_epoch = 1 + max(m["step"] for m in train_loss if m["epoch"] == 0)
    assert done["progress"] == {"epoch": 2, "epochs": 2, "step": max(m["step"] for m in train_loss),
                                "steps_done": 2 * per_epoch, "total_steps": 2 * per_epoch,
                                "percent": 100.0, "eta_seconds": 0.0}

    # The evaluation's own progress, as it was left: every engine started (a step each), and
    # every held-out prompt answered by all of them in turn, in each round (a step each).
    settings = done["evaluate"]
    engines = (sum(c["evaluation"] is not None for c in checkpoints)
               + settings["ngram"] + settings["baseline"])
    prompts, rounds = done["evaluation"]["prompts"], done["evaluation"]["rounds"]
    assert rounds == 3  # the default
    total = engines + rounds * prompts
    assert {k: v for k, v in done["stage_progress"].items() if k != "what"} == {
        "stage": "evaluating", "steps_done": total, "total_steps": total, "percent": 100.0,
        "eta_seconds": 0.0}
    assert done["stage_progress"]["what"] == (f"round {rounds} of {rounds}: prompt {prompts} of "
                                              f"{prompts} done")
    # A job of one drafter has one candidate, named by its kind, evaluated and the winner.
    [candidate] = done["candidates"]
    assert candidate["name"] == candidate["kind"] == "dflash" and candidate["status"] == "evaluated"
    assert candidate["winner"] is True and candidate["rank"] == 1 and done["winner"] == "dflash"
    assert candidate["train_seconds"] > 0 and candidate["train_cpu_seconds"] > 0

    events = api.events(job_id)
    stages = [e["stage"] for e in events if e["kind"] == "status" and e["stage"]]
    assert stages == ["starting_verifier", "preparing_data", "training", "evaluating"]
    assert_evaluated(api, job_id, checkpoints, events, metrics)
    assert hidden_state_files(stack, job_id) == []
    assert not (Path(stack.env["SPECDECK_WORK_ROOT"]) / job_id / "hidden_states").exists()
    assert job_processes(job_id) == []
    log = api.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).text
    assert "Checkpoint saved to" in log
    [best] = [c for c in checkpoints if c["is_best"]]
    return best


def assert_evaluated(api: Api, job_id: str, checkpoints: list[dict], events: list[dict],
                     metrics: list[dict]) -> dict:
    """The evaluating stage served the best checkpoint, measured it, recorded it, and stopped."""
    [best] = [c for c in checkpoints if c["is_best"]]
    assert [c["evaluation"] for c in checkpoints if not c["is_best"]] == [None] * (len(checkpoints) - 1)
    evaluation = best["evaluation"]
    assert evaluation["checkpoint_id"] == best["id"] and evaluation["epoch"] == best["epoch"]
    assert evaluation["runtime"] == "local" and evaluation["temperature"] == 0
    assert evaluation["prompts"] == 8 and evaluation["max_tokens"] == 64
    assert evaluation["prompt_source"] == "validation split"  # held out from training
    assert evaluation["num_speculative_tokens"] == CPU_SPECULATOR["block_size"] - 1
    assert 0 < evaluation["completion_tokens"] <= 8 * 64 and evaluation["output_tokens_per_s"] > 0
    assert evaluation["drafts"] > 0
    al = evaluation["mean_acceptance_length"]
    assert al == round(1 + evaluation["accepted_tokens"] / evaluation["drafts"], 4)
    assert al > 1.0, evaluation  # a trained drafter gets tokens accepted
    rates = evaluation["acceptance_rate_per_position"]
    assert len(rates) == CPU_SPECULATOR["block_size"] - 1
    assert rates == sorted(rates, reverse=True) and rates[0] > 0  # position i needs i - 1
    assert abs(sum(rates) - (al - 1)) < 1e-3  # the per-position rates add up to AL - 1
    assert api.get(f"/api/checkpoints/{best['id']}").json()["evaluation"] == evaluation

    # The verifier alone on the same prompts: greedy decoding is lossless, so the same text.
    assert evaluation["outputs_identical_to_baseline"] == f"{evaluation['prompts']}/{evaluation['prompts']}"
    assert evaluation["baseline_output_tokens_per_s"] > 0 and evaluation["speedup"] > 0
    assert evaluation["lossless"] is True
    # The engines answered the prompts in turns, round after round: each round gives a
    # speedup; the median is the one reported, the range its spread.
    rounds = evaluation["speedups"]
    assert len(rounds) == evaluation["rounds"] and all(r > 0 for r in rounds)
    assert evaluation["speedup"] == pytest.approx(statistics.median(rounds), abs=1e-3)
    assert evaluation["speedup_spread"] == pytest.approx(max(rounds) - min(rounds), abs=1e-3)
    # The served number comes first; n-gram drafting on the same prompts beside it, and the
    # trainer's estimate after it, labelled as one.
    ngram_al = evaluation["ngram_mean_acceptance_length"]
    assert ngram_al is None or ngram_al >= 1.0
    assert evaluation["beats_ngram"] == (al > (ngram_al or 1.0))
    assert evaluation["ngram_output_tokens_per_s"] > 0 and evaluation["ngram_speedup"] > 0
    assert evaluation["trainer_eal_estimate"] == pytest.approx(best["metrics"]["eal_epoch"], abs=1e-3)
    assert evaluation["served_vs_trainer_eal"] == pytest.approx(
        al / evaluation["trainer_eal_estimate"], abs=1e-3)
    assert evaluation["selected"] is True and best["served_acceptance_length"] == al
    job = api.get(f"/api/jobs/{job_id}").json()
    assert job["served_acceptance_length"] == al
    assert list(job["evaluation"])[:4] == ["checkpoint_id", "epoch", "mean_acceptance_length",
                                           "ngram_mean_acceptance_length"]
    assert job["evaluation"]["checkpoint_id"] == best["id"]
    [event] = [e for e in events if e["kind"] == "evaluated"]
    assert event["message"].startswith(f"served mean acceptance length {al:.2f} (n-gram ")
    assert "over 8 held-out prompts" in event["message"]
    assert event["stage"] == "evaluating" and event["data"] == evaluation
    kinds = [e["kind"] for e in events]
    assert kinds.index("verifier_stopped") < kinds.index("evaluation_started") < kinds.index("evaluated")
    [engine] = [e for e in events if e["kind"] == "process" and "evaluating the trained drafter" in e["message"]
                and e["message"].startswith("starting")]
    [ngram] = [e for e in events if e["kind"] == "process" and e["message"].startswith("starting")
               and "the n-gram (prompt lookup) baseline" in e["message"]]
    config = json.loads(ngram["data"]["argv"][ngram["data"]["argv"].index("--speculative-config") + 1])
    assert config["method"] == "ngram"
    assert engine["data"]["env"]["VLLM_API_KEY"] == "***"  # the key is redacted
    argv = engine["data"]["argv"]
    served = json.loads(argv[argv.index("--speculative-config") + 1])
    assert served["method"] == "dflash" and served["model"] == best["path"]  # the best checkpoint
    recorded = {m["name"]: m["value"] for m in metrics if m["name"].startswith("eval/")}
    assert recorded["eval/mean_acceptance_length"] == al
    assert [recorded[f"eval/acceptance_rate_pos_{i}"] for i in range(len(rates))] == rates
    return evaluation


def test_a_stopped_worker_stops_its_processes_and_another_resumes_from_the_epoch_checkpoint(
        pg_api: Api, pg_stack: Stack, small_demo) -> None:
    # Its trainer gets no grace to save (the test's subject is the resume from the last epoch
    # checkpoint; given the time, the trainer may well finish the epoch it is stopped in).
    first = pg_stack.start_worker("stopped", **REAL_PIPELINE, SPECDECK_TRAINER_STOP_GRACE_SECONDS="0")
    job = submit(pg_api, small_demo, epochs=2, evaluate=False)  # resuming is what is tested
    wait_for(lambda: event_seen(pg_api, job["id"], "checkpoint", "epoch 1 saved"), 400,
             "the first epoch's checkpoint")
    running = job_processes(job["id"])
    assert server_pids(job["id"]) and set(running) > set(server_pids(job["id"]))  # + the trainer
    # SIGTERM (systemd, docker stop, `specdeck run`): the worker stops the trainer and the
    # hidden-states server, waits for them, hands the job back, and only then exits.
    first.stop()
    assert not [pid for pid in running if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], running
    assert pg_api.job(job["id"])["status"] == "queued"
    pg_stack.start_worker("rescuer", **REAL_PIPELINE)
    done = pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=600)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2
    messages = [e["message"] for e in pg_api.events(job["id"])]
    assert "claimed by stopped (attempt 1)" in messages and "claimed by rescuer (attempt 2)" in messages
    # Events count epochs from 1: the first epoch's checkpoint is "epoch 1".
    assert any("found the epoch 1 checkpoint" in m for m in messages), messages
    assert any(m.startswith("training resumed from the epoch 1 checkpoint") for m in messages), messages
    assert job_processes(job["id"]) == []
    assert hidden_state_files(pg_stack, job["id"]) == []


def vllm_pids(job_id: str, marker: bytes) -> list[int]:
    """The job's vLLM API server processes whose command line holds ``marker`` (each one's
    engine core is in its process group)."""
    found = []
    for pid in job_processes(job_id):
        with contextlib.suppress(FileNotFoundError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"workers.runtimes.local.serve" in argv and marker in argv:
                found.append(pid)
    return found


def server_pids(job_id: str) -> list[int]:
    """The hidden-states server: vLLM with the extract_hidden_states method."""
    return vllm_pids(job_id, b"extract_hidden_states")


def test_killed_hidden_states_server_fails_the_job_with_its_log_tail(pg_api: Api, pg_stack: Stack,
                                                                     small_demo) -> None:
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    job = submit(pg_api, small_demo, epochs=3)
    wait_for(lambda: event_seen(pg_api, job["id"], "epoch", "started"), 400, "training to start")
    [pid] = server_pids(job["id"])
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    failed = pg_api.wait_status(job["id"], {"failed", "succeeded"}, timeout=60)
    assert failed["status"] == "failed"
    assert failed["error_code"] == "verifier_server_died"
    assert failed["status_reason"].startswith("verifier server died")
    final = pg_api.events(job["id"])[-1]
    # The server's own log: vLLM's access log lines (prepare-data's renders, the trainer's
    # requests), not the trainer's.
    assert re.search(r'"(GET|POST) /v1/\S+ HTTP/1.1" 200', final["data"]["log_tail"]), final
    wait_for(lambda: job_processes(job["id"]) == [], 15, "the trainer to be stopped")
    assert hidden_state_files(pg_stack, job["id"]) == []


def trainer_processes(job_id: str) -> list[int]:
    """The trainer's processes, the one the worker started first: the launcher the job's
    preloader forks the trainer for (workers/runtimes/local/preload.py) or the trainer itself,
    then every process that writes to its stdout (the forked trainer, its children)."""
    def stdout(pid: int) -> str | None:
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/{pid}/fd/1")
        return None

    processes = job_processes(job_id)
    [started] = [pid for pid in processes
                 if b"workers.runtimes.local.train" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    pipe = stdout(started)
    assert pipe is not None and pipe.startswith("pipe:"), pipe  # the worker reads it
    return [started] + [pid for pid in processes if pid != started and stdout(pid) == pipe]


def recorded(api: Api, job_id: str) -> tuple[list[dict], list[int]]:
    """The trainer's steps and the epochs whose checkpoints are recorded, as the API has them."""
    steps = api.get(f"/api/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["data"]
    saved = [c["epoch"] for c in api.get(f"/api/jobs/{job_id}/checkpoints").json()["data"]]
    return steps, saved


def signalled(pid: int) -> bool:
    """A stopped process holds SIGTERM pending, or is gone (SIGKILL)."""
    try:
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines())
    except FileNotFoundError:
        return True
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return status["State"].strip().startswith(("Z", "X")) or bool(
        pending & (1 << (signal.SIGTERM - 1)))


@contextlib.contextmanager
def frozen_mid_epoch(api: Api, job_id: str) -> Iterator[int]:
    """The job's trainer stopped (SIGSTOP) after a few steps of an epoch whose checkpoint is not
    saved yet, once the worker has recorded all it printed, so that a cancel lands mid-epoch
    whatever the machine's load (an epoch of the small demo takes seconds, and a trainer stopped
    just after an epoch's checkpoint has nothing new to save). Yields the process the worker
    started (and signals); they are all continued (SIGCONT) on leaving."""
    while True:
        wait_for(lambda: len(recorded(api, job_id)[0]) >= 3, 400, "a few training steps")
        processes = trainer_processes(job_id)
        signal_all(processes, signal.SIGSTOP)
        now = recorded(api, job_id)
        while True:  # the worker records the lines the trainer printed before it stopped
            time.sleep(1)
            now, before = recorded(api, job_id), now
            if now == before:
                break
        steps, saved = now
        if max(step["epoch"] for step in steps) not in saved:
            break
        signal_all(processes, signal.SIGCONT)  # just after an epoch's checkpoint: a few steps more
        wait_for(lambda: len(recorded(api, job_id)[0]) >= len(steps) + 3, 400, "more steps")
    try:
        yield processes[0]
    finally:
        signal_all(processes[::-1], signal.SIGCONT)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_cancel_mid_epoch_keeps_a_partial_checkpoint_or_says_nothing_was_saved(
        pg_api: Api, pg_stack: Stack, small_demo) -> None:
    """Cancelled mid-epoch, the trainer saves the epoch so far before it exits (it has
    SPECDECK_TRAINER_STOP_GRACE_SECONDS for it): a partial checkpoint, marked so in the API,
    which deploys. Given no time to save, it loses that epoch, and the events say so. Exits
    read in words."""
    worker = pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    outcomes = []
    for grace in ("60", "0"):
        if grace == "0":  # a worker that gives its trainers no time to save
            worker.stop()
            worker = pg_stack.start_worker("hasty", **REAL_PIPELINE,
                                           SPECDECK_TRAINER_STOP_GRACE_SECONDS=grace)
        job = submit(pg_api, small_demo, epochs=3)
        with frozen_mid_epoch(pg_api, job["id"]) as trainer:
            pg_api.post(f"/api/jobs/{job['id']}/cancel")
            wait_for(lambda: signalled(trainer), 60, "the worker to stop the trainer")
        done = pg_api.wait_status(job["id"], {"cancelled"}, timeout=120)
        assert done["status"] == "cancelled"
        assert done["candidates"][0]["status"] == "stopped"
        wait_for(lambda: job_processes(job["id"]) == [], 60, "processes to go")
        assert hidden_state_files(pg_stack, job["id"]) == []
        messages = [e["message"] for e in pg_api.events(job["id"])]
        outcomes.append((job, messages))
        assert not [m for m in messages if re.search(r"code -\d", m)], messages  # in words

    worker.stop()  # the deployment below is checked as accepted, not served
    (saved, messages), (lost, hasty) = outcomes
    # (An earlier epoch may have ended before the cancel: its checkpoint is kept beside.)
    checkpoints = pg_api.get(f"/api/jobs/{saved['id']}/checkpoints").json()["data"]
    [partial] = [c for c in checkpoints if c["partial"]]
    assert partial["path"].endswith("/interrupted"), partial
    assert (f"partial checkpoint of epoch {partial['epoch'] + 1} saved when the trainer was "
            "stopped") in messages, messages
    assert any(m.startswith("speculators trainer on the CPU (gloo) stopped by SpecDeck")
               for m in messages), messages
    deployed = pg_api.post("/api/deployments", json={"name": "partial", "runtime": "local",
                                                    "checkpoint_id": partial["id"]})
    assert deployed.status_code == 201, deployed.text
    assert deployed.json()["drafter"] == partial["path"]
    assert pg_api.delete(f"/api/deployments/{deployed.json()['id']}").json()["status"] == "stopped"

    kept = pg_api.get(f"/api/jobs/{lost['id']}/checkpoints").json()["data"]
    assert not [c for c in kept if c["partial"]], kept
    assert any(m.startswith("speculators trainer on the CPU (gloo) killed after the grace "
                            "period (0 s)") for m in hasty), hasty
    said = (f"the epoch {len(kept)} checkpoint is the latest kept" if kept
            else "no checkpoint is kept")
    assert any(re.search(r"the trainer was stopped during epoch \d+ and saved nothing of it", m)
               and said in m for m in hasty), hasty


def test_cancel_during_evaluation_stops_the_engine(pg_api: Api, pg_stack: Stack, small_demo) -> None:
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    body = {**small_demo, "runtime": "local", "speculator": {**CPU_SPECULATOR, "epochs": 1},
            "evaluate": {"prompts": 64, "max_tokens": 1024}}  # long enough to be caught mid-way
    response = pg_api.post("/api/jobs", json=body)
    assert response.status_code == 201, response.text
    job = response.json()
    wait_for(lambda: event_seen(pg_api, job["id"], "evaluation_started"), 600, "the evaluation")
    assert server_pids(job["id"]) == []  # the hidden-states server made room for it first
    # The event comes before the first engine is spawned: wait for the engine itself.
    wait_for(lambda: vllm_pids(job["id"], EVALUATION_MODEL.encode()), 120, "the evaluation engine")
    pg_api.post(f"/api/jobs/{job['id']}/cancel")
    done = pg_api.wait_status(job["id"], {"cancelled", "failed", "succeeded"}, timeout=120)
    assert done["status"] == "cancelled", done
    wait_for(lambda: job_processes(job["id"]) == [], 60, "the engine to go")
    checkpoints = pg_api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
    assert checkpoints and all(c["evaluation"] is None for c in checkpoints)
    assert not event_seen(pg_api, job["id"], "evaluated")


def test_a_verifier_vllm_cannot_load_fails_the_job_at_starting_verifier_with_its_log(
        pg_api: Api, pg_stack: Stack, small_demo) -> None:
    """Its config reads (the API accepts it), but its weights are cut short: vLLM exits while
    loading them, and the job fails at starting_verifier, with vLLM's own lines saying why."""
    broken = pg_stack.models_root / "broken"
    shutil.copytree(pg_stack.models_root / "demo", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    pg_stack.start_worker("cpu-worker", **REAL_PIPELINE)
    job = submit(pg_api, {**small_demo, "verifier": "broken"}, epochs=1, evaluate=False)
    failed = pg_api.wait_status(job["id"], {"failed", "succeeded", "cancelled"}, timeout=240)
    assert failed["status"] == "failed", failed
    assert failed["error_code"] == "verifier_server_failed", failed
    assert "exited with code" in failed["status_reason"], failed
    final = pg_api.events(job["id"])[-1]
    assert re.search(r"safetensor|Error", final["data"]["log_tail"]), final["data"]["log_tail"]
    assert not event_seen(pg_api, job["id"], "process", "prepare-data")
    wait_for(lambda: job_processes(job["id"]) == [], 15, "the server to be gone")
