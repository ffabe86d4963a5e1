"""`make run` on the embedded default: `specdeck run` (what the Makefile calls after installing)
in an empty directory with no SPECDECK_ settings, so SQLite and the SQLite broker under ./var.
The README's curl body creates a job over real HTTP; the worker picks it up; Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ROOT, SPECDECK
from tests.e2e.conftest import free_port, job_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def readme_job_body() -> dict:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"curl -s -X POST http://127\.0\.0\.1:8000/api/jobs.*?-d '(.*?)'", readme, re.S)
    assert match, "the README's quick start has no job curl"
    return json.loads(match.group(1))


def test_specdeck_run_serves_the_readme_job_and_stops_on_ctrl_c(tmp_path: Path, demo_assets) -> None:
    model, data = demo_assets
    # Reuse the session's demo verifier and data (specdeck run would make the same ones).
    shutil.copytree(model, tmp_path / "var" / "models" / "demo")
    (tmp_path / "var" / "data").mkdir(parents=True)
    shutil.copy(data, tmp_path / "var" / "data" / "demo.jsonl")

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([SPECDECK, "run", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    output: list[str] = []
    try:
        key = dataset_id = None
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or "Ctrl-C stops" in line:
                break
            output.append(line)
            if m := re.search(r"API key \(project 'default'\): (\S+)", line):
                key = m.group(1)
            if m := re.search(r"demo dataset: (ds_\w+)", line):
                dataset_id = m.group(1)
        assert key and dataset_id, "".join(output)
        assert (tmp_path / "var" / "specdeck.db").is_file()

        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            # The README's job, with the demo dataset `make run` uploaded.
            created = client.post("/api/jobs", json={**readme_job_body(), "dataset": dataset_id})
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
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

            children = psutil.Process(proc.pid).children()
            commands = sorted(" ".join(c.cmdline()[1:3]) for c in children)
            assert any(c.endswith("specdeck api") for c in commands), commands
            assert any(c.endswith("specdeck worker") for c in commands), commands

            # Ctrl-C in a terminal: SIGINT to the whole foreground process group.
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=90)
            output.append(proc.stdout.read())
            assert "stopped" in "".join(output)
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
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
