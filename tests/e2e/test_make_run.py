"""`make run` on the embedded default: `specdeck run` (what the Makefile calls after installing)
in an empty directory with no SPECDECK_ settings, so SQLite and the SQLite broker under ./var.
The README's curl body creates a job over real HTTP; the worker picks it up; Ctrl-C stops all."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import free_port, job_processes
from tests.support.specdeck_run import SpecdeckRun, seed_demo, start
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def readme_job_body() -> dict:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"curl -s -X POST http://127\.0\.0\.1:8000/api/jobs.*?-d '(.*?)'", readme, re.S)
    assert match, "the README's quick start has no job curl"
    return json.loads(match.group(1))


def readme_curls() -> list[str]:
    """The quick start's curl commands, as written (a command with its continued lines)."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quick_start, re.S)
    # Each command starts a line with "curl "; the lines after it, until the next, are its own.
    commands = [c.strip() for block in blocks for c in re.split(r"^(?=curl )", block, flags=re.M)
                if c.startswith("curl ")]
    assert len(commands) == 3, commands  # the job, its events, its event stream
    return commands


def for_this_run(command: str, url: str, dataset_id: str) -> str:
    """A README curl against this run's port and demo dataset."""
    return command.replace("http://127.0.0.1:8000", url).replace(
        "ds_0123456789abcdef01234567", dataset_id)


def run_curl(command: str, url: str, dataset_id: str, env: dict[str, str]) -> str:
    """One README curl through bash; its output."""
    command = for_this_run(command, url, dataset_id)
    done = subprocess.run(["bash", "-c", command], env={**os.environ, **env}, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, (command, done.returncode, done.stderr)
    return done.stdout


def stream_until(command: str, url: str, dataset_id: str, env: dict[str, str], wanted: str,
                 timeout: float = 60) -> str:
    """The README's stream curl through bash (it lasts until the job ends), read until a line
    holds ``wanted``, then stopped; what it printed. Fails if ``wanted`` has not come within
    ``timeout`` (the first event may be slow to come on a loaded machine: nothing waits a
    fixed time)."""
    command = for_this_run(command, url, dataset_id)
    proc = subprocess.Popen(["bash", "-c", command], env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    lines: list[str] = []
    timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if wanted in line:
                break
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    streamed = "".join(lines)
    assert wanted in streamed, (command, streamed)
    return streamed


def test_specdeck_run_serves_the_readme_job_and_stops_on_ctrl_c(tmp_path: Path, demo_assets) -> None:
    seed_demo(tmp_path, demo_assets)
    run = start(tmp_path, free_port())
    try:
        key, dataset_id, output = run.key, run.dataset_id, run.lines()
        assert (tmp_path / "var" / "specdeck.db").is_file()

        run.wait_ready()
        headers = {"Authorization": f"Bearer {key}"}
        create, events, stream = readme_curls()
        with httpx.Client(base_url=run.url, headers=headers, timeout=10) as client:
            # The README's job, with the demo dataset `make run` uploaded: its curl as written.
            created = json.loads(run_curl(create, run.url, dataset_id, {"KEY": key}))
            assert created.get("object") == "specdeck.job", created
            job_id = created["id"]
            assert client.get(f"/api/jobs/{job_id}").json()["dataset"] == dataset_id
            curl_env = {"KEY": key, "JOB_ID": job_id}
            listed = json.loads(run_curl(events, run.url, dataset_id, curl_env))
            assert listed["data"][0]["kind"] == "status", listed
            # Its first event as Server-Sent Events (its later ones depend on when the worker
            # comes online, which `specdeck run` starts beside the API).
            streamed = stream_until(stream, run.url, dataset_id, curl_env, wanted="data: ")
            first = json.loads(streamed.rsplit("data: ", 1)[1])
            assert "event: job.event" in streamed, streamed
            assert (first["object"], first["kind"], first["message"]) == (
                "specdeck.job.event", "status", "job created"), first
            deadline = time.monotonic() + 60
            messages: list[str] = []
            while time.monotonic() < deadline and not any(m.startswith("claimed by") for m in messages):
                messages = [e["message"] for e in client.get(f"/api/jobs/{job_id}/events").json()["data"]]
                time.sleep(0.2)
            assert any(m.startswith("claimed by") for m in messages), messages
            assert (tmp_path / "var" / "broker.db").is_file()  # the message went through SQLite
            printed = next(line for line in output if "curl -s -X POST" in line)
            assert json.loads(printed.split("-d '", 1)[1].rsplit("'", 1)[0]) == \
                {**readme_job_body(), "dataset": dataset_id}

            children = psutil.Process(run.proc.pid).children()
            commands = sorted(" ".join(c.cmdline()[1:3]) for c in children)
            assert any(c.endswith("specdeck api") for c in commands), commands
            assert any(c.endswith("specdeck worker") for c in commands), commands

            run.interrupt()  # Ctrl-C in a terminal
            assert "stopped" in run.output()
            for child in children:
                assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        # The worker handed the job back when it stopped; it is queued for the next start.
        from sqlalchemy import create_engine, text

        engine = create_engine(f"sqlite:///{tmp_path / 'var' / 'specdeck.db'}")
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
            handed_back = conn.execute(text("SELECT count(*) FROM job_events WHERE job_id = :id "
                                            "AND message LIKE '%shut down; job handed back'"),
                                       {"id": job_id}).scalar()
        engine.dispose()
        assert status == "queued" and handed_back == 1
        assert job_processes(job_id) == []
    finally:
        run.kill()


def test_specdeck_run_prints_the_same_key_on_every_start(tmp_path: Path) -> None:
    """One development key, kept in var/ (0600) and printed again, not a new one per start; a
    stored key this database does not know (another database's) is replaced. var/ and all it
    holds are private (0700, 0600)."""
    keys = []
    for _ in range(2):
        run = start(tmp_path, free_port(), args=("--no-demo",))
        try:
            run.wait_ready()
            with httpx.Client(base_url=run.url, timeout=10) as client:
                me = client.get("/api/me", headers={"Authorization": f"Bearer {run.key}"})
            assert me.status_code == 200, me.text
            keys.append(run.key)
            run.interrupt()
        finally:
            run.kill()
    stored = tmp_path / "var" / "dev-api-key"
    assert keys[0] == keys[1] == stored.read_text().strip()
    # var/ is its owner's alone: the database (key hashes, the encrypted HF token), the broker,
    # the key that decrypts nothing but opens the API, the logs.
    var = tmp_path / "var"
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777
             for p in (var, var / "specdeck.db", var / "broker.db", stored, var / "logs",
                       var / "data", var / "work")}
    assert modes == {"var": 0o700, "var/specdeck.db": 0o600, "var/broker.db": 0o600,
                     "var/dev-api-key": 0o600, "var/logs": 0o700, "var/data": 0o700,
                     "var/work": 0o700}, {k: oct(v) for k, v in modes.items()}
    assert not [p for p in var.rglob("*") if p.stat().st_mode & 0o077], "readable by others"

    stored.write_text("sd_a-key-of-another-database\n")
    run = start(tmp_path, free_port(), args=("--no-demo",))
    try:
        assert run.key not in keys and run.key == stored.read_text().strip()
        assert stored.stat().st_mode & 0o777 == 0o600
        run.interrupt()
    finally:
        run.kill()


# A host with no vLLM (macOS, ARM: vLLM's CPU wheel is Linux x86_64 only), as Python sees it.
HIDE_VLLM = """
import importlib.abc, sys

class NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoVllm())
"""


def test_a_host_without_vllm_runs_the_control_plane_and_says_what_runs_the_local_runtime(
        tmp_path: Path) -> None:
    hidden = tmp_path / "no-vllm"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(HIDE_VLLM)
    run = start(tmp_path, free_port(), env={"PYTHONPATH": str(hidden)}, args=("--no-demo",))
    try:
        run.wait_ready()
        note = wait_for(lambda: re.search(r"Note: (.*)", run.output()), 30, "the note")
        assert "no vLLM" in note.group(1) and "worker-cpu" in note.group(1), note.group(1)
        assert len(re.findall(r"Note: ", run.output())) == 1
        with httpx.Client(base_url=run.url, timeout=10) as client:
            assert client.get("/api/me", headers={"Authorization": f"Bearer {run.key}"}
                              ).status_code == 200
        run.interrupt()
    finally:
        run.kill()


# --- stopping and restarting under `specdeck run` -----------------------------------------------

# The stages in which a job's hidden-states server (and then its trainer) run.
PROCESS_STAGES = ("starting_verifier", "preparing_data", "training")


def query(run: SpecdeckRun, sql: str, **params: Any) -> Any:
    """One value from the run's SQLite database (var/specdeck.db under its directory)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{run.cwd / 'var' / 'specdeck.db'}")
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()
    finally:
        engine.dispose()


def all_events(client: httpx.Client, path: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = None
    while True:
        page = client.get(path, params={"limit": 100, **({"after": after} if after else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        events += body["data"]
        if not body["has_more"]:
            return events
        after = body["last_id"]


def running_job(client: httpx.Client, run: SpecdeckRun, job_id: str, timeout: float = 300) -> dict:
    """Wait until the job runs a stage with processes, and they run; returns the job."""
    def up() -> dict | None:
        job = client.get(f"/api/jobs/{job_id}").json()
        assert job["status"] in ("queued", "running"), (job, run.output()[-3000:])
        return job if job["stage"] in PROCESS_STAGES and job_processes(job_id) else None
    return wait_for(up, timeout, f"job {job_id}'s processes")


def processes_of(job_id: str, besides: list[psutil.Process] = ()) -> list[psutil.Process]:
    """The job's live processes (see job_processes), those in ``besides`` aside."""
    found = []
    for pid in job_processes(job_id):
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        if proc not in besides:
            found.append(proc)
    return found


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(procs: list[psutil.Process]) -> list[str]:
    found = []
    for proc in procs:
        try:
            found.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            found.append(f"{proc.pid}: (gone)")
    return found


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (connections in TIME_WAIT aside, as a server's bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def worker_of(run: SpecdeckRun) -> psutil.Process | None:
    for child in psutil.Process(run.proc.pid).children():
        try:
            if alive(child) and " ".join(child.cmdline()[1:3]).endswith("specdeck worker"):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def stop(run: SpecdeckRun) -> None:
    """Ctrl-C if it still runs; SIGKILL to its group as the last resort."""
    try:
        if run.proc.poll() is None:
            run.interrupt(timeout=150)
    finally:
        run.kill()


def test_sigterm_stops_the_whole_stack(tmp_path: Path, demo_assets) -> None:
    """SIGTERM to `specdeck run` alone (what systemd or `docker stop` sends) while a deployment
    serves and a job trains: it exits 0 within its stop timeout, and nothing of the stack is left
    (the API, the worker, the engine, the job's processes, their ports); the worker handed the job
    back (queued) and the deployment (pending) rather than losing them."""
    from tests.support.drafters import write_untrained_drafter

    seed_demo(tmp_path, demo_assets)
    # A drafter under the models root, deployed by path: served at once, no training needed.
    write_untrained_drafter(tmp_path / "var" / "models" / "demo", tmp_path / "var" / "models" / "untrained")
    run = start(tmp_path, free_port())
    try:
        run.wait_ready()
        with httpx.Client(base_url=run.url, headers={"Authorization": f"Bearer {run.key}"},
                          timeout=30) as client:
            created = client.post("/api/deployments", json={
                "name": "untrained", "drafter": "untrained", "verifier": "demo", "runtime": "local"})
            assert created.status_code == 201, created.text
            deployment_id = created.json()["id"]
            created = client.post("/api/jobs", json={**readme_job_body(), "dataset": run.dataset_id})
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]

            def ready() -> dict | None:
                deployment = client.get(f"/api/deployments/{deployment_id}").json()
                assert deployment["status"] in ("pending", "starting", "ready"), deployment
                return deployment if deployment["status"] == "ready" else None
            wait_for(ready, 300, "the deployment to be ready")
            running_job(client, run, job_id)

        upstream = query(run, "SELECT upstream_url FROM deployments WHERE id = :id", id=deployment_id)
        engine_port = int(upstream.rsplit(":", 1)[1])
        # The whole stack is one tree: the worker's jobs and engines are its children (in
        # sessions of their own), so the tree holds them. The job's processes are found first
        # and the tree read after: a stage starting goes on spawning (the trainer's own
        # children), and a process born between the two reads is in the tree read last; one
        # that ended between them is in neither, and is no part of the claim.
        job_pids, engine_pids = job_processes(job_id), job_processes(deployment_id)
        tree = psutil.Process(run.proc.pid).children(recursive=True)
        pids = {p.pid for p in tree}
        assert job_pids and engine_pids
        outside = {pid for pid in set(job_pids) | set(engine_pids)
                   if pid not in pids and psutil.pid_exists(pid)}
        assert not outside, (job_pids, engine_pids, describe(tree))
        assert not port_free(run.port) and not port_free(engine_port)

        began = time.monotonic()
        os.kill(run.proc.pid, signal.SIGTERM)  # the supervisor only, not its group
        code = run.proc.wait(timeout=150)
        took = time.monotonic() - began
        output = run.output()
        assert code == 0, output[-3000:]
        assert "got SIGTERM: stopping api, worker" in output and "\nstopped\n" in output
        # Each stopped on its own: none had to be killed at the stop timeout.
        assert "did not stop within" not in output, output[-3000:]
        left = [p for p in tree if alive(p)]
        assert not left, describe(left)
        assert job_processes(job_id) == [] and job_processes(deployment_id) == []
        assert port_free(run.port) and port_free(engine_port)
        print(f"`specdeck run` stopped in {took:.1f} s after SIGTERM ({len(tree)} processes)")
    finally:
        run.kill()
    # Handed back, not lost: the job waits for its next attempt, the deployment for a worker.
    assert query(run, "SELECT status FROM jobs WHERE id = :id", id=job_id) == "queued"
    assert query(run, "SELECT count(*) FROM job_events WHERE job_id = :id "
                 "AND message LIKE '%shut down; job handed back'", id=job_id) == 1
    assert query(run, "SELECT status FROM deployments WHERE id = :id", id=deployment_id) == "pending"
    assert query(run, "SELECT upstream_url FROM deployments WHERE id = :id", id=deployment_id) is None


def test_a_killed_worker_is_restarted_while_the_api_answers(tmp_path: Path, demo_assets) -> None:
    """SIGKILL to the worker while a job runs: `specdeck run` says so and starts another; the API
    answers every request all along; the new worker hands back at once the job the killed one
    held (re-queued for attempt 2) and stops the processes it left."""
    seed_demo(tmp_path, demo_assets)
    run = start(tmp_path, free_port())
    answered: list[float] = []  # when each request was answered 200 (time.monotonic())
    failed: list[str] = []
    done = threading.Event()

    def ask() -> None:
        with httpx.Client(base_url=run.url, timeout=10) as client:
            while not done.is_set():
                try:
                    response = client.get("/healthz")
                    if response.status_code == 200:
                        answered.append(time.monotonic())
                    else:
                        failed.append(f"{response.status_code}: {response.text[:200]}")
                except httpx.HTTPError as exc:
                    failed.append(f"{type(exc).__name__}: {exc}")
                done.wait(0.05)

    poller = threading.Thread(target=ask, name="healthz", daemon=True)
    try:
        run.wait_ready()
        with httpx.Client(base_url=run.url, headers={"Authorization": f"Bearer {run.key}"},
                          timeout=30) as client:
            created = client.post("/api/jobs", json={**readme_job_body(), "dataset": run.dataset_id})
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            running_job(client, run, job_id)

            worker = worker_of(run)
            assert worker is not None
            api = next(c for c in psutil.Process(run.proc.pid).children() if c.pid != worker.pid)
            poller.start()
            wait_for(lambda: answered, 10, "the first /healthz answer")

            before = processes_of(job_id)
            assert before and all(worker in p.parents() for p in before), describe(before)
            killed = time.monotonic()
            os.kill(worker.pid, signal.SIGKILL)
            # What the killed worker left: its job's processes, as they were when it died.
            left = before + processes_of(job_id, before)
            wait_for(lambda: "worker exited with code -9; restarting in 1 s" in run.output(), 30,
                     "the supervisor's restart line")
            new = wait_for(lambda: (w := worker_of(run)) is not None and w.pid != worker.pid and w,
                           30, "a new worker")

            def taken_back() -> list[dict] | None:
                events = all_events(client, f"/api/jobs/{job_id}/events")
                return events if any(re.fullmatch(r"worker \S+ restarted; re-queued for attempt 2",
                                                  e["message"]) for e in events) else None
            wait_for(taken_back, 120, "the new worker to hand the job back")
            wait_for(lambda: not any(alive(p) for p in left), 30,
                     "the processes the killed worker left to be gone")
            events = all_events(client, f"/api/jobs/{job_id}/events")
            stopped = [e for e in events if e["kind"] == "orphans_stopped"]
            reaped = {pid for e in stopped for pid in e["data"]["pids"]}
            # The API answered throughout: before the kill, all along, and after the hand-back.
            recovered = time.monotonic()
            wait_for(lambda: answered[-1] > recovered, 10, "a /healthz answer after the hand-back")
            done.set()
            poller.join(timeout=15)
            assert not poller.is_alive()

            assert alive(new) and alive(api) and run.proc.poll() is None
            assert not failed, failed[:5]
            assert answered[0] < killed < recovered < answered[-1]
            print(f"/healthz answered {len(answered)} times; orphans_stopped: "
                  f"{[e['message'] for e in stopped]}; left: {[p.pid for p in left]}")
            # Whatever was still running when the new worker started is what it stopped.
            assert reaped <= {p.pid for p in left}, (reaped, describe(left))
    finally:
        done.set()
        stop(run)
