"""The session's demo verifier and data, kept between test runs.

Making them trains the demo verifier and generates its conversations: about a minute and a half
of CPU on 2 cores, the same bytes every time (tests/local_runtime/test_local_demo.py checks that
the model is deterministic). So a run keeps them under the user's cache directory, keyed by
everything that decides those bytes: the demo module's source and the versions of torch,
transformers and tokenizers. Any change to one of them makes them again. Each run works on its
own copy, so no test can change what the next run gets. Processes that need them at once
(pytest-xdist's workers) take turns under a file lock: one makes them, the others copy them.

SPECDECK_TEST_CACHE names another directory; ``off`` makes them afresh in every run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from importlib.metadata import version
from pathlib import Path

MODEL, DATA = "demo", "demo.jsonl"


def cache_root() -> Path | None:
    setting = os.environ.get("SPECDECK_TEST_CACHE", "")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdeck-tests"


def assets_key() -> str:
    from workers.runtimes.local import demo

    digest = hashlib.sha256(Path(demo.__file__).read_bytes())
    for package in ("torch", "transformers", "tokenizers"):
        digest.update(f"\0{package}=={version(package)}".encode())
    return digest.hexdigest()[:16]


def make(directory: Path) -> tuple[Path, Path]:
    from workers.runtimes.local.demo import create_demo_model, write_demo_data

    model = create_demo_model(directory / MODEL)
    return model, write_demo_data(model, directory / DATA)


def complete(directory: Path) -> bool:
    from workers.runtimes.local.demo import demo_model_is_valid

    return demo_model_is_valid(directory / MODEL) and (directory / DATA).is_file()


def cached_demo_assets(target: Path) -> tuple[Path, Path]:
    """The demo model and data under ``target``: copied from the cache when it has them, else
    made there (and then stored in the cache, whole or not at all)."""
    root = cache_root()
    if root is None:
        return make(target)
    cached = root / f"demo-{assets_key()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = (root / f".{cached.name}.lock").open("w")
    except OSError:
        return make(target)  # no cache here (a read-only home): the run goes on without one
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if complete(cached):
            shutil.copytree(cached, target, dirs_exist_ok=True)
            return target / MODEL, target / DATA
        assets = make(target)
        staging = root / f".staging-{uuid.uuid4().hex}"
        try:
            shutil.copytree(target, staging)
            staging.rename(cached)  # atomic, so a run that was killed leaves no half a copy
        except OSError:
            pass  # no cache this time (a full disk): the run goes on
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return assets
