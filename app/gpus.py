"""Which GPUs this host offers: the SPECDECK_WORKER_GPUS override, else NVML, else none.

``read_nvml`` is the one place NVML is asked; the worker registers what it finds, and
`specdeck doctor` reports it (app/doctor/gpus.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_mib: int
    memory_free_mib: int


@dataclass(frozen=True)
class Nvml:
    """What NVML says about this host: the driver and the GPUs, or why it could not say."""

    gpus: list[Gpu] = field(default_factory=list)
    driver: str | None = None
    error: str | None = None  # "nvidia-ml-py is not installed", "no NVIDIA driver: ..."


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def read_nvml() -> Nvml:
    try:
        import pynvml
    except ImportError:
        return Nvml(error="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Nvml(error=f"no NVIDIA driver: {exc}")
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)),
                            memory_total_mib=memory.total // 2**20,
                            memory_free_mib=memory.free // 2**20))
        return Nvml(gpus=gpus, driver=_text(pynvml.nvmlSystemGetDriverVersion()))
    finally:
        pynvml.nvmlShutdown()


def detect_gpus(override: str | None) -> list[dict[str, Any]]:
    if override is not None:
        return [{"index": int(i), "name": "configured", "memory_total_mib": None}
                for i in override.split(",") if i.strip()]
    nvml = read_nvml()
    if nvml.error:
        log.info("%s: this worker offers no GPUs", nvml.error)
    return [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib}
            for g in nvml.gpus]
