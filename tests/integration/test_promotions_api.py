"""Warm starts (init_from), the deploy option, promote, rollback and retrain through the API on
both backends: what is accepted, recorded and planned, and every refusal's error. The switch
itself runs on a real worker in tests/e2e/test_promotion.py."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from tests.conftest import Api, Stack, write_verifier
from tests.integration.test_deployments_api import write_drafter
from tests.support.errors import assert_error

CHECKPOINT_CONFIG = {"speculators_model_type": "dflash", "block_size": 8,
                     "aux_hidden_state_layer_ids": [2, 4, 5], "draft_vocab_size": 512,
                     "transformer_layer_config": {"num_hidden_layers": 2}}


def make_checkpoint(api: Api, stack: Stack, job_body, **config) -> tuple[str, str]:
    """A job and a checkpoint of it on disk (as the trainer lays it out); (job id, checkpoint id)."""
    from app.db import session_scope
    from app.db.models import Checkpoint

    job = api.post("/api/jobs", json=job_body())
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    directory = Path(stack.env["SPECDECK_WORK_ROOT"]) / job_id / "checkpoints" / "0"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**CHECKPOINT_CONFIG, **config}))
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job_id, epoch=0, path=str(directory), is_best=True)
        session.add(checkpoint)
        session.flush()
        return job_id, checkpoint.id


def test_init_from_inherits_the_checkpoints_shape_and_plans_from_pretrained(
        api: Api, stack: Stack, job_body) -> None:
    _, checkpoint_id = make_checkpoint(api, stack, job_body)
    body = job_body(init_from=checkpoint_id, speculator={"epochs": 1})
    plan = api.post("/api/jobs/plan", json=body)
    assert plan.status_code == 200, plan.text
    [training] = [s for s in plan.json()["stages"] if s["stage"] == "training"]
    argv = training["argv"]
    assert argv[argv.index("--from-pretrained") + 1].endswith("/checkpoints/0")
    assert "--num-layers" not in argv

    job = api.post("/api/jobs", json=body)
    assert job.status_code == 201, job.text
    out = job.json()
    assert out["init_from"] == checkpoint_id
    # The shape is the checkpoint's: block 8, 2 layers, its layer ids; the whole vocabulary
    # (512, the verifier's) is no reduced draft vocabulary.
    assert {k: out["speculator"][k] for k in ("block_size", "num_layers", "target_layer_ids",
                                              "draft_vocab_size")} == {
        "block_size": 8, "num_layers": 2, "target_layer_ids": [2, 4, 5], "draft_vocab_size": None}
    assert api.get(f"/api/jobs/{out['id']}").json()["init_from"] == checkpoint_id
    # The same values named explicitly are fine.
    same = job_body(init_from=checkpoint_id, speculator={"block_size": 8, "num_layers": 2})
    assert api.post("/api/jobs/plan", json=same).status_code == 200


def test_init_from_refusals(api: Api, stack: Stack, job_body, make_api) -> None:
    _, checkpoint_id = make_checkpoint(api, stack, job_body)
    assert_error(api.post("/api/jobs", json=job_body(init_from="ckpt_" + "0" * 24)), 422,
                 "checkpoint_not_found", "init_from")
    assert_error(api.post("/api/jobs", json=job_body(init_from="not-an-id")), 422,
                 "invalid_value", "init_from")
    # Another project's checkpoint does not exist for this one.
    other = make_api(api)
    assert_error(other.post("/api/jobs", json=job_body(init_from=checkpoint_id)), 422,
                 "checkpoint_not_found", "init_from")
    # A different shape named explicitly.
    assert_error(api.post("/api/jobs", json=job_body(init_from=checkpoint_id,
                                                     speculator={"block_size": 16})),
                 422, "init_from_incompatible", "speculator.block_size")
    assert_error(api.post("/api/jobs", json=job_body(init_from=checkpoint_id,
                                                     speculator={"num_layers": 5})),
                 422, "init_from_incompatible", "speculator.num_layers")
    # Another verifier.
    write_verifier(stack.models_root, "other", layers=12)
    assert_error(api.post("/api/jobs", json=job_body(init_from=checkpoint_id, verifier="other")),
                 422, "init_from_incompatible", "init_from")
    # Not a DFlash checkpoint, and one whose files are gone.
    _, eagle = make_checkpoint(api, stack, job_body, speculators_model_type="eagle3")
    assert_error(api.post("/api/jobs", json=job_body(init_from=eagle)), 422, "invalid_drafter",
                 "init_from")
    _, gone = make_checkpoint(api, stack, job_body)
    (Path(stack.env["SPECDECK_WORK_ROOT"]) / api.get(f"/api/checkpoints/{gone}").json()["job_id"]
     / "checkpoints" / "0" / "config.json").unlink()
    assert_error(api.post("/api/jobs", json=job_body(init_from=gone)), 422,
                 "checkpoint_not_found", "init_from")


def test_deploy_needs_a_serving_deployment_of_the_same_verifier_and_the_evaluation(
        api: Api, stack: Stack, job_body) -> None:
    assert_error(api.post("/api/jobs", json=job_body(deploy={"deployment": "nope"})), 422,
                 "deployment_not_found", "deploy.deployment")
    assert_error(api.post("/api/jobs", json=job_body(deploy={"deployment": "x"}, evaluate=False)),
                 422, "invalid_value", "deploy")
    assert_error(api.post("/api/jobs", json=job_body(deploy={})), 422, "missing_field", "deploy.deployment")
    # A pending deployment is not serving yet: there is nothing to switch.
    drafter = write_drafter(stack.models_root)
    created = api.post("/api/deployments", json={"name": "fast", "drafter": drafter,
                                                 "verifier": "tiny", "runtime": "local"})
    assert created.status_code == 201, created.text
    assert_error(api.post("/api/jobs", json=job_body(deploy={"deployment": "fast"})), 422,
                 "deployment_not_found", "deploy.deployment")


def test_promote_rollback_and_retrain_refusals(api: Api, stack: Stack, job_body, make_api) -> None:
    job_id, checkpoint_id = make_checkpoint(api, stack, job_body)
    created = api.post("/api/deployments", json={"name": "fast", "checkpoint_id": checkpoint_id})
    assert created.status_code == 201, created.text
    deployment = created.json()
    path = f"/api/deployments/{deployment['id']}"
    # Another project sees none of it.
    other = make_api(api)
    for method, tail, body in (("post", "/promote", {"checkpoint_id": checkpoint_id}),
                               ("post", "/rollback", None), ("get", "/promotions", None),
                               ("post", "/retrain", {"dataset": "chat.jsonl"})):
        response = getattr(other, method)(path + tail, **({"json": body} if body else {}))
        assert_error(response, 404, "not_found")
    assert_error(api.post(path + "/promote", json={"checkpoint_id": "ckpt_" + "1" * 24}), 422,
                 "checkpoint_not_found", "checkpoint_id")
    assert_error(api.post(path + "/promote", json={}), 422, "missing_field", "checkpoint_id")
    # Pending: no worker serves it yet, so there is no engine to switch.
    _, second = make_checkpoint(api, stack, job_body)
    assert_error(api.post(path + "/promote", json={"checkpoint_id": second}), 409,
                 "deployment_not_serving")
    assert_error(api.post(path + "/rollback"), 409, "nothing_to_roll_back")
    assert api.get(path + "/promotions").json()["data"] == []

    assert_error(api.post(path + "/retrain"), 422, "dataset_required", "dataset")
    assert_error(api.post(path + "/retrain", json={"dataset": "chat.jsonl", "speculator":
                                                   {"block_size": 4}}), 422, "unknown_field",
                 "speculator.block_size")
    retrain = api.post(path + "/retrain", json={"dataset": "chat.jsonl", "deploy": False,
                                                "speculator": {"epochs": 1}})
    assert retrain.status_code == 201, retrain.text
    job = retrain.json()
    assert job["init_from"] == checkpoint_id  # the checkpoint the deployment serves
    assert job["data"]["regenerate"] is True  # the verifier writes the replies
    assert job["speculator"]["epochs"] == 1 and job["speculator"]["block_size"] == 8
    assert job["metadata"] == {"retrain_of": deployment["id"]}
    assert job["name"] == f"retrain of {deployment['name']}"  # what it retrains, in the list
    assert job["deploy"] is None and job["evaluate"]
    # deploy: true needs the deployment to be serving, like the job option.
    assert_error(api.post(path + "/retrain", json={"dataset": "chat.jsonl", "deploy": True}), 422,
                 "deployment_not_found", "deploy.deployment")
    assert job_id != job["id"]


def test_vllm_promotions_reserve_free_gpus_of_the_deployments_worker(api: Api, stack: Stack) -> None:
    """On vLLM the new engine runs on GPUs of its own beside the old one: reserved through the
    allocations' unique key (never a GPU someone holds), handed back afterwards."""
    from app.db import session_scope
    from app.db.models import Allocation, Deployment
    from app.services import promotions
    from app.services.workers import register

    with session_scope() as session:
        register(session, worker_id="gpu-box", host="h", queue="q",
                 gpus=[{"index": i} for i in range(3)], capacity=1, serving_slots=1)
    created = api.post("/api/deployments", json={"name": "fast", "runtime": "vllm",
                                                 "drafter": write_drafter(stack.models_root),
                                                 "verifier": write_verifier(stack.models_root)})
    assert created.status_code == 201, created.text
    dep_id = created.json()["id"]
    assert api.get(f"/api/deployments/{dep_id}").json()["allocation"]["verifier"] == [0]
    with session_scope() as session:
        deployment = session.get(Deployment, dep_id)
        assert promotions.reserve_gpus(session, deployment, 2) == [1, 2]
        assert promotions.reserve_gpus(session, deployment, 1) is None  # none left
        promotions.release_gpus(session, deployment, [1])
        assert promotions.reserve_gpus(session, deployment, 1) == [1]
        held = sorted(session.scalars(select(Allocation.idx).where(
            Allocation.deployment_id == dep_id)))
        assert held == [0, 1, 2]


def test_retrain_defaults_to_the_traffic_the_deployment_captured(api: Api, stack: Stack,
                                                                 job_body) -> None:
    from tests.integration.test_capture_api import record

    _, checkpoint_id = make_checkpoint(api, stack, job_body)
    created = api.post("/api/deployments", json={"name": "fast", "checkpoint_id": checkpoint_id,
                                                 "capture": {"sample_rate": 1.0}})
    assert created.status_code == 201, created.text
    deployment = created.json()
    path = f"/api/deployments/{deployment['id']}/retrain"
    captured = deployment["capture"]["dataset_id"]
    # Nothing captured yet: the capture is the default, and an empty one is refused.
    assert_error(api.post(path, json={}), 422, "dataset_empty")
    record(captured, 3)
    retrain = api.post(path, json={"speculator": {"epochs": 1}})
    assert retrain.status_code == 201, retrain.text
    assert retrain.json()["dataset"] == captured
    assert retrain.json()["init_from"] == checkpoint_id


def test_a_retrain_with_an_idempotency_key_makes_one_job(api: Api, stack: Stack, job_body,
                                                         make_api) -> None:
    """A retried retrain (a CI step run again, a double click) never trains twice: the same
    Idempotency-Key and request answer the job they made (200, Idempotent-Replayed), even once
    that deployment serves another drafter (the request is what is compared, not the job it
    would make now); a different request under the key is refused, as for POST /api/jobs."""
    from app.services.state import PromotionStatus
    from tests.integration.test_replicas_api import move_step, two_ready_replicas

    deployment, (first, second, _) = two_ready_replicas(api, stack, job_body, "fast")
    path = f"/api/deployments/{deployment['id']}/retrain"
    body = {"dataset": "chat.jsonl", "speculator": {"epochs": 1}}
    key = {"Idempotency-Key": "retrain-run-7"}

    def jobs() -> int:
        return stack.scalar("SELECT count(*) FROM jobs")

    made = api.post(path, json=body, headers=key)
    assert made.status_code == 201, made.text
    assert "Idempotent-Replayed" not in made.headers and made.json()["init_from"] == first
    before = jobs()
    again = api.post(path, json=body, headers=key)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json() == made.json() and jobs() == before

    # The deployment now serves another checkpoint: a retrain made now would start from it, but
    # the retried request still answers the job it made.
    promoted = api.post(f"/api/deployments/{deployment['id']}/promote", json={"checkpoint_id": second})
    assert promoted.status_code == 202, promoted.text
    for step in (PromotionStatus.STARTING, PromotionStatus.DRAINING, PromotionStatus.SUCCEEDED):
        for replica in (0, 1):
            move_step(replica, promoted.json()["id"], step)
    assert api.get(f"/api/deployments/{deployment['id']}").json()["source"]["checkpoint_id"] == second
    later = api.post(path, json=body, headers=key)
    assert later.status_code == 200 and later.json()["id"] == made.json()["id"], later.text
    fresh = api.post(path, json=body)  # no key: a new job, from what is served now
    assert fresh.status_code == 201 and fresh.json()["init_from"] == second, fresh.text

    # Another request under the key: another body, another deployment, a job create's key.
    assert_error(api.post(path, json={**body, "speculator": {"epochs": 2}}, headers=key), 422,
                 "idempotency_key_reused", "Idempotency-Key")
    _, checkpoint = make_checkpoint(api, stack, job_body)
    other = api.post("/api/deployments", json={"name": "other", "checkpoint_id": checkpoint}).json()
    assert_error(api.post(f"/api/deployments/{other['id']}/retrain", json=body, headers=key), 422,
                 "idempotency_key_reused", "Idempotency-Key")
    assert api.post("/api/jobs", json=job_body(), headers={"Idempotency-Key": "job-key"}).status_code == 201
    assert_error(api.post(path, json=body, headers={"Idempotency-Key": "job-key"}), 422,
                 "idempotency_key_reused", "Idempotency-Key")
    # An empty key is a key like any other (as for POST /api/jobs): made once, then replayed.
    empty = [api.post(path, json=body, headers={"Idempotency-Key": ""}) for _ in range(2)]
    assert [r.status_code for r in empty] == [201, 200], [r.text for r in empty]
    assert empty[0].json()["id"] == empty[1].json()["id"]
    # Keys are the project's own: another project's same key reaches nothing of this one.
    assert_error(make_api(api).post(path, json=body, headers=key), 404, "not_found")
    # The fresh retrain, the other checkpoint's job, the job create's, the empty key's.
    assert jobs() == before + 4
