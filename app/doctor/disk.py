"""The doctor's disk row: free space under the work root (SPECDECK_WORK_ROOT), where a job's
hidden states and epoch checkpoints go.

The floors are orders of magnitude, not estimates of a given job: on a GPU host one epoch
checkpoint of a drafter for an 8B verifier, with its optimizer state, is gigabytes, 20 epochs
are kept, and offline or hybrid data caches every sample's hidden states (about 1 MB per 100
tokens, dflash-facts.md §2); the local runtime's demo needs megabytes."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.doctor.report import Check
from app.settings import get_settings

GIB = 2**30
MIN_FREE_GIB = {"local": 1, "vllm": 50}


def disk_row(path: Path, free_bytes: int, runtime: str) -> Check:
    floor = MIN_FREE_GIB[runtime]
    ok = free_bytes >= floor * GIB
    detail = f"{free_bytes / GIB:.1f} GiB free under {path}"
    return Check("disk", "work root", ok, detail if ok else f"{detail}, needs {floor} GiB")


def existing(path: Path) -> Path:
    """The path, or its nearest ancestor that exists (the work root is made when a worker
    starts): the file system it will be on."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def disk_checks(runtime: str) -> list[Check]:
    root = get_settings().work_root
    return [disk_row(root.resolve(), shutil.disk_usage(existing(root)).free, runtime)]
