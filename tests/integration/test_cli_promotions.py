"""`specdeck deployments promote|rollback [--wait]`, `promotions` and `retrain` against a real API process
(Postgres): while the CLI waits, the test moves each replica's step as its worker would
(``move_promotion``; real engines switching: tests/e2e/test_replicas.py). The steps come on
stderr, one line on stdout; the exit is 0 once every replica switched, 1 when the switch failed,
4 at --timeout (the switch goes on), 2 when the API refuses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from app.supervise import die_with_parent
from tests.conftest import SPECDECK, Api, Stack
from tests.integration.test_replicas_api import move_step, two_ready_replicas
from tests.support.api_server import start_api, stop_api
from tests.support.waiting import wait_for


def test_promote_and_rollback_wait_for_every_replica(pg_api: Api, pg_stack: Stack, pg_job_body,
                                                     tmp_path: Path) -> None:
    from app.services.state import PromotionStatus

    deployment, (_, second, third) = two_ready_replicas(pg_api, pg_stack, pg_job_body, "cli")
    dep_id, path = deployment["id"], f"/api/deployments/{deployment['id']}"
    url, api_proc = start_api({**os.environ, **pg_stack.env}, tmp_path / "api.log")
    env = {**os.environ, "SPECDECK_URL": url, "SPECDECK_API_KEY": pg_api.key}
    waiting: list[subprocess.Popen[str]] = []

    def specdeck(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SPECDECK, "deployments", *args], env=env, text=True,
                              capture_output=True, timeout=120)

    def wait_in_background(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([SPECDECK, "deployments", *args], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=die_with_parent)
        waiting.append(proc)
        return proc

    def newest() -> dict:
        return pg_api.get(f"{path}/promotions").json()["data"][0]

    try:
        # Nobody moves it: --timeout ends the wait (4), the switch stays asked for.
        timed_out = specdeck("promote", dep_id, "--checkpoint", second, "--wait", "--timeout", "1")
        assert timed_out.returncode == 4, timed_out
        assert "timed out after 1s" in timed_out.stderr and "keeps going" in timed_out.stderr
        pending = newest()
        assert pending["status"] == "pending" and timed_out.stdout == ""
        # Another switch while this one is under way: refused (exit 2), with the API's reason.
        refused = specdeck("promote", dep_id, "--checkpoint", third)
        assert refused.returncode == 2 and "promotion_in_progress" in refused.stderr, refused

        # Waited for to its end: each replica's steps on stderr, the line on stdout, exit 0.
        for replica in (0, 1):
            move_step(replica, pending["id"], PromotionStatus.FAILED, "stopped by the test")
        promoted = wait_in_background("promote", dep_id, "--checkpoint", third, "--wait")
        wait_for(lambda: newest()["id"] != pending["id"] or promoted.poll() is not None, 60,
                 "the promotion")
        switch = newest()
        assert switch["id"] != pending["id"], promoted.communicate(timeout=10)
        for to in (PromotionStatus.STARTING, PromotionStatus.DRAINING, PromotionStatus.SUCCEEDED):
            for replica in (0, 1):
                move_step(replica, switch["id"], to)
        out, err = promoted.communicate(timeout=60)
        assert promoted.returncode == 0, err
        drafter = switch["target"]["drafter"]
        assert out == f"{switch['id']} succeeded: promote of {dep_id} to {drafter}\n"
        assert f"replica 0: promote {switch['id']} requested" in err, err
        for replica in (0, 1):
            assert f"replica {replica}: succeeded: the test moved it" in err, err
        assert "stopped by the test" not in err  # the earlier switch's steps are not this one's

        listed = specdeck("promotions", dep_id)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split()[:3] for line in listed.stdout.splitlines()[1:]]
        assert rows == [[switch["id"], "promote", "succeeded"], [pending["id"], "promote", "failed"]]

        # A rollback whose replica 1 fails: exit 1, the reason names the replica; --json gives
        # the promotion as the API shows it, and nothing else on stdout.
        rolled = wait_in_background("rollback", dep_id, "--wait", "--json")
        wait_for(lambda: newest()["kind"] == "rollback" or rolled.poll() is not None, 60,
                 "the rollback")
        rollback = newest()
        assert rollback["kind"] == "rollback", rolled.communicate(timeout=10)
        for replica in (0, 1):
            move_step(replica, rollback["id"], PromotionStatus.STARTING)
        move_step(0, rollback["id"], PromotionStatus.DRAINING)
        move_step(0, rollback["id"], PromotionStatus.SUCCEEDED)
        move_step(1, rollback["id"], PromotionStatus.FAILED, "the engine exited")
        out, err = rolled.communicate(timeout=60)
        assert rolled.returncode == 1, err
        assert json.loads(out) == newest()
        assert json.loads(out)["status_reason"] == "replica 1: the engine exited"
        assert "replica 1: the engine exited; the previous drafter serves on" in err, err
        assert json.loads(out)["target"]["drafter"] == deployment["drafter"]  # the one before
    finally:
        for proc in waiting:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_api(api_proc)


def test_retrain_makes_one_job_per_idempotency_key(pg_api: Api, pg_stack: Stack, pg_job_body,
                                                   tmp_path: Path) -> None:
    """`specdeck deployments retrain`: the request from a file (and flags), one job per
    Idempotency-Key however often the step runs, --wait's timeout, the API's refusals. (Its
    --deploy --wait, on a real worker and engines: tests/e2e/test_promotion.py.)"""
    deployment, (first, _, _) = two_ready_replicas(pg_api, pg_stack, pg_job_body, "cli-retrain")
    dep_id = deployment["id"]
    url, api_proc = start_api({**os.environ, **pg_stack.env}, tmp_path / "api.log")
    env = {**os.environ, "SPECDECK_URL": url, "SPECDECK_API_KEY": pg_api.key}
    request = tmp_path / "retrain.yaml"
    request.write_text("dataset: chat.jsonl\nspeculator:\n  epochs: 1\n"
                       "evaluate: {prompts: 2, baseline: false, ngram: false}\n")

    def specdeck(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SPECDECK, "deployments", "retrain", dep_id, *args], env=env,
                              text=True, capture_output=True, timeout=120)

    try:
        made = specdeck("-f", str(request), "--idempotency-key", "ci-run-7", "--json")
        assert made.returncode == 0, made.stderr
        job = json.loads(made.stdout)
        assert f"created {job['id']} (queued)" in made.stderr
        assert job["init_from"] == first and job["metadata"] == {"retrain_of": dep_id}
        assert job["speculator"]["epochs"] == 1 and job["evaluate"]["prompts"] == 2
        # The step run again (a re-run pipeline, a retried request): the same job.
        again = specdeck("-f", str(request), "--idempotency-key", "ci-run-7")
        assert again.returncode == 0, again.stderr
        assert again.stdout == f"{job['id']}\n"
        assert "already exists for this Idempotency-Key (a replay): queued" in again.stderr
        assert_error_exit(specdeck("--dataset", "chat.jsonl", "--idempotency-key", "ci-run-7"),
                          "idempotency_key_reused")
        # No worker runs it here: --wait ends at --timeout (4), the job still queued.
        waited = specdeck("--dataset", "chat.jsonl", "--wait", "--timeout", "1")
        assert waited.returncode == 4, waited
        assert "timed out after 1s" in waited.stderr and "the job keeps going" in waited.stderr
        # Refused: nothing captured and no --dataset; a file that can't be read.
        assert_error_exit(specdeck(), "dataset_required")
        unreadable = specdeck("-f", str(tmp_path / "missing.yaml"))
        assert unreadable.returncode == 2 and "cannot read the retrain file" in unreadable.stderr
        jobs = pg_api.get("/api/jobs", params={"name": "retrain of cli-retrain"}).json()["data"]
        assert len(jobs) == 2, jobs  # the keyed one, and the one --wait timed out on
    finally:
        stop_api(api_proc)


def assert_error_exit(result: subprocess.CompletedProcess[str], code: str) -> None:
    """The CLI's refusal: exit 2, the API's error code on stderr, nothing on stdout."""
    assert result.returncode == 2 and code in result.stderr and result.stdout == "", result
