"""The `specdeck` client CLI as a user and a CI pipeline run it: subprocesses against a real API
and worker (`specdeck run` on the demo verifier, the real pipeline on the CPU). The key travels
in the environment (SPECDECK_API_KEY), never in argv.

The successful job is docs/ci.md's GitHub workflow, its `specdeck` steps run as they are, so
the doc cannot rot. Jobs train as little as they can (one epoch, few short prompts): the worker
has one training slot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SPECDECK
from tests.e2e.conftest import free_port
from tests.support.specdeck_run import SpecdeckRun, seed_demo, start

# The first e2e test (by file name) also makes the session's demo assets (minutes on 2 cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

FAST = {"SPECDECK_DEFAULT_RUNTIME": "local", "SPECDECK_HEARTBEAT_SECONDS": "0.5",
        "SPECDECK_CANCEL_GRACE_SECONDS": "2", "SPECDECK_RECONCILE_SECONDS": "1"}
# The demo job (app.cli.DEMO_JOB), one epoch, and an evaluation short enough for CI that still
# measures the served acceptance length and the speedup over the verifier alone.
SPECULATOR = {"block_size": 8, "num_layers": 2, "max_anchors": 32, "total_seq_len": 512,
              "epochs": 1, "lr": 0.003}
EVALUATE = {"prompts": 2, "max_tokens": 32, "baseline": True, "ngram": False, "rounds": 1}
# The verdict in brackets when the drafter does not pay off: a tiny CPU job's speedup is near 1,
# above or below it by the machine's load.
SUMMARY = re.compile(r"^(job_[0-9a-f]{24}) succeeded: served AL (\d+\.\d\d), speedup "
                     r"(\d+\.\d\d)x(?: \(([^)]+)\))?, best checkpoint (ckpt_[0-9a-f]{24})$",
                     re.M)
TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ job_\w+ ", re.M)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_assets) -> Iterator[SpecdeckRun]:
    cwd = tmp_path_factory.mktemp("specdeck-run")
    seed_demo(cwd, demo_assets)
    run = start(cwd, free_port(), FAST, ("--no-demo",))
    try:
        run.wait_ready()
        yield run
        run.interrupt()
    finally:
        run.kill()


@pytest.fixture
def workdir(tmp_path: Path, server: SpecdeckRun) -> Path:
    """A CI checkout: the demo conversations as data/chat.jsonl."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chat.jsonl").write_bytes(
        (server.cwd / "var" / "data" / "demo.jsonl").read_bytes())
    (tmp_path / "specdeck").mkdir()
    return tmp_path


def cli_env(server: SpecdeckRun, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    path = f"{Path(SPECDECK).parent}{os.pathsep}{env.get('PATH', '')}"  # the CLI, as CI has it
    return {**env, "PATH": path, "SPECDECK_URL": server.url, "SPECDECK_API_KEY": server.key,
            "XDG_CONFIG_HOME": str(home / "config"), "SPECDECK_RETRY_BACKOFF": "0.1", **extra}


def specdeck(*args: str, env: dict[str, str], cwd: Path, stdin: str | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPECDECK, *args], env=env, cwd=cwd, input=stdin, text=True,
                          capture_output=True, timeout=timeout)


def write_job(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump({"verifier": "demo", "runtime": "local",
                                    "speculator": SPECULATOR, "evaluate": EVALUATE, **fields}))
    return path


def ci_doc() -> tuple[list[str], list[str]]:
    """docs/ci.md's GitHub workflow steps (their `run:` scripts) and GitLab job script."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "ci.md").read_text(), re.S)
    github = next(yaml.safe_load(b) for b in blocks if "runs-on:" in b)
    gitlab = next(yaml.safe_load(b) for b in blocks if "before_script:" in b)
    [job] = github["jobs"].values()
    assert job["defaults"]["run"]["shell"] == "bash"  # -eo pipefail, which the test uses too
    assert {"SPECDECK_URL", "SPECDECK_API_KEY"} <= set(job["env"])
    [gitlab_job] = gitlab.values()
    return [s["run"] for s in job["steps"] if "run" in s], gitlab_job["script"]


def specdeck_commands(script: str) -> list[str]:
    """The specdeck invocations of a script, continuation lines joined, what is piped off."""
    joined = re.sub(r"\\\n\s*", "", script)
    return [line.split("|")[0].split() for line in joined.splitlines()
            if line.strip().startswith("specdeck ")]


def test_ci_doc_pipeline_trains_reports_and_replays(server: SpecdeckRun, workdir: Path) -> None:
    started = time.monotonic()
    runs, gitlab_script = ci_doc()
    steps = [r for r in runs if "specdeck " in r and "pip install" not in r]
    assert len(steps) == 2, runs  # upload, then train with --wait
    # The GitLab job runs the same commands.
    assert [c for s in steps for c in specdeck_commands(s)] == \
        [c for s in gitlab_script for c in specdeck_commands(s)]
    assert "set -o pipefail" in gitlab_script

    write_job(workdir / "specdeck" / "job.yaml")
    step_summary = workdir / "step-summary.md"
    env = cli_env(server, workdir, GITHUB_STEP_SUMMARY=str(step_summary))
    outputs = []
    for script in steps:
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                              cwd=workdir, env=env, text=True, capture_output=True, timeout=600)
        assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
        outputs.append(done)
    upload, train = outputs
    assert re.fullmatch(r"ds_[0-9a-f]{24}\n", upload.stdout), upload.stdout
    summary = SUMMARY.search(step_summary.read_text())
    assert summary, step_summary.read_text()
    assert train.stdout == step_summary.read_text()  # stdout: the summary line only
    job_id, checkpoint_id = summary.group(1), summary.group(5)
    assert float(summary.group(2)) >= 1.0 and float(summary.group(3)) > 0
    assert TIMESTAMPED.search(train.stderr), train.stderr  # plain lines for the CI log
    assert "epoch 1/1" in train.stderr and "evaluat" in train.stderr

    # The API says the same, read through the CLI (--json parses, and is all stdout holds).
    got = specdeck("jobs", "get", job_id, "--json", env=env, cwd=workdir)
    job = json.loads(got.stdout)
    assert job["status"] == "succeeded" and job["evaluation"]["checkpoint_id"] == checkpoint_id
    assert job["dataset"] == upload.stdout.strip()
    assert f"{job['served_acceptance_length']:.2f}" == summary.group(2)
    assert f"{job['evaluation']['speedup']:.2f}" == summary.group(3)
    assert summary.group(4) == (job["verdict"] or {}).get("summary")
    checkpoint = json.loads(specdeck("checkpoints", "get", checkpoint_id, "--json", env=env,
                                     cwd=workdir).stdout)
    assert checkpoint["job_id"] == job_id
    # Following an ended job: its events (SSE) and log end at once; its loss is in the metrics.
    followed = specdeck("jobs", "events", job_id, "--follow", env=env, cwd=workdir, timeout=60)
    assert followed.returncode == 0 and "all stages completed" in followed.stdout
    logged = specdeck("jobs", "logs", job_id, "--tail", "5", "--follow", env=env, cwd=workdir,
                      timeout=60)
    assert logged.returncode == 0 and 0 < len(logged.stdout.splitlines()) <= 5
    losses = json.loads(specdeck("jobs", "metrics", job_id, "--name", "train/loss", "--json",
                                 env=env, cwd=workdir).stdout)["data"]
    assert losses and {m["name"] for m in losses} == {"train/loss"}

    # Serve the checkpoint: ready (exit 0), listed, stopped.
    served = specdeck("deployments", "create", "--name", "ci-drafter", "--checkpoint",
                      checkpoint_id, "--wait", "--timeout", "300", env=env, cwd=workdir)
    assert served.returncode == 0, served.stderr
    deployment_id = re.match(r"(dep_\w+) ready", served.stdout).group(1)
    # Scaled: the worker's one serving slot is replica 0's, so replica 1 waits; then back to one.
    scaled = specdeck("deployments", "scale", deployment_id, "2", env=env, cwd=workdir)
    assert scaled.returncode == 0, scaled.stderr
    assert scaled.stdout.strip() == f"{deployment_id} 2 replicas (0 ready, 1 pending)"
    refused = specdeck("deployments", "scale", deployment_id, "0", env=env, cwd=workdir)
    assert refused.returncode == 2 and "replicas" in refused.stderr, refused
    scaled = specdeck("deployments", "scale", deployment_id, "1", env=env, cwd=workdir)
    assert scaled.stdout.strip() == f"{deployment_id} 1 replica (0 ready)", scaled
    assert deployment_id in specdeck("deployments", "list", env=env, cwd=workdir).stdout
    stopped = specdeck("deployments", "delete", deployment_id, env=env, cwd=workdir)
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"{deployment_id} stop")

    # The pipeline run again on the same files replays the same job (auto key): no training.
    again = specdeck(*steps[1].split("|")[0].replace("\\\n", " ").split()[1:], "--json",
                     env=env, cwd=workdir)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == job_id
    assert "a replay" in again.stderr
    # A job file that changed is a different body: a new key, so a new job; the same explicit
    # key with another body is refused (4xx: exit 2).
    listed = json.loads(specdeck("jobs", "list", "--json", env=env, cwd=workdir).stdout)
    assert [j["id"] for j in listed["data"]] == [job_id]
    write_job(workdir / "other.yaml", dataset=job["dataset"], evaluate=False)
    first = specdeck("jobs", "create", "-f", "other.yaml", "--idempotency-key", "k-1",
                     env=env, cwd=workdir)
    replay = specdeck("jobs", "create", "-f", "other.yaml", "--idempotency-key", "k-1",
                      env=env, cwd=workdir)
    assert first.returncode == replay.returncode == 0 and first.stdout == replay.stdout
    write_job(workdir / "other.yaml", dataset=job["dataset"], evaluate=False, metadata={"a": "b"})
    clash = specdeck("jobs", "create", "-f", "other.yaml", "--idempotency-key", "k-1",
                     env=env, cwd=workdir)
    assert clash.returncode == 2 and "Idempotency-Key" in clash.stderr, clash.stderr
    assert specdeck("jobs", "cancel", first.stdout.strip(), env=env, cwd=workdir).returncode == 0
    print(f"ci pipeline: {time.monotonic() - started:.0f}s")


def test_a_job_that_misses_its_gate_exits_1_with_its_error(server: SpecdeckRun,
                                                           workdir: Path) -> None:
    env = cli_env(server, workdir)
    write_job(workdir / "job.yaml", gate={"min_acceptance_length": 60},
              evaluate={"prompts": 1, "max_tokens": 16, "baseline": False, "ngram": False})
    done = specdeck("jobs", "create", "-f", "job.yaml", "--dataset-file", "data/chat.jsonl",
                    "--wait", env=env, cwd=workdir)
    assert done.returncode == 1, done.stderr
    assert re.search(r"^job_\w+ failed \(acceptance_gate_failed\): served AL \d", done.stdout,
                     re.M), done.stdout
    assert "error: acceptance_gate_failed: acceptance gate failed: served mean acceptance " \
           "length" in done.stderr
    assert "lines of the job's log ---" in done.stderr


def test_wait_times_out_then_sees_a_cancel_from_another_process(server: SpecdeckRun,
                                                                 workdir: Path) -> None:
    env = cli_env(server, workdir)
    long = {**SPECULATOR, "epochs": 200}
    write_job(workdir / "job.yaml", speculator=long, evaluate=False)
    waiting = subprocess.Popen([SPECDECK, "jobs", "create", "-f", "job.yaml", "--dataset-file",
                                "data/chat.jsonl", "--wait"], env=env, cwd=workdir, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        job_id = None
        while job_id is None and time.monotonic() < deadline:
            listed = json.loads(specdeck("jobs", "list", "--status", "running", "--json",
                                         env=env, cwd=workdir).stdout)["data"]
            job_id = listed[0]["id"] if listed else None
            time.sleep(0.5)
        assert job_id, "the job never started"

        timed_out = specdeck("jobs", "wait", job_id, "--timeout", "1", env=env, cwd=workdir)
        assert timed_out.returncode == 4, timed_out.stderr
        assert "the job keeps going" in timed_out.stderr

        cancelled = specdeck("jobs", "cancel", job_id, env=env, cwd=workdir)
        assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"{job_id} cancel")
        stdout, stderr = waiting.communicate(timeout=120)
        assert waiting.returncode == 3, stderr
        assert stdout.startswith(f"{job_id} cancelled"), stdout
    finally:
        if waiting.poll() is None:
            waiting.kill()


def test_unreachable_server_exits_5_after_short_retries(server: SpecdeckRun, workdir: Path) -> None:
    env = cli_env(server, workdir, SPECDECK_URL=f"http://127.0.0.1:{free_port()}",
                  SPECDECK_RETRIES="2", SPECDECK_RETRY_BACKOFF="0.05")
    done = specdeck("jobs", "list", env=env, cwd=workdir)
    assert done.returncode == 5, done.stderr
    assert done.stderr.count("retrying in") == 2 and "cannot reach" in done.stderr


def test_keys_secrets_and_login(server: SpecdeckRun, workdir: Path) -> None:
    env = cli_env(server, workdir)
    created = specdeck("keys", "create", "--name", "ci", "--json", env=env, cwd=workdir)
    assert created.returncode == 0, created.stderr
    new = json.loads(created.stdout)
    listed = specdeck("keys", "list", env=env, cwd=workdir)
    assert new["id"] in listed.stdout and new["prefix"] in listed.stdout
    assert new["key"] not in listed.stdout

    as_new = {**env, "SPECDECK_API_KEY": new["key"]}
    assert specdeck("jobs", "list", env=as_new, cwd=workdir).returncode == 0
    revoked = specdeck("keys", "revoke", new["id"], env=env, cwd=workdir)
    assert revoked.returncode == 0 and f"{new['id']} revoked" in revoked.stdout
    refused = specdeck("jobs", "list", env=as_new, cwd=workdir)
    assert refused.returncode == 2
    assert "Invalid API key (HTTP 401, code invalid_api_key)" in refused.stderr

    # A secret's value from stdin; there is no argument for it.
    value = "hf_not-a-real-token-0123456789"
    assert specdeck("secrets", "set", "HF_TOKEN", value, env=env, cwd=workdir).returncode == 2
    put = specdeck("secrets", "set", "HF_TOKEN", env=env, cwd=workdir, stdin=value + "\n")
    assert put.returncode == 0, put.stderr
    shown = specdeck("secrets", "list", "--json", env=env, cwd=workdir)
    [secret] = json.loads(shown.stdout)["data"]
    assert secret["name"] == "HF_TOKEN" and "value" not in secret and value not in shown.stdout
    assert specdeck("secrets", "delete", "HF_TOKEN", env=env, cwd=workdir).returncode == 0
    assert json.loads(specdeck("secrets", "list", "--json", env=env, cwd=workdir).stdout)["data"] == []

    # login: the key from stdin, checked, kept in a 0600 profile that later commands use.
    bare = {k: v for k, v in env.items() if k not in ("SPECDECK_URL", "SPECDECK_API_KEY")}
    login = specdeck("login", "--url", server.url, "--profile", "ci", env=bare, cwd=workdir,
                     stdin=server.key)
    assert login.returncode == 0, login.stderr
    profile = workdir / "config" / "specdeck" / "config.json"
    assert profile.stat().st_mode & 0o777 == 0o600
    assert specdeck("jobs", "list", "--profile", "ci", env=bare, cwd=workdir).returncode == 0
    bad = specdeck("login", "--url", server.url, env=bare, cwd=workdir, stdin=new["key"])
    assert bad.returncode == 2 and "invalid_api_key" in bad.stderr
