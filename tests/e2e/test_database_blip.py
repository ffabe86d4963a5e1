"""Issue 9, point 11: a database blip during a real CPU training run does not fail the job.

The database is a private PostgreSQL cluster (its own port), stopped with ``pg_ctl stop -m
fast`` for several seconds while the speculators trainer prints a metric line every step, then
started again. Before the fix the first failed progress write was kept and re-raised after the
trainer exited, and a finished training ended ``failed`` with ``internal_error``. Now the job
succeeds, and every metric line the trainer printed, every checkpoint and the events are
recorded: the outage's backlog is written once the database is back."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL, Api, Stack, _client, _stack
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE
from tests.support.waiting import wait_for
from tests.support.pg_cluster import PrivateCluster
from workers.pipeline.trainer_output import Metric, parse_line

# Its timeout also covers making the demo assets if it is the first test to use them (minutes on
# 2 cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

OUTAGE_SECONDS = 8
# Far longer than the outage: the lease must outlast the outage plus the database's restart and
# the first heartbeat after it, on a busy machine too, so that no re-queue takes the job over.
LEASE_SECONDS = "60"


@pytest.fixture
def blip_stack(roots: dict[str, str], tmp_path: Path) -> Iterator[tuple[PrivateCluster, Stack]]:
    from app.cli import migrate

    cluster = PrivateCluster()
    try:
        migrate(cluster.url())
        for stack in _stack("postgres", cluster.url(), REDIS_URL, roots, tmp_path):
            yield cluster, stack
    finally:
        from app.db import get_engine

        get_engine().dispose()
        cluster.destroy()


def _metric_lines(log: str) -> Counter:
    """(name, epoch, step) of every metric the trainer printed, as the recorder parses them."""
    return Counter((r.name, r.epoch, r.step) for line in log.splitlines()
                   for r in parse_line(line) if isinstance(r, Metric))


def test_training_survives_a_database_outage(blip_stack, demo_assets) -> None:
    cluster, stack = blip_stack
    model, data = demo_assets
    shutil.copytree(model, stack.models_root / "demo", dirs_exist_ok=True)
    api: Api = next(_client(stack))
    with data.open("rb") as f:
        dataset = api.post("/api/datasets", files={"file": ("demo.jsonl", f, "application/jsonl")},
                           data={"name": "demo"}).json()["id"]
    stack.start_worker("blip-worker", **{**REAL_PIPELINE, "SPECDECK_LEASE_SECONDS": LEASE_SECONDS})
    created = api.post("/api/jobs", json={  # training only: the outage is the point here
        "verifier": "demo", "dataset": dataset, "runtime": "local", "evaluate": False,
        "speculator": {**CPU_SPECULATOR, "epochs": 3}})
    assert created.status_code == 201, created.text
    job = created.json()

    def training_metrics() -> int:
        return len(api.get(f"/api/jobs/{job['id']}/metrics",
                           params={"name": "train/loss"}).json()["data"])

    wait_for(lambda: training_metrics() >= 3, 400, "the trainer's first metric lines")
    cluster.stop()
    time.sleep(OUTAGE_SECONDS)  # the outage itself: the trainer keeps printing meanwhile
    cluster.start()

    done = api.wait_status(job["id"], {"succeeded", "failed", "cancelled"}, timeout=600)
    assert done["status"] == "succeeded", (done, api.events(job["id"])[-3:])
    assert done["attempt"] == 1  # carried through, not taken over by a re-queue

    checkpoints = api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["epoch"] for c in checkpoints] == [0, 1, 2]
    assert sum(c["is_best"] for c in checkpoints) == 1
    assert all(c["metrics"] for c in checkpoints)  # val metrics, from val_metrics.json or lines

    # Every metric line the trainer printed, the outage's included, is recorded exactly once.
    log = api.get(f"/api/jobs/{job['id']}/logs", params={"tail": 10_000}).text
    printed = _metric_lines(log)
    recorded = Counter((m["name"], m["epoch"], m["step"]) for m in
                       api.get(f"/api/jobs/{job['id']}/metrics").json()["data"])
    assert printed and recorded == printed

    messages = [e["message"] for e in api.events(job["id"])]
    assert any("held back by a database outage" in m for m in messages), messages
    for epoch in range(3):
        assert f"training epoch {epoch + 1} of 3 completed" in messages  # counted from 1
