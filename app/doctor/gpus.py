"""The doctor's GPU rows, from NVML (app/gpus.py, as the worker registers them): how many,
the driver, and each GPU's free memory. The vllm runtime needs at least one; the local runtime
runs on the CPU and only reports them."""

from __future__ import annotations

from app.doctor.report import Check
from app.gpus import Nvml, read_nvml
from app.runtimes.vllm import GPU_MEMORY_UTILIZATION


def gpu_rows(nvml: Nvml, runtime: str) -> list[Check]:
    required = runtime == "vllm"
    if not nvml.gpus:
        why = nvml.error or "NVML lists none"
        return [Check("gpus", "GPUs", False if required else None, f"no GPU ({why})", required)]
    rows = [Check("gpus", "GPUs", True, f"{len(nvml.gpus)}, driver {nvml.driver}", required)]
    # A job's hidden-states server asks vLLM for this share of its GPU's memory: a GPU that
    # something else already holds will not start it.
    share = float(GPU_MEMORY_UTILIZATION)
    for gpu in nvml.gpus:
        ok = gpu.memory_free_mib >= share * gpu.memory_total_mib
        rows.append(Check("gpus", f"GPU {gpu.index}", ok,
                          f"{gpu.name}: {gpu.memory_free_mib / 1024:.1f} GiB free of "
                          f"{gpu.memory_total_mib / 1024:.1f} GiB"
                          + ("" if ok else f" (vLLM asks for {share:.0%} of it)"), False))
    return rows


def gpu_checks(runtime: str) -> list[Check]:
    return gpu_rows(read_nvml(), runtime)
