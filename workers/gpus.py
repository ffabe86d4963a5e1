"""Which GPUs this host offers: the SPECDECK_WORKER_GPUS override, else NVML, else none."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def detect_gpus(override: str | None) -> list[dict[str, Any]]:
    if override is not None:
        return [{"index": int(i), "name": "configured", "memory_total_mib": None}
                for i in override.split(",") if i.strip()]
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no NVIDIA driver (%s): this worker offers no GPUs", exc)
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append({"index": index, "name": name if isinstance(name, str) else name.decode(),
                         "memory_total_mib": memory.total // 2**20})
        return gpus
    finally:
        pynvml.nvmlShutdown()
