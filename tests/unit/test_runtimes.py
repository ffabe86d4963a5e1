"""The command lines each runtime builds, checked against shared/docs/dflash-facts.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.runtimes import JobPaths, ServeSpec, build_plan
from app.runtimes.local import serve_command
from app.schemas.job_spec import JobSpec
from app.settings import get_settings

ROW = {
    "verifier": "Qwen/Qwen3-8B",
    "dataset": "chat.jsonl",
    "dataset_path": "/data/chat.jsonl",
    "mode": "online",
    "runtime": "vllm",
    "resources": {"verifier": {"tensor_parallel_size": 2, "data_parallel_size": 1}, "trainer_gpus": 2},
    "speculator": {"type": "dflash", "block_size": 16, "num_layers": 5, "target_layer_ids": [2, 18, 33],
                   "max_anchors": 3072, "draft_vocab_size": 32000, "total_seq_len": 8192,
                   "epochs": 3, "lr": 0.001, "scheduler": "cosine", "seed": 42},
    "verifier_info": {"reference": "Qwen/Qwen3-8B", "source": "hub", "num_hidden_layers": 36,
                      "hidden_size": 4096, "vocab_size": 151936, "dtype": "bfloat16"},
    "publish": None,
    "metadata": {},
}
SPEC = JobSpec.load(ROW)  # what the worker reads of such a row
PATHS = JobPaths(root=Path("/w/job"), hidden_states=Path("/w/job/hidden_states"),
                 data=Path("/w/job/data"), checkpoints=Path("/w/job/checkpoints"),
                 log=Path("/l/job.log"), regenerated=Path("/w/job/regenerated.jsonl"))


def flag(argv: list[str], name: str, count: int = 1) -> list[str] | str:
    i = argv.index(name)
    values = argv[i + 1:i + 1 + count]
    return values[0] if count == 1 else values


def spec(**changes) -> JobSpec:
    return JobSpec.load({**ROW, **changes})


def test_vllm_hidden_states_server() -> None:
    server = build_plan(SPEC, PATHS, port=8123).stage("starting_verifier")
    argv = server.argv
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert flag(argv, "--port") == "8123"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--data-parallel-size") == "1"
    speculative = json.loads(flag(argv, "--speculative-config"))
    assert speculative == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                           "draft_model_config": {"hf_config": {
                               "eagle_aux_hidden_state_layer_ids": [2, 18, 33, 36]}}}
    kv = json.loads(flag(argv, "--kv-transfer-config"))
    assert kv == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": "/w/job/hidden_states"}}
    assert server.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # prepare-data's --render-endpoint posts to /v1/chat/completions/render: 403 without it.
    assert "--enable-scale-out" in argv


def test_vllm_data_prep_uses_the_servers_renderer() -> None:
    argv = build_plan(SPEC, PATHS, port=8123).stage("preparing_data").argv
    assert argv[1:4] == ["-m", "speculators", "prepare-data"]
    assert flag(argv, "--model") == "Qwen/Qwen3-8B"
    assert flag(argv, "--data") == "/data/chat.jsonl"
    assert flag(argv, "--output") == "/w/job/data"
    assert flag(argv, "--seq-length") == "8192"
    assert flag(argv, "--render-endpoint") == "http://127.0.0.1:8123"
    assert "--no-skip-token-freq" in argv


def test_vllm_trainer_under_torchrun() -> None:
    plan = build_plan(SPEC, PATHS, port=8123)
    trainer = plan.stage("training")
    argv = trainer.argv
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    assert argv[6] == "speculators.train"
    assert flag(argv, "--verifier-name-or-path") == "Qwen/Qwen3-8B"
    assert flag(argv, "--speculator-type") == "dflash"
    assert flag(argv, "--vllm-endpoint") == "http://127.0.0.1:8123/v1"
    assert flag(argv, "--on-missing") == "generate"
    assert flag(argv, "--save-path") == "/w/job/checkpoints"
    assert flag(argv, "--data-path") == "/w/job/data"
    # The trainer gets the server's ids minus the appended last layer.
    assert flag(argv, "--target-layer-ids", 3) == ["2", "18", "33"]
    assert plan.server_layer_ids[:-1] == [int(i) for i in flag(argv, "--target-layer-ids", 3)]
    for name, value in [("--num-layers", "5"), ("--block-size", "16"), ("--max-anchors", "3072"),
                        ("--draft-vocab-size", "32000"), ("--total-seq-len", "8192"),
                        ("--epochs", "3"), ("--lr", "0.001"), ("--scheduler-type", "cosine"),
                        ("--seed", "42")]:
        assert flag(argv, name) == value, name
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert trainer.env["COLUMNS"] == "1000"


@pytest.mark.parametrize("tp, dp, trainer_gpus", [(1, 1, 1), (2, 2, 4), (4, 1, 3), (1, 8, 1)])
def test_verifier_and_trainer_gpus_never_overlap(tp: int, dp: int, trainer_gpus: int) -> None:
    plan = build_plan(spec(resources={"verifier": {"tensor_parallel_size": tp, "data_parallel_size": dp},
                                      "trainer_gpus": trainer_gpus}), PATHS, port=1)
    verifier = set(plan.stage("starting_verifier").env["CUDA_VISIBLE_DEVICES"].split(","))
    trainer = set(plan.stage("training").env["CUDA_VISIBLE_DEVICES"].split(","))
    assert len(verifier) == tp * dp and len(trainer) == trainer_gpus
    assert not verifier & trainer
    assert f"--nproc_per_node={trainer_gpus}" in plan.stage("training").argv


def test_one_gpu_shared_by_the_verifier_and_the_trainer_splits_its_memory() -> None:
    """resources.share_verifier_gpus: the trainer runs on the verifier's first GPUs (the
    scheduler gave it none of its own) and the hidden-states server leaves it room."""
    shared = spec(resources={"verifier": {"tensor_parallel_size": 2, "data_parallel_size": 1},
                             "trainer_gpus": 1, "share_verifier_gpus": True})
    plan = build_plan(shared, PATHS, port=1, gpus=([3, 5], []))
    server, trainer = plan.stage("starting_verifier"), plan.stage("training")
    assert server.env["CUDA_VISIBLE_DEVICES"] == "3,5" and trainer.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "--nproc_per_node=1" in trainer.argv and plan.trainer_gpus == [3]
    assert float(flag(server.argv, "--gpu-memory-utilization")) < 0.5
    assert float(flag(build_plan(SPEC, PATHS, port=1).stage("starting_verifier").argv,
                      "--gpu-memory-utilization")) > 0.5


def test_a_shared_trainer_cannot_have_more_gpus_than_the_verifier() -> None:
    from pydantic import ValidationError

    from app.schemas.jobs import Resources

    assert Resources(trainer_gpus=2, share_verifier_gpus=True,
                     verifier={"tensor_parallel_size": 2}).trainer_gpus == 2
    with pytest.raises(ValidationError, match="trainer_gpus must be at most 1"):
        Resources(trainer_gpus=2, share_verifier_gpus=True)


def test_explicit_gpu_assignment_is_used() -> None:
    plan = build_plan(SPEC, PATHS, port=1, gpus=([4, 5], [6, 7]))
    assert plan.stage("starting_verifier").env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert plan.stage("training").env["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_a_job_runs_on_the_gpus_the_scheduler_allocated() -> None:
    """The worker gets the job's allocation with its spec (workers/tasks.py); every stage,
    evaluation included, runs on those GPUs, not on the default 0..n."""
    from workers.pipeline.verifier import allocated_gpus

    placed = spec(allocation={"verifier": [4, 5], "trainer": [6, 7]})
    plan = build_plan(placed, PATHS, port=1, gpus=allocated_gpus(placed))
    env = {s.stage: s.env.get("CUDA_VISIBLE_DEVICES") for s in plan.stages}
    assert env["starting_verifier"] == "4,5" and env["training"] == "6,7"
    assert env["evaluating"] == "4,5"
    assert allocated_gpus(spec(allocation=None)) is None
    assert allocated_gpus(spec(allocation={"slot": [0]})) is None  # the local runtime's CPU slot


@pytest.mark.parametrize("mode, on_missing, offline_step", [
    ("online", "generate", False), ("offline", "raise", True), ("hybrid", "generate", True)])
def test_mode_mapping(mode: str, on_missing: str, offline_step: bool) -> None:
    plan = build_plan(spec(mode=mode), PATHS, port=9)
    argvs = [s.argv for s in plan.stages]
    assert any("generate-offline-data" in a for a in argvs) == offline_step
    assert flag(plan.stage("training").argv, "--on-missing") == on_missing


def test_local_runtime_runs_vllms_cpu_wheel_and_the_cpu_trainer() -> None:
    local = build_plan(spec(runtime="local", resources={"verifier": {"tensor_parallel_size": 1,
                       "data_parallel_size": 1}, "trainer_gpus": 2}), PATHS, port=7)
    gpu = build_plan(SPEC, PATHS, port=7).stage("starting_verifier")
    server = local.stage("starting_verifier")
    assert server.argv[1:4] == ["-m", "workers.runtimes.local.serve", "--model"]
    # The same server as on a GPU host (layers, renderer route), with CPU device flags and the
    # CPU connector.
    for name in ("--speculative-config", "--port"):
        assert flag(server.argv, name) == flag(gpu.argv, name)
    assert "--enable-scale-out" in server.argv
    assert {"--enforce-eager", "--no-enable-prefix-caching"} <= set(server.argv)
    assert flag(server.argv, "--dtype") == "float32"  # what the CPU trainer reads
    assert "--tensor-parallel-size" not in server.argv and "--gpu-memory-utilization" not in server.argv
    kv = json.loads(flag(server.argv, "--kv-transfer-config"))
    assert kv == {"kv_connector": "CPUHiddenStatesConnector",
                  "kv_connector_module_path": "workers.runtimes.local.hidden_states_connector",
                  "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": "/w/job/hidden_states"}}
    assert flag(server.argv, "--kv-cache-memory-bytes") == str(get_settings().local_kv_cache_bytes)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server.env  # it would override the flag, in whole GiB
    plan = local
    trainer = plan.stage("training").argv
    assert "workers.runtimes.local.train" in trainer and "--nproc_per_node=2" in trainer
    assert flag(trainer, "--draft-attn-impl") == "sdpa"
    assert flag(trainer, "--loss-implementation") == "eager"
    assert all(s.env["CUDA_VISIBLE_DEVICES"] == "" for s in plan.stages)
    # Every process of a local job, and a local deployment's engine, waits without spinning:
    # they share the host's cores.
    served = serve_command(ServeSpec(verifier="demo", drafter="/w/job/checkpoints/2",
                                     num_speculative_tokens=15, runtime="local"),
                           "demo", port=8000, host="127.0.0.1", gpus=[], api_key="k")
    assert all(s.env["OMP_WAIT_POLICY"] == "PASSIVE" for s in [*plan.stages, served])
    assert "OMP_WAIT_POLICY" not in build_plan(SPEC, PATHS, port=7).stage("training").env


@pytest.mark.parametrize("threads", [None, 1, 3])
def test_the_local_runtimes_threads_are_the_hosts_setting(monkeypatch: pytest.MonkeyPatch,
                                                          threads: int | None) -> None:
    """SPECDECK_LOCAL_THREADS sets OMP_NUM_THREADS for every process of a local job and a local
    engine; unset, they keep torch's default and a one-process trainer 2 threads. A trainer of
    several processes has one each."""
    from app.settings import get_settings

    if threads is None:
        monkeypatch.delenv("SPECDECK_LOCAL_THREADS", raising=False)
    else:
        monkeypatch.setenv("SPECDECK_LOCAL_THREADS", str(threads))
    get_settings.cache_clear()
    try:
        def local(trainer_gpus: int):
            return build_plan(spec(runtime="local", resources={
                "verifier": {"tensor_parallel_size": 1, "data_parallel_size": 1},
                "trainer_gpus": trainer_gpus}), PATHS, port=7)

        served = serve_command(ServeSpec(verifier="demo", drafter="/w/job/checkpoints/2",
                                         num_speculative_tokens=15, runtime="local"),
                               "demo", port=8000, host="127.0.0.1", gpus=[], api_key="k")
        plan = local(1)
        others = [s for s in plan.stages if s.stage != "training"]
        assert [s.env.get("OMP_NUM_THREADS") for s in [*others, served]] == \
            [None if threads is None else str(threads)] * (len(others) + 1)
        assert plan.stage("training").env["OMP_NUM_THREADS"] == str(threads or 2)
        assert local(2).stage("training").env["OMP_NUM_THREADS"] == "1"
        assert "OMP_NUM_THREADS" not in build_plan(SPEC, PATHS, port=7).stage("starting_verifier").env
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize("code, log, kind", [
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    (-9, "step 12", "host_oom_killed"),
    (137, "", "host_oom_killed"),
    (1, "json.decoder.JSONDecodeError: Expecting value: line 1 column 1", "data_error"),
    (2, "pydantic_core._pydantic_core.ValidationError: 1 validation error for TrainConfig", "bad_configuration"),
    (1, "RuntimeError: something else", "process_failed"),
])
def test_failures_are_classified_from_the_exit_code_and_log(code: int, log: str, kind: str) -> None:
    from workers.runner import classify_failure

    assert classify_failure(code, log)[0] == kind


def test_a_resumed_regeneration_asks_only_for_the_conversations_left() -> None:
    """regenerate-responses skips the conversations already in its output without counting
    them against --limit: a resume after 12 of 50 asks for 38, so the total stays 50."""
    from app.runtimes import regenerate_argv

    job = spec(dataset_kind="upload", data={"regenerate": True, "max_samples": 50})
    assert flag(regenerate_argv(job, PATHS, "http://127.0.0.1:9"), "--limit") == "50"
    resumed = regenerate_argv(job, PATHS, "http://127.0.0.1:9", done=12)
    assert flag(resumed, "--limit") == "38" and "--resume" in resumed
    assert flag(regenerate_argv(job, PATHS, "http://127.0.0.1:9", done=50), "--limit") == "0"


@pytest.mark.parametrize("runtime", ["vllm", "local"])
def test_a_warm_start_loads_the_checkpoint_with_from_pretrained(runtime: str) -> None:
    """init_from: speculators' --from-pretrained with the checkpoint's path, and no
    --num-layers (speculators refuses decoder-shaping flags beside --from-pretrained); the
    block size and layer ids stay, equal to the checkpoint's."""
    warm = spec(runtime=runtime, init_from="ckpt_0123456789abcdef01234567",
                init_from_info={"checkpoint_id": "ckpt_0123456789abcdef01234567", "epoch": 1,
                                "job_id": "job_0123456789abcdef01234567", "path": "/w/old/checkpoints/1"})
    argv = build_plan(warm, PATHS, port=8123).stage("training").argv
    assert flag(argv, "--from-pretrained") == "/w/old/checkpoints/1"
    assert "--num-layers" not in argv
    assert flag(argv, "--block-size") == "16"
    assert flag(argv, "--target-layer-ids", 3) == ["2", "18", "33"]

    cold = build_plan(spec(runtime=runtime), PATHS, port=8123).stage("training").argv
    assert "--from-pretrained" not in cold and flag(cold, "--num-layers") == "5"


def test_a_worker_without_vllm_fails_local_jobs_and_deployments_with_one_clear_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU wheel is Linux x86_64 only: elsewhere a local job stops at preflight, and a
    local deployment gives up at once, saying what runs the local runtime."""
    from types import SimpleNamespace

    from app.runtimes.local import NO_VLLM
    from workers import deployments
    from workers.pipeline import preflight
    from workers.runner import StageFailed

    monkeypatch.setattr(preflight, "vllm_missing", lambda: NO_VLLM)
    monkeypatch.setattr(deployments, "vllm_missing", lambda: NO_VLLM)
    with pytest.raises(StageFailed) as failed:
        preflight.preflight(SimpleNamespace(spec=SimpleNamespace(runtime="local")))
    assert failed.value.code == "vllm_missing" and "worker-cpu" in str(failed.value)
    with pytest.raises(deployments.GaveUp, match="worker-cpu"):
        deployments.serve(SimpleNamespace(spec={"runtime": "local"}), "demo", "key", 0)
