"""Preflight: estimate memory and disk before anything starts, and fail early with a reason."""

from __future__ import annotations

import shutil
from pathlib import Path
from app.runtimes import JobPaths, dataset_file
from app.runtimes.local import vllm_missing
from app.schemas.job_spec import JobSpec, VerifierInfo
from workers.pipeline.data import write_captured
from workers.runner import JobContext, StageFailed

BYTES_PER_TOKEN_OF_TEXT = 4  # a rough tokenizer ratio, to size hidden states before data prep
GIB = 2**30


def verifier_params(info: VerifierInfo) -> int:
    """A decoder-only transformer: embeddings + head + ~12 H^2 per layer."""
    h, layers, vocab = info.hidden_size, info.num_hidden_layers, info.vocab_size
    return 2 * vocab * h + 12 * h * h * layers


def source_data(spec: JobSpec, paths: JobPaths) -> Path:
    """The file the job's data comes from: the verifier's regenerated rows when it regenerates
    (a public preset's ``dataset_path`` is only the preset's name), else the upload."""
    return paths.regenerated if spec.data.regenerate else dataset_file(spec, paths)


def estimates(spec: JobSpec, data: Path) -> dict[str, float]:
    info = spec.verifier_info
    dataset_bytes = data.stat().st_size if data.exists() else 0
    tokens = dataset_bytes / BYTES_PER_TOKEN_OF_TEXT
    value_bytes = 2 if spec.runtime == "vllm" else 4
    per_token = len(spec.server_layer_ids) * info.hidden_size * value_bytes
    h = info.hidden_size
    # The largest candidate's draft (one trains at a time on a set of GPUs).
    draft_params = max(d.num_layers for d in spec.drafters) * 12 * h * h + 3 * h * h
    return {
        # offline/hybrid keep every sample's hidden states; online keeps a few in flight.
        "hidden_states_disk_gib": (tokens if spec.mode != "online" else spec.total_seq_len * 64)
        * per_token / GIB,
        "verifier_gpu_memory_gib_per_gpu":
            verifier_params(info) * 2 / spec.resources.verifier.tensor_parallel_size / GIB,
        # fp32 master weights + Adam/Muon state (~16 bytes/param) + the verifier's embeddings
        # and head in bf16, which the draft reloads.
        "trainer_gpu_memory_gib_per_gpu": (draft_params * 16 + 2 * info.vocab_size * h * 2) / GIB,
    }


def preflight(ctx: JobContext[JobSpec]) -> None:
    spec = ctx.spec
    if spec.runtime == "local" and (missing := vllm_missing()):
        raise StageFailed(missing, code="vllm_missing")
    write_captured(ctx)
    data = source_data(spec, ctx.paths)
    if not data.is_file():
        raise StageFailed(f"dataset file {data} is gone", code="data_error")
    figures = estimates(spec, data)
    ctx.paths.root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(ctx.paths.root).free / GIB
    ctx.event("preflight", "resources estimated", {**{k: round(v, 3) for k, v in figures.items()},
                                                   "free_disk_gib": round(free, 1)})
    if figures["hidden_states_disk_gib"] > free:
        raise StageFailed(f"needs ~{figures['hidden_states_disk_gib']:.1f} GiB of disk for hidden "
                          f"states, {free:.1f} GiB free under {ctx.paths.root}",
                          code="insufficient_disk")
    if spec.runtime == "vllm":
        check_gpu_memory(ctx, figures)


def check_gpu_memory(ctx: JobContext[JobSpec], figures: dict[str, float]) -> None:
    import pynvml

    plan_gpus = ctx.spec.allocation or {}
    pynvml.nvmlInit()
    try:
        for role, key in (("verifier", "verifier_gpu_memory_gib_per_gpu"),
                          ("trainer", "trainer_gpu_memory_gib_per_gpu")):
            for index in plan_gpus.get(role, []):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                free = pynvml.nvmlDeviceGetMemoryInfo(handle).free / GIB
                if free < figures[key]:
                    raise StageFailed(f"GPU {index} ({role}) has {free:.1f} GiB free; needs "
                                      f"~{figures[key]:.1f} GiB", code="insufficient_gpu_memory")
    finally:
        pynvml.nvmlShutdown()
