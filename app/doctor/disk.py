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
    return [disk_row(root.resolve(), shutil.disk_usage(existing(root)).free, runtime),
            *privacy_checks()]


def open_to_others(path: Path) -> list[str]:
    """The path and the files right under it that its group or others may read or enter."""
    found = []
    for item in [path, *(path.iterdir() if path.is_dir() else [])]:
        if item.exists() and not item.is_symlink() and item.stat().st_mode & 0o077:
            found.append(f"{item} ({oct(item.stat().st_mode & 0o777)[2:]})")
    return found


def privacy_checks() -> list[Check]:
    """The server's data directories (the embedded database's, the data, logs and work roots)
    hold the key hashes, the encrypted HF token and the development key: made private (0700,
    files 0600) since 2026-12-07; one made before, or loosened since, is a warning."""
    settings = get_settings()
    dirs = {settings.data_root, settings.logs_root, settings.work_root}
    for url in (settings.database_url, settings.broker_url):
        if "sqlite:///" in url:
            dirs.add(Path(url.split("sqlite:///", 1)[1]).parent)
    open_ = sorted({entry for d in dirs for entry in open_to_others(d.resolve())})
    if not open_:
        return [Check("disk", "private data", True, "the data directories are their owner's "
                      "alone", required=False)]
    shown = ", ".join(open_[:3]) + (f" and {len(open_) - 3} more" if len(open_) > 3 else "")
    return [Check("disk", "private data", False, f"readable by others: {shown}; "
                  "chmod -R go-rwx them (they hold key hashes and the encrypted HF token)",
                  required=False)]
