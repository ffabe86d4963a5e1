"""A bake-off through the API on both databases: a job's candidates (kinds and settings) are
resolved when it is created, or refused with a 422 that says why, before anything runs; a plan
shows each candidate's trainer and serving engine; the recorded vLLM parser (the GPU pin's)
accepts every serving command line, DSpark's and DFlash 2's included. The pipeline itself runs
in tests/e2e/test_bakeoff.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.doctor.flags import VLLM_SERVE, command_problems, program_of
from tests.conftest import Api, Stack
from tests.integration.test_quotas import quotas  # noqa: F401 (a fixture)
from tests.support.errors import assert_error
from tests.support.vllm_cli_record import argument_sets

KINDS = "dflash, dflash2, dspark, eagle3"
# The tiny verifier has 8 layers: SpecDeck's default layer ids are [2, 4, 5].
SHARED = {"total_seq_len": 512, "epochs": 2, "lr": 0.003}


def bakeoff(job_body, *candidates: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return job_body(speculator={**SHARED, "block_size": 8}, candidates=list(candidates), **fields)


def count(stack: Stack, table: str) -> int:
    return stack.scalar(f"SELECT count(*) FROM {table}")


def test_a_bakeoff_resolves_each_candidate_from_the_shared_settings(api: Api, job_body,
                                                                     stack: Stack) -> None:
    created = api.post("/api/jobs", json=bakeoff(
        job_body, {"type": "dflash"}, {"type": "dflash", "block_size": 4, "num_layers": 1},
        {"type": "eagle3", "name": "eagle", "target_layer_ids": [2, 5], "epochs": 3}))
    assert created.status_code == 201, created.text
    job = created.json()
    assert [(c["name"], c["kind"], c["status"], c["rank"], c["winner"]) for c in job["candidates"]] == [
        ("dflash", "dflash", "pending", None, False), ("dflash-2", "dflash", "pending", None, False),
        ("eagle", "eagle3", "pending", None, False)]
    first, second, eagle = (c["settings"] for c in job["candidates"])
    # Each takes the shared settings its kind has, unless it sets its own.
    assert (first["block_size"], first["num_layers"], first["epochs"]) == (8, 5, 2)
    assert (second["block_size"], second["num_layers"], second["lr"]) == (4, 1, 0.003)
    assert "block_size" not in eagle and (eagle["epochs"], eagle["ttt_steps"]) == (3, 3)
    assert first["target_layer_ids"] == [2, 4, 5] and eagle["target_layer_ids"] == [2, 5]
    assert {c["total_seq_len"] for c in (first, second, eagle)} == {512}
    assert job["winner"] is None and count(stack, "job_candidates") == 3

    plan = api.get(f"/api/jobs/{job['id']}/plan").json()
    # One hidden-states server for all of them, on the union of their layers.
    assert plan["layer_ids"]["verifier_server"] == [2, 4, 5, 8]
    assert [s["stage"] for s in plan["stages"]].count("starting_verifier") == 1
    trainers = {s["candidate"]: s["argv"] for s in plan["stages"] if s["stage"] == "training"}
    assert list(trainers) == ["dflash", "dflash-2", "eagle"]
    kinds = {name: argv[argv.index("--speculator-type") + 1] for name, argv in trainers.items()}
    assert kinds == {"dflash": "dflash", "dflash-2": "dflash", "eagle": "eagle3"}
    saves = {Path(argv[argv.index("--save-path") + 1]).parent.name for argv in trainers.values()}
    assert saves == {"dflash", "dflash-2", "eagle"}  # a directory of its own each
    # EAGLE-3 learns from 2 of the server's 3 layers: it reads its own slots of each sample.
    eagle_argv = trainers["eagle"]
    assert eagle_argv[eagle_argv.index("--hidden-states-backend") + 1] == "specdeck-layers"
    assert eagle_argv[eagle_argv.index("--hidden-states-slots") + 1] == "0,2,3"
    assert "--hidden-states-backend" not in trainers["dflash"]
    # Each candidate served as its kind is; n-gram and the verifier alone once for all.
    engines = [s for s in plan["stages"] if s["stage"] == "evaluating"]
    assert [s.get("candidate") for s in engines] == ["dflash", "dflash-2", "eagle", None, None]
    configs = [json.loads(s["argv"][s["argv"].index("--speculative-config") + 1])
               for s in engines[:4]]
    assert [(c["method"], c["num_speculative_tokens"]) for c in configs] == [
        ("dflash", 7), ("dflash", 3), ("eagle3", 3), ("ngram", 7)]


@pytest.mark.parametrize("body, param", [
    ({"speculator": {"type": "medusa"}}, "speculator.type"),
    ({"candidates": [{"type": "dflash"}, {"type": "medusa"}]}, "candidates.1.type"),
    ({"candidates": [{"block_size": 4}, {"name": "x"}]}, None),  # no type: DFlash; valid
])
def test_an_unknown_kind_is_refused_with_the_kinds_there_are(api: Api, job_body, stack: Stack,
                                                            body: dict, param: str | None) -> None:
    jobs = count(stack, "jobs")
    response = api.post("/api/jobs", json=job_body(**body))
    if param is None:
        assert response.status_code == 201, response.text
        return
    error = assert_error(response, 422, "invalid_value", param)
    assert KINDS in error["message"]
    assert count(stack, "jobs") == jobs


@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_a_kind_the_cpu_wheel_cannot_serve_is_refused_on_the_local_runtime(
        api: Api, job_body, stack: Stack, kind: str) -> None:
    jobs = count(stack, "jobs")
    for body, param in ((job_body(speculator={"type": kind}), "speculator.type"),
                        (bakeoff(job_body, {"type": "dflash"}, {"type": kind}), "candidates.1.type")):
        for path in ("/api/jobs", "/api/jobs/plan"):
            error = assert_error(api.post(path, json=body), 422, "unsupported_on_runtime", param)
            assert "served only by vLLM's Model Runner V2, which needs a GPU" in error["message"]
            assert "use the vllm runtime" in error["message"]
    assert count(stack, "jobs") == jobs and count(stack, "job_candidates") == 0


def test_on_gpu_hosts_a_bakeoff_of_every_kind_plans_each_trainer_and_engine(
        api: Api, job_body) -> None:
    body = bakeoff(job_body, {"type": "dflash"}, {"type": "dflash2"}, {"type": "dspark"},
                   {"type": "eagle3"}, runtime="vllm",
                   resources={"trainer_gpus": 2, "candidates_in_parallel": True})
    plan = api.post("/api/jobs/plan", json=body)
    assert plan.status_code == 200, plan.text
    stages = plan.json()["stages"]
    trainers = [s for s in stages if s["stage"] == "training"]
    assert [s["candidate"] for s in trainers] == ["dflash", "dflash2", "dspark", "eagle3"]
    # Side by side: each on trainer_gpus GPUs of its own, after the verifier's GPU 0.
    assert [s["gpus"] for s in trainers] == [[1, 2], [3, 4], [5, 6], [7, 8]]
    for trainer in trainers:
        argv = trainer["argv"]
        assert argv[argv.index("--speculator-type") + 1] == trainer["candidate"]
        assert "--nproc_per_node=2" in argv
    serving = {s.get("candidate") or s["description"]: s["argv"] for s in stages
               if s["stage"] == "evaluating"}
    methods = {name: json.loads(argv[argv.index("--speculative-config") + 1])["method"]
               for name, argv in serving.items() if "--speculative-config" in argv}
    # DFlash 2 is served under vLLM's dflash method (its checkpoint says DFlash2DraftModel).
    assert {k: v for k, v in methods.items() if k in ("dflash", "dflash2", "dspark", "eagle3")} == {
        "dflash": "dflash", "dflash2": "dflash", "dspark": "dspark", "eagle3": "eagle3"}
    tokens = {name: json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]
              for name, argv in serving.items() if name in ("dflash", "dspark")}
    assert tokens == {"dflash": 7, "dspark": 8}  # DSpark drafts from the anchor too
    # Every engine, as the pinned vLLM's own parser recorded it, takes our flags and methods;
    # they share the verifier's GPU, each with its share of its memory.
    accepted = argument_sets()[VLLM_SERVE]
    for argv in serving.values():
        program, args = program_of(argv)
        assert program == VLLM_SERVE and command_problems(args, accepted) == []
        assert float(argv[argv.index("--gpu-memory-utilization") + 1]) == round(0.85 / 6, 3)
    # A speculators trainer the recorded parser takes too.
    trainer_args = argument_sets()["speculators train"]
    for trainer in trainers:
        program, args = program_of(trainer["argv"])
        assert program == "speculators train" and command_problems(args, trainer_args) == []


def test_too_many_candidates_are_refused_per_the_quota(api: Api, job_body, stack: Stack,
                                                      quotas) -> None:  # noqa: F811
    quotas(candidates_per_job=2)
    error = assert_error(api.post("/api/jobs", json=bakeoff(
        job_body, {"type": "dflash"}, {"type": "eagle3"}, {"type": "dflash", "block_size": 4})),
        422, "too_many_candidates", "candidates")
    assert "at most 2" in error["message"] and "SPECDECK_QUOTA_CANDIDATES_PER_JOB" in error["message"]
    assert api.post("/api/jobs", json=bakeoff(job_body, {"type": "dflash"},
                                              {"type": "eagle3"})).status_code == 201


@pytest.mark.parametrize("candidates, fields, code, param", [
    ([{"type": "eagle3", "block_size": 4}], {}, "unknown_field", "candidates.0.block_size"),
    ([{"type": "dflash", "total_seq_len": 1024}], {}, "invalid_value", "candidates.0.total_seq_len"),
    ([{"name": "a"}, {"type": "eagle3", "name": "a"}], {}, "invalid_value", "candidates.1.name"),
    ([{"name": "Has Space"}], {}, "invalid_value", "candidates.0.name"),
    ([{"target_layer_ids": [5, 2]}], {}, "invalid_layer_ids", "candidates.0.target_layer_ids"),
    ([{"target_layer_ids": [2, 9]}], {}, "invalid_layer_ids", "candidates.0.target_layer_ids"),
    ([], {}, "invalid_value", "candidates"),
    ([{"type": "dflash"}], {"init_from": "ckpt_0123456789abcdef01234567"}, "invalid_value",
     "init_from"),
])
def test_a_candidate_the_trainer_would_refuse_is_refused_at_creation(
        api: Api, job_body, stack: Stack, candidates: list, fields: dict, code: str,
        param: str) -> None:
    jobs = count(stack, "jobs")
    error = assert_error(api.post("/api/jobs", json=bakeoff(job_body, *candidates, **fields)),
                         422, code, param)
    if param == "candidates.0.block_size":
        assert error["message"] == ("Unknown field 'candidates.0.block_size': an eagle3 drafter has "
                                    "no block_size")
    assert count(stack, "jobs") == jobs


def test_a_job_of_one_drafter_of_another_kind_trains_and_serves_that_kind(api: Api, job_body) -> None:
    job = api.post("/api/jobs", json=job_body(speculator={"type": "eagle3", "ttt_steps": 4}))
    assert job.status_code == 201, job.text
    out = job.json()
    assert out["speculator"]["type"] == "eagle3" and out["speculator"]["ttt_steps"] == 4
    assert [(c["name"], c["kind"]) for c in out["candidates"]] == [("eagle3", "eagle3")]
    stages = api.get(f"/api/jobs/{out['id']}/plan").json()["stages"]
    [trainer] = [s for s in stages if s["stage"] == "training"]
    assert trainer["argv"][trainer["argv"].index("--ttt-steps") + 1] == "4"
    assert "--block-size" not in trainer["argv"] and "candidate" not in trainer
    engine = next(s for s in stages if s["stage"] == "evaluating")
    config = json.loads(engine["argv"][engine["argv"].index("--speculative-config") + 1])
    assert (config["method"], config["num_speculative_tokens"]) == ("eagle3", 4)


def test_any_candidate_deploys_and_a_retrain_keeps_its_kind_and_settings(
        api: Api, job_body, stack: Stack) -> None:
    """A bake-off's EAGLE-3 checkpoint (not the winner, say) deploys as EAGLE-3, and a retrain
    of that deployment warm-starts from it with its kind and settings, not the job's first."""
    from app.db import session_scope
    from app.db.models import Checkpoint

    job = api.post("/api/jobs", json=bakeoff(
        job_body, {"type": "dflash"}, {"type": "eagle3", "ttt_steps": 4, "lr": 0.01})).json()
    directory = Path(stack.env["SPECDECK_WORK_ROOT"]) / job["id"] / "candidates" / "eagle3" / "0"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle3", "aux_hidden_state_layer_ids": [2, 4, 5],
        "draft_vocab_size": 512, "transformer_layer_config": {"num_hidden_layers": 1},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 4}]}}))
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job["id"], candidate=1, kind="eagle3", epoch=0,
                                path=str(directory), is_best=True)
        session.add(checkpoint)
        session.flush()
        checkpoint_id = checkpoint.id
    listed = api.get(f"/api/jobs/{job['id']}/checkpoints").json()["data"]
    assert [(c["candidate"], c["kind"]) for c in listed] == [(1, "eagle3")]

    created = api.post("/api/deployments", json={"name": "eagle", "checkpoint_id": checkpoint_id})
    assert created.status_code == 201, created.text
    deployment = created.json()
    assert deployment["kind"] == "eagle3" and deployment["num_speculative_tokens"] == 4

    retrain = api.post(f"/api/deployments/{deployment['id']}/retrain",
                       json={"dataset": job_body()["dataset"], "speculator": {"epochs": 1}})
    assert retrain.status_code == 201, retrain.text
    out = retrain.json()
    assert out["init_from"] == checkpoint_id
    assert out["speculator"]["type"] == "eagle3" and out["speculator"]["ttt_steps"] == 4
    assert (out["speculator"]["lr"], out["speculator"]["epochs"]) == (0.01, 1)
    assert out["speculator"]["num_layers"] == 1  # the checkpoint's shape
    [trainer] = [s for s in api.get(f"/api/jobs/{out['id']}/plan").json()["stages"]
                 if s["stage"] == "training"]
    argv = trainer["argv"]
    assert argv[argv.index("--speculator-type") + 1] == "eagle3"
    assert argv[argv.index("--from-pretrained") + 1] == str(directory)
