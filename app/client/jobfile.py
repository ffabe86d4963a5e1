"""A job file (JSON or YAML, the body of ``POST /api/jobs``) and the Idempotency-Key a create
sends with it."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from app.client import exits
from app.client.exits import CLIError

AUTO = "auto"


def load_job_file(path: Path, what: str = "job") -> dict[str, Any]:
    """The ``what``'s body in ``path`` (a job's, a retrain's): JSON for .json, YAML otherwise
    (YAML reads JSON too)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CLIError(exits.USAGE, f"cannot read the {what} file: {exc}") from exc
    try:
        body = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise CLIError(exits.USAGE, f"{path} is not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(body, dict):
        raise CLIError(exits.USAGE, f"{path} must hold an object (the {what}'s fields)")
    return body


def _file_digest(digest: "hashlib._Hash", path: Path) -> None:
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)


def fresh_key() -> str:
    """A key of this invocation's own: its retries reuse it, a new invocation makes a new one."""
    return f"cli-{uuid.uuid4().hex}"


def idempotency_key(given: str | None, job_file: Path, dataset_file: Path | None) -> str:
    """The key a create sends. Given: as is; "auto": derived from the content of the job file and
    the dataset file, so the same files make the same job (a re-run of a pipeline replays it);
    none: a new one for this invocation, so that its own retries cannot create the job twice."""
    if given is None:
        return fresh_key()
    if given != AUTO:
        return given
    digest = hashlib.sha256(b"specdeck job file\0")
    _file_digest(digest, job_file)
    digest.update(b"\0dataset file\0")
    if dataset_file is not None:
        _file_digest(digest, dataset_file)
    return f"auto-{digest.hexdigest()[:48]}"
