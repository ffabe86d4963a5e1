"""GPU scheduling with real worker processes that offer GPUs (SPECDECK_WORKER_GPUS) and run the
test-only stage: exclusive allocations, FIFO waiting with a reason, release after a crash."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Api, Stack, write_verifier
from tests.integration.test_dispatch import pid_files, ts
from tests.support.waiting import wait_for
from workers.supervisor import group_alive


# A job that holds its allocation until the test releases it (at most this long).
HOLD = "120"


def gpu_job(body, seconds: str, tp: int, trainer: int, pid_dir: Path | None = None,
            share: bool = False, until: Path | None = None) -> dict:
    meta = {"test_seconds": seconds}
    if pid_dir:
        meta["test_pid_dir"] = str(pid_dir)
    if until:
        meta["test_until"] = str(until)
    return body(runtime="vllm", metadata=meta,
                resources={"verifier": {"tensor_parallel_size": tp}, "trainer_gpus": trainer,
                           "share_verifier_gpus": share})


def running_window(api: Api, job_id: str) -> tuple:
    events = [e for e in api.events(job_id) if e["kind"] == "status"]
    start = next(ts(e["created_at"]) for e in events if e["status"] == "running")
    end = next(ts(e["created_at"]) for e in events if e["status"] in ("succeeded", "failed"))
    return start, end


def allocations(stack: Stack) -> int:
    return stack.scalar("SELECT count(*) FROM allocations")


def test_jobs_needing_more_than_half_the_gpus_run_one_after_the_other(pg_api: Api, pg_job_body,
                                                                      pg_stack: Stack,
                                                                      tmp_path: Path) -> None:
    pg_stack.start_worker("gpu-box", SPECDECK_WORKER_GPUS="0,1,2,3")
    # The first holds its GPUs until released, however slow the machine.
    release = tmp_path / "release"
    first = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, HOLD, tp=2, trainer=1,
                                                  until=release)).json()
    second = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=2, trainer=1)).json()
    assert first["worker"] == "gpu-box"
    assert first["allocation"] == {"verifier": [0, 1], "trainer": [2]}
    assert second["worker"] is None
    assert second["status_reason"] == (f"waiting for 3 free GPUs on one worker: gpu-box has 1 of 4 "
                                       f"free (used by {first['id']})")

    plan = pg_api.get(f"/api/jobs/{first['id']}/plan").json()
    assert plan["gpus"] == {"verifier": [0, 1], "trainer": [2]}
    assert pg_api.job(second["id"])["status"] == "queued"
    release.touch()

    for job in (first, second):
        assert pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=120)["status"] == "succeeded"
    first_window, second_window = running_window(pg_api, first["id"]), running_window(pg_api, second["id"])
    assert first_window[1] <= second_window[0], "the two jobs overlapped"
    scheduled = [e for e in pg_api.events(second["id"]) if e["kind"] == "scheduled"]
    assert scheduled and scheduled[0]["data"]["allocation"]["verifier"] == [0, 1]
    for job in (first, second):  # the worker ran each on the GPUs it was allocated
        [given] = [e for e in pg_api.events(job["id"]) if e["kind"] == "test_allocation"]
        assert given["data"]["allocation"] == {"verifier": [0, 1], "trainer": [2]}
    assert allocations(pg_stack) == 0


def test_a_job_that_fits_nowhere_shows_why_and_does_not_block_others(pg_api: Api, pg_job_body,
                                                                     pg_stack: Stack) -> None:
    pg_stack.start_worker("small-box", SPECDECK_WORKER_GPUS="0,1")
    huge = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "1", tp=4, trainer=4)).json()
    assert huge["status"] == "queued"
    assert huge["status_reason"] == "waiting for 8 free GPUs on one worker: the largest worker online has 2"
    small = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=1, trainer=1)).json()
    assert pg_api.wait_status(small["id"], {"succeeded"}, timeout=60)
    assert pg_api.job(huge["id"])["status"] == "queued"
    # A CPU (local runtime) job is not held back by GPU jobs either.
    cpu = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "0.2"})).json()
    assert pg_api.wait_status(cpu["id"], {"succeeded"}, timeout=60)


def test_no_gpu_worker_means_gpu_jobs_wait(pg_api: Api, pg_job_body, pg_stack: Stack) -> None:
    job = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "1", tp=1, trainer=1)).json()
    assert job["status_reason"] == "waiting for a worker to come online"
    pg_stack.start_worker("cpu-only")
    wait_for(lambda: pg_api.job(job["id"])["status_reason"] ==
             "waiting for 2 free GPUs on one worker: the largest worker online has 0", 60, "reason")


def test_a_job_created_before_any_worker_starts_when_the_first_comes_online(
        pg_api: Api, pg_job_body, pg_stack: Stack) -> None:
    """The worker's first reconcile round runs as it comes online: with rounds ten minutes
    apart, the job that waited for it is placed by that first round (before, it waited one
    interval: 5 s by default, in `specdeck run` right after the README's curl)."""
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "0"})).json()
    assert job["status_reason"] == "waiting for a worker to come online"
    pg_stack.start_worker("late", SPECDECK_RECONCILE_SECONDS="600")
    done = pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=120)
    assert done["status"] == "succeeded", done


def test_allocations_are_freed_after_a_worker_crash(pg_api: Api, pg_job_body, pg_stack: Stack,
                                                    tmp_path: Path) -> None:
    first = pg_stack.start_worker("crashy", SPECDECK_WORKER_GPUS="0,1,2,3")
    # The child runs until released: it still runs when the worker is killed, however slow the
    # machine, and its second attempt ends once it has started.
    release = tmp_path / "release"
    job = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, HOLD, tp=2, trainer=2, pid_dir=tmp_path,
                                                until=release)).json()
    waiting = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=1, trainer=1)).json()
    _, pgid = wait_for(lambda: pid_files(tmp_path, job["id"]).get(1), 30, "the child")
    assert allocations(pg_stack) == 4
    first.kill()
    pg_stack.start_worker("rescuer", SPECDECK_WORKER_GPUS="0,1,2,3")
    wait_for(lambda: pid_files(tmp_path, job["id"]).get(2), 120, "the second attempt's child")
    # Not released yet, so only the reaper can have ended it.
    wait_for(lambda: not group_alive(pgid), 60, "the dead worker's child to be reaped")
    release.touch()
    for j in (job, waiting):
        assert pg_api.wait_status(j["id"], {"succeeded", "failed"}, timeout=120)["status"] == "succeeded"
    assert pg_api.job(job["id"])["attempt"] == 2
    assert not group_alive(pgid)
    assert allocations(pg_stack) == 0


def test_cpu_capacity_is_the_number_of_concurrent_local_jobs(pg_api: Api, pg_job_body,
                                                              pg_stack: Stack, tmp_path: Path) -> None:
    pg_stack.start_worker("laptop", SPECDECK_WORKER_CONCURRENCY="2")
    # The first two hold both slots until released, however slow the machine.
    release = tmp_path / "release"
    holding = {"test_seconds": HOLD, "test_until": str(release)}
    jobs = [pg_api.post("/api/jobs", json=pg_job_body(metadata=meta)).json()
            for meta in (holding, holding, {"test_seconds": "0.5"})]
    assert [j["allocation"] for j in jobs[:2]] == [{"slot": [0]}, {"slot": [1]}]
    assert jobs[2]["status_reason"] == (f"waiting for a free training slot: laptop has 0 of 2 free "
                                        f"(used by {jobs[0]['id']}, {jobs[1]['id']})")
    release.touch()
    for job in jobs:
        assert pg_api.wait_status(job["id"], {"succeeded"}, timeout=120)
    assert allocations(pg_stack) == 0


def test_plan_of_a_placed_vllm_job_uses_its_allocation(pg_api: Api, pg_job_body, pg_stack: Stack,
                                                       tmp_path: Path) -> None:
    """GET /plan shows the commands the worker will run, on the GPUs the scheduler assigned."""
    import json

    pg_stack.start_worker("gpu-box", SPECDECK_WORKER_GPUS="0,1,2,3")
    # The blocker holds GPUs 0 and 1 until released, however slow the machine.
    release = tmp_path / "release"
    blocker = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, HOLD, tp=1, trainer=1,
                                                    until=release)).json()
    job = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=1, trainer=1)).json()
    assert blocker["allocation"] == {"verifier": [0], "trainer": [1]}
    assert job["allocation"] == {"verifier": [2], "trainer": [3]}
    plan = pg_api.get(f"/api/jobs/{job['id']}/plan").json()
    stages = {s["stage"]: s for s in plan["stages"]}
    server, trainer = stages["starting_verifier"], stages["training"]
    assert server["argv"][:2] == ["vllm", "serve"]
    config = json.loads(server["argv"][server["argv"].index("--speculative-config") + 1])
    assert config["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 8]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "2" and trainer["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    argv = trainer["argv"]
    assert argv[argv.index("--target-layer-ids") + 1:argv.index("--target-layer-ids") + 4] == ["2", "4", "5"]
    release.touch()
    for j in (blocker, job):
        pg_api.wait_status(j["id"], {"succeeded"}, timeout=60)


def test_a_job_placed_on_a_worker_that_died_is_unscheduled_naming_it(api: Api, job_body,
                                                                     stack: Stack) -> None:
    from datetime import timedelta

    from app.db import session_scope
    from app.db.models import Job, Worker, utcnow
    from app.services.scheduling import unplace_from_dead_workers
    from app.settings import get_settings

    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    with session_scope() as session:
        session.add(Worker(id="w-gone", host="h", queue="q-gone", gpus=[], capacity=1,
                           last_heartbeat_at=utcnow() - timedelta(hours=1)))
        session.flush()
        session.get(Job, job_id).worker_id = "w-gone"
    with session_scope() as session:
        assert unplace_from_dead_workers(session, get_settings()) >= 1
    [event] = [e for e in api.events(job_id) if e["kind"] == "unscheduled"]
    assert event["message"].startswith("worker w-gone went away before starting it"), event
    assert api.job(job_id)["status"] == "queued"


def local_deployment(stack: Stack, name: str = "demo-fast") -> dict:
    from tests.integration.test_deployments_api import write_drafter

    return {"name": name, "runtime": "local", "verifier": write_verifier(stack.models_root),
            "drafter": write_drafter(stack.models_root)}


def test_a_laptop_worker_serves_a_deployment_and_runs_a_job_at_once(pg_api: Api, pg_job_body,
                                                                      pg_stack: Stack) -> None:
    """Default settings: one training slot and one serving slot, so a deployment (which holds
    its slot until deleted) does not keep every job waiting."""
    pg_stack.start_worker("laptop")
    [worker] = pg_api.get("/api/workers").json()["data"]
    assert (worker["capacity"], worker["serving_slots"]) == (1, 1)
    deployment = pg_api.post("/api/deployments", json=local_deployment(pg_stack)).json()
    assert (deployment["worker"], deployment["allocation"]) == ("laptop", {"serving": [0]})
    job = pg_api.post("/api/jobs", json=pg_job_body(metadata={"test_seconds": "0.5"})).json()
    assert (job["worker"], job["allocation"], job["status_reason"]) == ("laptop", {"slot": [0]}, None)
    # The worker has a thread for each: the job runs while the deployment holds its own.
    assert pg_api.wait_status(job["id"], {"succeeded", "failed"}, timeout=60)["status"] == "succeeded"
    assert pg_api.get(f"/api/deployments/{deployment['id']}").json()["worker"] == "laptop"
    assert pg_api.delete(f"/api/deployments/{deployment['id']}").status_code == 200
    wait_for(lambda: pg_api.get(f"/api/deployments/{deployment['id']}").json()["status"] == "stopped",
             60, "the deployment to stop")
    assert allocations(pg_stack) == 0


def test_what_waits_for_a_cpu_slot_says_who_holds_it_once(api: Api, job_body, make_api,
                                                           stack: Stack) -> None:
    import uuid
    from datetime import timedelta

    from app.db import session_scope
    from app.db.models import Worker, utcnow
    from app.services.scheduling import schedule
    from app.settings import get_settings

    def passes(n: int) -> None:
        for _ in range(n):
            with session_scope() as session:
                schedule(session, get_settings())

    def waiting(job_id: str) -> list[str]:
        return [e["message"] for e in api.events(job_id) if e["kind"] == "waiting"]

    first = api.post("/api/jobs", json=job_body()).json()
    assert first["status_reason"] == "waiting for a worker to come online"
    passes(3)
    assert waiting(first["id"]) == ["waiting for a worker to come online"]

    # A worker that nobody runs: what it is given stays queued on it, holding its slots.
    with session_scope() as session:
        session.add(Worker(id="laptop", host="h", queue=f"q-{uuid.uuid4().hex[:8]}", gpus=[],
                           capacity=1, serving_slots=1, last_heartbeat_at=utcnow() + timedelta(hours=1)))
    passes(1)
    assert api.job(first["id"])["allocation"] == {"slot": [0]}
    assert api.job(first["id"])["status_reason"] is None

    second, third = (api.post("/api/jobs", json=job_body()).json() for _ in range(2))
    reason = f"waiting for a free training slot: laptop has 0 of 1 free (used by {first['id']})"
    assert second["status_reason"] == reason
    assert third["status_reason"] == (f"waiting for a free training slot; {second['id']} is older "
                                      "and first in line")
    # The training slot being busy does not keep a deployment from its serving slot.
    deployment = api.post("/api/deployments", json=local_deployment(stack)).json()
    assert deployment["allocation"] == {"serving": [0]}

    passes(3)
    assert waiting(second["id"]) == [reason]  # once, however often the scheduler looks
    # Another project is told what holds the slot, not its ids.
    other = make_api(api)
    theirs = other.post("/api/deployments", json=local_deployment(stack)).json()
    assert theirs["status_reason"] == ("waiting for a free serving slot: laptop has 0 of 1 free "
                                       "(used by another project's deployment)")
    theirs = other.post("/api/jobs", json=job_body()).json()
    assert theirs["status_reason"] == ("waiting for a free training slot; another project's job is "
                                       "older and first in line")


def test_a_one_gpu_worker_runs_a_job_whose_trainer_shares_the_verifiers_gpu(
        pg_api: Api, pg_job_body, pg_stack: Stack) -> None:
    """A job needs the verifier's GPUs plus the trainer's; with share_verifier_gpus (a memory
    split) a host with one GPU runs it."""
    pg_stack.start_worker("one-gpu", SPECDECK_WORKER_GPUS="0")
    apart = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=1, trainer=1)).json()
    assert apart["worker"] is None
    assert apart["status_reason"] == ("waiting for 2 free GPUs on one worker: the largest worker "
                                      "online has 1")
    shared = pg_api.post("/api/jobs", json=gpu_job(pg_job_body, "0.5", tp=1, trainer=1,
                                                   share=True)).json()
    assert shared["worker"] == "one-gpu"
    assert shared["allocation"] == {"verifier": [0], "trainer": []}
    plan = pg_api.get(f"/api/jobs/{shared['id']}/plan").json()
    assert plan["gpus"] == {"verifier": [0], "trainer": [0]}
    assert pg_api.wait_status(shared["id"], {"succeeded", "failed"}, timeout=60)["status"] == "succeeded"
