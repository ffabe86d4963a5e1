"""The dashboard in a real browser: `specdeck run` (what `make run` starts) serves the built
dashboard, and Playwright (frontend/e2e/, Debian's chromium) clicks through the whole flow, then
opens every page offline at two sizes. Screenshots and failure traces go to
var/artifacts/dashboard/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import free_port
from tests.support.specdeck_run import processes_in, seed_demo, start

# Generous: the flow trains a bake-off of three drafters on the CPU, and run on its own the test
# also makes the session's demo assets (minutes on 2 cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

FRONTEND = ROOT / "frontend"
DIST = FRONTEND / "dist"
# Chromium's headless shell (Debian's chromium-headless-shell): what Playwright runs headless by
# default. The full browser in headless mode renders its own UI as well: 90 CPU-s for this test
# against 50 (docs/ci.md, run 62).
CHROMIUM = Path(os.environ.get("PLAYWRIGHT_CHROMIUM", "/usr/lib/chromium/chromium-headless-shell"))
ARTIFACTS = ROOT / "var" / "artifacts" / "dashboard"
FLOW_CONVERSATIONS = 100

# Quick reactions, so the flow does not wait on timers: cancelling, health checks, the reconciler.
FAST = {
    "SPECDECK_DEFAULT_RUNTIME": "local",
    "SPECDECK_CANCEL_GRACE_SECONDS": "2",
    "SPECDECK_HEALTH_CHECK_SECONDS": "1",
    "SPECDECK_RECONCILE_SECONDS": "1",
    # The live acceptance chart gets a point a second after a request, not 15 s.
    "SPECDECK_LIVE_METRICS_SECONDS": "1",
    # The flow's webhook points at a closed port on this host, to see a failed attempt.
    "SPECDECK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
}


# A served evaluation that found the drafter slower than the verifier alone and below n-gram
# (a poor dataset's, a slow machine's): what the dashboard shows depends on what is stored, not
# on how fast this machine ran the flow's own evaluation.
# Its spread too: the flow's own, measured on a loaded machine, could make 0.61 a tie.
SLOWER = {"mean_acceptance_length": 1.42, "ngram_mean_acceptance_length": 1.9, "speedup": 0.61,
          "speedup_spread": 0.04, "ngram_speedup": 0.89, "beats_ngram": False}


def store_a_slower_copy(database: Path, job_id: str) -> str:
    """A succeeded job of one drafter, copied from the flow's bake-off ``job_id``: its headline
    candidate (the winner) with its evaluated checkpoint, evaluated as SLOWER; its id. Its
    metrics are that candidate's with every loss 1.5 times as high (a worse run, for the compare
    page's curves to tell apart)."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from app.db.models import Checkpoint, Job, JobCandidate, JobMetric

    engine = create_engine(f"sqlite:///{database}", connect_args={"timeout": 30})
    try:
        with Session(engine) as session, session.begin():
            job = session.get(Job, job_id)
            evaluation = job.evaluation or {}
            rows = session.scalars(select(JobCandidate).where(JobCandidate.job_id == job_id)
                                   .order_by(JobCandidate.idx)).all()
            chosen = next((r for r in rows if r.name == evaluation.get("candidate")), rows[0])
            best = session.get(Checkpoint, evaluation["checkpoint_id"])
            # The spec of a job that trained that candidate alone.
            drafter = next((c["drafter"] for c in job.spec.get("bakeoff") or []
                            if c["index"] == chosen.idx), job.spec["speculator"])
            spec = {**job.spec, "speculator": drafter, "bakeoff": []}
            copy = Job(project_id=job.project_id, status="succeeded", stage=job.stage,
                       spec=spec, started_at=job.started_at, finished_at=job.finished_at,
                       steps_per_epoch=chosen.steps_per_epoch or job.steps_per_epoch)
            session.add(copy)
            session.flush()
            checkpoint = Checkpoint(job_id=copy.id, candidate=0, kind=chosen.kind,
                                    epoch=best.epoch, path=best.path, metrics=best.metrics,
                                    is_best=True, evaluation={**(best.evaluation or {}), **SLOWER})
            session.add(checkpoint)
            session.flush()
            headline = {k: v for k, v in evaluation.items() if k != "leaderboard"}
            copy.evaluation = {**headline, **SLOWER, "checkpoint_id": checkpoint.id,
                               "candidate": chosen.kind}
            session.add(JobCandidate(
                job_id=copy.id, idx=0, name=chosen.kind, kind=chosen.kind, status="evaluated",
                steps_per_epoch=chosen.steps_per_epoch, train_seconds=chosen.train_seconds,
                train_cpu_seconds=chosen.train_cpu_seconds,
                evaluation={**(chosen.evaluation or {}), **SLOWER, "checkpoint_id": checkpoint.id,
                            "rank": 1, "winner": True, "tied_with": []}))
            for metric in session.scalars(select(JobMetric).where(
                    JobMetric.job_id == job_id, JobMetric.candidate == chosen.idx)):
                worse = 1.5 if "loss" in metric.name else 1.0
                session.add(JobMetric(job_id=copy.id, candidate=0, step=metric.step,
                                      epoch=metric.epoch, name=metric.name,
                                      value=metric.value * worse))
            return copy.id
    finally:
        engine.dispose()


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_dashboard_flow_and_pages_in_chromium(tmp_path: Path, demo_assets) -> None:
    assert (DIST / "index.html").is_file(), (
        "frontend/dist/index.html is missing: the dashboard is not built. Run `make install` with "
        "Node.js >= 20 on PATH (or: cd frontend && npm ci && npm run build).")
    assert (FRONTEND / "node_modules" / ".bin" / "playwright").exists(), (
        "frontend/node_modules has no Playwright: run `make install` (or: cd frontend && npm ci).")
    assert CHROMIUM.is_file(), (
        f"{CHROMIUM} is missing: install Debian's chromium-headless-shell (apt-get install "
        "chromium-headless-shell; .ci/run does), or point PLAYWRIGHT_CHROMIUM at a Chromium.")
    npx = shutil.which("npx")
    assert npx, "npx is not on PATH (Node.js >= 20 is needed for the dashboard)"

    demo_data = seed_demo(tmp_path, demo_assets)
    # --no-demo: the flow uploads the demo conversations itself, through the Datasets page: the
    # first FLOW_CONVERSATIONS of them, enough for every page (its bake-off trains three
    # candidates on them; how well they draft is not what the flow checks).
    flow_data = tmp_path / "flow-demo.jsonl"
    flow_data.write_bytes(b"".join(demo_data.read_bytes().splitlines(keepends=True)
                                   [:FLOW_CONVERSATIONS]))
    run = start(tmp_path, free_port(), {**FAST, "SPECDECK_DASHBOARD_DIR": str(DIST)}, ("--no-demo",))
    started: list[psutil.Process] = []
    try:
        run.wait_ready()
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True)
        env = {**os.environ, "SPECDECK_URL": run.url, "SPECDECK_KEY": run.key,
               "SPECDECK_DEMO_DATA": str(flow_data), "SPECDECK_ARTIFACTS": str(ARTIFACTS),
               "SPECDECK_E2E_STATE": str(tmp_path / "e2e-state.json"),
               "PLAYWRIGHT_CHROMIUM": str(CHROMIUM)}
        # The flow first; then, beside the job it trained, a stored copy whose evaluation says
        # its drafter is slower than no speculation, for verdict.spec.ts; then every page.
        playwright = subprocess.run([npx, "playwright", "test", "flow.spec.ts"], cwd=FRONTEND,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, timeout=2700)
        if playwright.returncode == 0:
            state = json.loads(Path(env["SPECDECK_E2E_STATE"]).read_text())
            env["SPECDECK_SLOW_JOB"] = store_a_slower_copy(tmp_path / "var" / "specdeck.db",
                                                          state["jobId"])
            rest = subprocess.run([npx, "playwright", "test", "pages.spec.ts", "verdict.spec.ts",
                                       "first-hour.spec.ts"],
                                  cwd=FRONTEND, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=600)
            playwright = subprocess.CompletedProcess(rest.args, rest.returncode,
                                                     playwright.stdout + rest.stdout)
        (ARTIFACTS / "playwright.log").write_text(playwright.stdout)

        # Ctrl-C stops everything it started: the API, the worker, its engines and trainers.
        started = psutil.Process(run.proc.pid).children(recursive=True)
        run.interrupt()
        alive = [p for p in started if running(p)]
        left = processes_in(tmp_path)

        rc = playwright.returncode
        assert rc == 0, (f"Playwright failed (screenshots, traces: {ARTIFACTS}):\n{playwright.stdout}\n"
                         f"--- specdeck run ---\n{run.output()[-20000:]}")
        for page in ("sign-in", "jobs", "job-detail", "job-leaderboard", "new-job-bakeoff",
                     "deployment-detail", "new-deployment-capture",
                     "deployment-flywheel", "deployment-promote", "deployment-retrain", "datasets",
                     "settings"):
            for size in ("1280x800", "390x844"):
                assert (ARTIFACTS / "screenshots" / f"{page}-{size}.png").is_file(), (page, size)
        for page in ("job-verdict", "new-deployment-verdict"):
            assert (ARTIFACTS / "screenshots" / f"{page}-1280x800.png").is_file(), page
        assert "stopped" in run.output()
        assert alive == [] and left == [], [p.cmdline() for p in [*alive, *left]]
    finally:
        run.kill()
        for leftover in [*started, *processes_in(tmp_path)]:
            try:
                leftover.kill()
            except psutil.NoSuchProcess:
                pass
