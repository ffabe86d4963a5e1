"""`make run` on the embedded default: `specdeck run` (what the Makefile calls after installing)
in an empty directory with no SPECDECK_ settings, so SQLite and the SQLite broker under ./var.
The README's curl body creates a job over real HTTP; the worker picks it up; Ctrl-C stops all."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import free_port, job_processes
from tests.support.specdeck_run import seed_demo, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def readme_job_body() -> dict:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"curl -s -X POST http://127\.0\.0\.1:8000/api/jobs.*?-d '(.*?)'", readme, re.S)
    assert match, "the README's quick start has no job curl"
    return json.loads(match.group(1))


def test_specdeck_run_serves_the_readme_job_and_stops_on_ctrl_c(tmp_path: Path, demo_assets) -> None:
    seed_demo(tmp_path, demo_assets)
    run = start(tmp_path, free_port())
    try:
        key, dataset_id, output = run.key, run.dataset_id, run.lines()
        assert (tmp_path / "var" / "specdeck.db").is_file()

        run.wait_ready()
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=run.url, headers=headers, timeout=10) as client:
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
    stored key this database does not know (another database's) is replaced."""
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
    assert stored.stat().st_mode & 0o777 == 0o600

    stored.write_text("sd_a-key-of-another-database\n")
    run = start(tmp_path, free_port(), args=("--no-demo",))
    try:
        assert run.key not in keys and run.key == stored.read_text().strip()
        assert stored.stat().st_mode & 0o777 == 0o600
        run.interrupt()
    finally:
        run.kill()
