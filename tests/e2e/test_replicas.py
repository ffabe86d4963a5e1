"""Replicas on real engines (issue 22): two workers (distinct names, one machine) serve one
deployment with ``replicas: 2``, each replica a vLLM engine (CPU wheel) on its own worker,
behind a real `specdeck api` gateway and the real `openai` SDK (no retries). Both replicas take
traffic; one replica's engine is SIGKILLed under load: no plain request fails (a request cut
before its first byte is retried on the other replica, a refused one goes there at once), the
stream on the killed engine ends with an OpenAI-shaped error event and the other stream goes
on; the replica restarts and takes traffic again; a promotion under load switches both
replicas' engines with no request failing; scaled back to one, its engine stops. The deployment
serves the demo drafter that tests/e2e/test_serving.py trained in this session (or, run without
it, one trained by a demo job on these workers, without the evaluation): what it accepts is
asserted from both engines' own counters. The promotion switches to an untrained DFlash drafter
(made in seconds)."""

from __future__ import annotations

import json
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Api, Stack
from tests.e2e.conftest import (DemoDrafter, checkpoint_row, demo_checkpoint, engine_processes,
                                job_processes)
from tests.e2e.test_live_acceptance import LIVE_ENV
from tests.e2e.test_pipeline import CPU_SPECULATOR, REAL_PIPELINE
from tests.e2e.test_promotion import engine_drafters
from tests.e2e.test_serving import PROMPTS, counters, deploy, running
from tests.support.drafters import write_untrained_drafter
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver, receiver, webhook_env  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.uses_demo_drafter, pytest.mark.timeout(1800)]
NAME = "demo-replicas"
CHAT_TOKENS = 16


def replica_rows(deployment_id: str) -> dict[int, dict[str, Any]]:
    """The deployment's rows that are not stopped, by replica index."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Deployment

    with session_scope() as session:
        return {row.replica: {"id": row.id, "status": row.status, "url": row.upstream_url}
                for row in session.scalars(select(Deployment).where(
                    (Deployment.id == deployment_id) | (Deployment.replica_of == deployment_id),
                    Deployment.status != "stopped"))}


def requests_per_replica(api: Api, deployment_id: str, after: int = 0) -> dict[int, int]:
    """The requests each replica's engine finished, from the live series (after point ``after``)."""
    response = api.get(f"/api/deployments/{deployment_id}/metrics",
                       params={"limit": 1000, "after": after})
    assert response.status_code == 200, response.text
    counts: dict[int, int] = {}
    for point in response.json()["data"]:
        counts[point["replica"]] = counts.get(point["replica"], 0) + point["requests"]
    return counts


def all_events(api: Api, path: str, after: int | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = api.get(path, params={"limit": 100, **({"after": after} if after else {})}).json()
        events += page["data"]
        if not page["has_more"]:
            return events
        after = page["last_id"]


def last_point(api: Api, deployment_id: str) -> int:
    points = api.get(f"/api/deployments/{deployment_id}/metrics", params={"limit": 1000}).json()
    return points["last_id"] or 0


class Load:
    """``count`` plain chat requests, two at a time, through the SDK with no retries; every
    failure is kept."""

    def __init__(self, client: openai.OpenAI, count: int) -> None:
        self.client, self.count = client, count
        self.done: list[str] = []
        self.failures: list[str] = []
        self.pool = ThreadPoolExecutor(2)
        self.futures = [self.pool.submit(self.ask, i) for i in range(count)]

    def ask(self, i: int) -> None:
        try:
            reply = self.client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=CHAT_TOKENS, temperature=0)
            self.done.append(reply.choices[0].message.content or "")
        except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
            self.failures.append(repr(exc))

    def finish(self) -> None:
        for future in self.futures:
            future.result(timeout=300)
        self.pool.shutdown()

    def stop(self) -> None:
        """Send no more; wait for those sent."""
        self.pool.shutdown(wait=True, cancel_futures=True)


class LongStream(threading.Thread):
    """A streamed request long enough to be running when an engine dies (it would run for
    minutes); keeps its events, and hangs up once ``enough`` is set and ``more`` events came."""

    def __init__(self, gateway_url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = gateway_url, key
        self.events: list[str] = []
        self.enough = threading.Event()
        self.more = 0

    def run(self) -> None:
        body = {"model": NAME, "messages": [{"role": "user", "content": PROMPTS[0]}],
                "max_tokens": 1500, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {self.key}"}) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line.removeprefix("data: "))
                if self.enough.is_set() and len(self.events) >= self.more:
                    return  # hanging up: the gateway aborts the engine's request

    def hang_up_after(self, more: int) -> None:
        self.more = len(self.events) + more
        self.enough.set()


def test_two_replicas_share_the_traffic_and_survive_a_killed_engine(
        pg_api: Api, pg_stack: Stack, gateway, demo: dict[str, str],  # noqa: F811
        demo_drafter: DemoDrafter, webhook_env, receiver: Receiver) -> None:  # noqa: F811
    verifier = (pg_stack.models_root / "demo").resolve()
    # The drain grace covers a request routed to an old engine just before the route cache saw
    # the switch: generous on a busy machine.
    # A lease that outlasts a worker's restart on a loaded machine (its imports alone can take
    # 30 s): step 5 restarts one, and the other would otherwise take the lease as expired and
    # stop the engine on this shared host before it could be adopted.
    env = {**REAL_PIPELINE, **LIVE_ENV, "SPECDECK_PROMOTION_DRAIN_GRACE_SECONDS": "5",
           "SPECDECK_LEASE_SECONDS": "120"}
    workers = {name: pg_stack.start_worker(name, **env) for name in ("replica-a", "replica-b")}
    trained = demo_checkpoint(pg_api, pg_stack, demo, demo_drafter)[0]["id"]
    untrained = write_untrained_drafter(verifier, pg_stack.models_root / "untrained",
                                        block_size=CPU_SPECULATOR["block_size"])
    b = checkpoint_row(pg_api, str(verifier), untrained, "an untrained drafter")
    created = deploy(pg_api, {"name": NAME, "checkpoint_id": trained, "runtime": "local",
                              "replicas": 2})
    assert created["status"] == "ready", created
    dep_id, path = created["id"], f"/api/deployments/{created['id']}"
    both = wait_for(lambda: (d := pg_api.get(path).json()) and all(
        r["status"] == "ready" for r in d["replica_states"]) and d, 300, "both replicas ready")
    assert [r["replica"] for r in both["replica_states"]] == [0, 1]
    assert {r["worker"] for r in both["replica_states"]} == {"replica-a", "replica-b"}
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=pg_api.key, max_retries=0)

    # 1. Both replicas serve: 40 requests, and each engine finished some of them, drafting
    # with the trained drafter (its own counters: accepted tokens per draft).
    rows = replica_rows(dep_id)
    before = {index: counters(row["url"]) for index, row in rows.items()}
    load = Load(client, 40)
    load.finish()
    assert load.failures == [] and len(load.done) == 40 and all(load.done)
    counts = wait_for(lambda: (c := requests_per_replica(pg_api, dep_id)) and sum(c.values()) >= 40
                      and c, 60, "the live points of the 40 requests")
    assert counts.get(0, 0) > 0 and counts.get(1, 0) > 0, counts
    for index, row in rows.items():
        after = counters(row["url"])
        drafts, accepted = (after[name] - before[index].get(name, 0) for name in (
            "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"))
        assert drafts > 0 and 1 + accepted / drafts > 1.0, (index, accepted, drafts)

    # 2. SIGKILL replica 1's engine with a stream on each engine and plain requests coming.
    victim, survivor = rows[1], rows[0]
    streams = [LongStream(gateway, pg_api.key) for _ in range(2)]
    for stream in streams:
        stream.start()
        wait_for(lambda: stream.events, 60, "the stream's first event")
    wait_for(lambda: running(victim["url"]) >= 1 and running(survivor["url"]) >= 1, 60,
             "a stream on each engine")
    load = Load(client, 30)
    # A plain request runs for a moment: checked at a steady pace, not a growing one.
    wait_for(lambda: running(victim["url"]) >= 2, 120, "a plain request beside the stream",
             most=0.05)
    killed = engine_processes(victim["id"])
    assert killed, "replica 1's engine processes"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    load.finish()
    assert load.failures == [], load.failures
    assert len(load.done) == 30
    # The victim's stream ends with an OpenAI-shaped error event; the survivor's goes on.
    ended = wait_for(lambda: [s for s in streams if not s.is_alive()], 60, "the cut stream to end")
    assert len(ended) == 1, [s.events[-3:] for s in streams]
    error = json.loads(ended[0].events[-1])["error"]
    assert error["code"] == "upstream_error" and error["type"] == "server_error", error
    [survivor_stream] = [s for s in streams if s is not ended[0]]
    survivor_stream.hang_up_after(10)
    survivor_stream.join(timeout=120)
    assert not survivor_stream.is_alive(), "the other stream hung"
    assert not any(e.startswith('{"error"') for e in survivor_stream.events)

    # 3. The replica is restarted by its worker and takes traffic again.
    before = last_point(pg_api, dep_id)
    back = wait_for(lambda: (d := pg_api.get(path).json()) and d["replica_states"][1]["status"]
                    == "ready" and d["replica_states"][1]["restarts"] == 1 and d, 300,
                    "replica 1's restart")
    assert back["status"] == "ready" and back["replica_states"][0]["restarts"] == 0
    load = Load(client, 20)
    load.finish()
    assert load.failures == []
    wait_for(lambda: requests_per_replica(pg_api, dep_id, before).get(1, 0) > 0, 60,
             "requests served by the restarted replica")

    # 4. A promotion under load switches both replicas' engines; no request fails. Its end is
    # told once, by a webhook event for the whole switch.
    hook = pg_api.post("/api/webhooks", json={"url": receiver.url, "events": [
        "deployment.promotion_succeeded", "deployment.promotion_failed"]})
    assert hook.status_code == 201, hook.text
    load = Load(client, 5000)  # stopped once the switch is seen
    wait_for(lambda: len(load.done) >= 2, 120, "the load to be under way")
    promoted = pg_api.post(f"{path}/promote", json={"checkpoint_id": b})
    assert promoted.status_code == 202, promoted.text
    for index, row in replica_rows(dep_id).items():
        wait_for(lambda row=row: engine_drafters(row["id"]) == [str(untrained)], 300,
                 f"replica {index} to serve the new drafter alone")
    done = len(load.done)
    wait_for(lambda: len(load.done) >= done + 4, 120, "requests after the switch")
    load.stop()
    assert load.failures == [], load.failures
    switched = pg_api.get(path).json()
    assert [r["drafter"] for r in switched["replica_states"]] == [str(untrained)] * 2, switched
    promotion = wait_for(lambda: (p := pg_api.get(f"{path}/promotions").json()["data"][0])
                         ["status"] in ("succeeded", "failed") and p, 60, "the promotion's end")
    assert promotion["id"] == promoted.json()["id"] and promotion["status"] == "succeeded"
    assert [(r["replica"], r["status"]) for r in promotion["replicas"]] == [(0, "succeeded"),
                                                                             (1, "succeeded")]
    [told] = receiver.wait("deployment.promotion_succeeded", timeout=120)
    assert told.verify(hook.json()["secret"])["data"]["promotion"] == promotion
    # Written with the last replica's step: one delivery, none for the other replica's.
    deliveries = pg_api.get(f"/api/webhooks/{hook.json()['id']}/deliveries").json()["data"]
    assert [d["event_type"] for d in deliveries] == ["deployment.promotion_succeeded"], deliveries

    # 5. Replica 1's worker is SIGKILLed and started again, as `specdeck run` or systemd would:
    # it adopts the engine that went on serving (workers/adoption.py). Under load, no request
    # fails, and the same engine processes serve afterwards.
    rows = replica_rows(dep_id)
    holder = pg_api.get(path).json()["replica_states"][1]["worker"]
    engine = sorted(engine_processes(rows[1]["id"]))
    load = Load(client, 5000)  # stopped once the adoption is seen and requests came after it
    wait_for(lambda: len(load.done) >= 2, 120, "the load to be under way")
    seen = all_events(pg_api, f"{path}/events")
    workers[holder].kill()
    workers[holder] = pg_stack.start_worker(holder, **env)
    wait_for(lambda: any(e["kind"] == "adopted" and e["replica"] == 1 for e in all_events(
        pg_api, f"{path}/events", after=seen[-1]["id"])), 120,
        "the restarted worker to adopt replica 1's engine")
    done = len(load.done)
    wait_for(lambda: len(load.done) >= done + 4, 120, "requests after the adoption")
    load.stop()
    assert load.failures == [], load.failures
    assert sorted(engine_processes(rows[1]["id"])) == engine
    assert [r["status"] for r in pg_api.get(path).json()["replica_states"]] == ["ready"] * 2

    # 5. Scaled back to one replica: its engine stops; the deployment serves on.
    scaled = pg_api.patch(path, json={"replicas": 1})
    assert scaled.status_code == 200, scaled.text
    assert [(r["replica"], r["status"]) for r in scaled.json()["replica_states"]] == [
        (0, "ready"), (1, "stopping")]
    wait_for(lambda: job_processes(victim["id"]) == [], 60, "replica 1's engine to stop")
    wait_for(lambda: len(pg_api.get(path).json()["replica_states"]) == 1, 60,
             "replica 1 to be stopped")
    load = Load(client, 6)
    load.finish()
    assert load.failures == []
    pg_api.delete(path)
    wait_for(lambda: job_processes(dep_id) == [], 60, "replica 0's engine to stop")
