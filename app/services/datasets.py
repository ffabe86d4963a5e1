"""Datasets: JSONL chat uploads (validated line by line while streaming, stored once per content)
and public presets that speculators resolves. Scoped to a project."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Dataset, Job
from app.errors import APIError, error_body, not_found
from app.schemas.common import text_problem
from app.schemas.datasets import NAME_MAX, DatasetOut
from app.services import quotas
from app.services.paths import resolve_under
from app.settings import Settings

log = logging.getLogger(__name__)

DATASET_ID = re.compile(r"^ds_[0-9a-f]{24}$")

# Defaults until app/settings.py has SPECDECK_MAX_DATASET_BYTES / _LINE_BYTES (read at call time).
DEFAULT_MAX_DATASET_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 1024 * 1024
MAX_ERRORS = 20
# A surrogate spelled as a JSON escape: only a line holding one can hold a lone one.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
CHUNK_BYTES = 1024 * 1024
# Room for the multipart framing around the file (boundaries, part headers, the name field).
MULTIPART_OVERHEAD_BYTES = 64 * 1024

ROLES = {"messages": frozenset({"system", "user", "assistant", "tool"}),
         "conversations": frozenset({"system", "human", "user", "gpt", "assistant", "tool"})}
ASSISTANT_ROLES = frozenset({"assistant", "gpt"})


def max_dataset_bytes(settings: Settings) -> int:
    return int(getattr(settings, "max_dataset_bytes", DEFAULT_MAX_DATASET_BYTES))


def max_line_bytes(settings: Settings) -> int:
    return int(getattr(settings, "max_dataset_line_bytes", DEFAULT_MAX_LINE_BYTES))


def max_upload_body_bytes(settings: Settings) -> int:
    """The request-body limit POST /api/datasets needs (the app's global one is far lower)."""
    return max_dataset_bytes(settings) + MULTIPART_OVERHEAD_BYTES


def datasets_dir(settings: Settings) -> Path:
    return settings.data_root.resolve() / "datasets"


class InvalidDataset(APIError):
    """A rejected upload: 422 ``invalid_dataset``, the first problem in ``message`` and up to
    MAX_ERRORS of them, each ``{"line": N, "message": ...}``, under ``error.errors``."""

    def __init__(self, errors: list[dict[str, Any]], *, stopped: bool = False) -> None:
        first = errors[0]
        where = f"line {first['line']}: " if first["line"] is not None else ""
        message = where + first["message"]
        if len(errors) > 1:
            message += (f" (and {len(errors) - 1} more problems"
                        f"{', stopped reading there' if stopped else ''}; see error.errors)")
        super().__init__(422, message, code="invalid_dataset", param="file")
        self.errors = errors

    def response(self) -> JSONResponse:
        body = error_body(self.status_code, self.message, code=self.code, param=self.param,
                          type=self.type)
        body["error"]["errors"] = self.errors
        return JSONResponse(body, status_code=self.status_code)


class _LineError(Exception):
    pass


# --- validation ---------------------------------------------------------------------------

def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) and p["text"].strip() for p in content)
    return False


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _LineError(f"{where} must be a string or a list of content parts, "
                         f"got {_json_type(content)}")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _LineError(f"{where}[{j}] must be an object with a string 'type'")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise _LineError(f"{where}[{j}] is a text part without a string 'text'")


def _check_turn(turn: Any, fmt: str, where: str) -> bool:
    """Check one turn; return whether it is an assistant turn with non-empty content."""
    if not isinstance(turn, dict):
        raise _LineError(f"{where} must be an object, got {_json_type(turn)}")
    # OpenAI turns are {role, content}; ShareGPT turns are {from, value}. speculators also
    # reads {role, content} turns under "conversations" (its own presets normalize to that).
    if fmt == "conversations" and "from" in turn:
        role_key, content_key = "from", "value"
    else:
        role_key, content_key = "role", "content"
    if role_key not in turn:
        expected = "'role'" if fmt == "messages" else "'from' (or 'role')"
        raise _LineError(f"{where} has no {expected}")
    role = turn[role_key]
    if role not in ROLES[fmt]:
        raise _LineError(f"{where}.{role_key} must be one of {', '.join(sorted(ROLES[fmt]))}, "
                         f"got {json.dumps(role)[:60]}")
    content = turn.get(content_key)
    if content is None:
        # An assistant turn that only calls tools has no content.
        if role in ASSISTANT_ROLES and turn.get("tool_calls"):
            return False
        raise _LineError(f"{where} has no '{content_key}'")
    _check_content(content, f"{where}.{content_key}")
    return role in ASSISTANT_ROLES and _has_text(content)


def check_record(record: Any) -> str:
    """Validate one parsed line; return its format ("messages" or "conversations")."""
    if not isinstance(record, dict):
        raise _LineError(f"expected a JSON object, got {_json_type(record)}")
    present = [k for k in ("messages", "conversations") if k in record]
    if len(present) == 2:
        raise _LineError("has both 'messages' and 'conversations'; use one")
    if not present:
        keys = ", ".join(sorted(record)[:8]) or "none"
        raise _LineError("expected a 'messages' (OpenAI) or 'conversations' (ShareGPT) list, "
                         f"got keys: {keys}")
    fmt = present[0]
    turns = record[fmt]
    if not isinstance(turns, list) or not turns:
        raise _LineError(f"'{fmt}' must be a non-empty list of turns")
    has_reply = False
    for i, turn in enumerate(turns):
        has_reply = _check_turn(turn, fmt, f"{fmt}[{i}]") or has_reply
    if not has_reply:
        raise _LineError("no assistant turn with non-empty content")
    return fmt


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


@dataclass
class _Scan:
    """The result of streaming one upload: hash, size, format, counts and problems."""

    max_line: int
    sha256: Any = field(default_factory=hashlib.sha256)
    num_bytes: int = 0
    num_conversations: int = 0
    format: str | None = None
    format_line: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)

    def line(self, lineno: int, raw: bytes | None) -> None:
        try:
            self._line(lineno, raw)
        except _LineError as exc:
            self.errors.append({"line": lineno, "message": str(exc)})

    def _line(self, lineno: int, raw: bytes | None) -> None:
        if raw is None:
            raise _LineError(f"line too long: over the {self.max_line}-byte limit per line")
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _LineError(f"not valid UTF-8 (byte {exc.start + 1})") from exc
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _LineError(f"invalid JSON: {exc.msg} (column {exc.colno})") from exc
        except RecursionError as exc:  # the parser's own bound on nesting (about 1,000 levels)
            raise _LineError("nested too deep: no conversation needs that many levels") from exc
        except ValueError as exc:  # a value json.loads cannot take: an integer past Python's
            # digit limit (sys.get_int_max_str_digits(), 4,300 by default), say
            raise _LineError(f"a value JSON allows but this reader cannot take: {exc}") from exc
        if SURROGATE_ESCAPE.search(raw) and (problem := text_problem(record)):
            raise _LineError(f"text {problem}")  # no tokenizer can read a lone surrogate
        if isinstance(record, dict) and self.format is not None:
            other = "conversations" if self.format == "messages" else "messages"
            if other in record and self.format not in record:
                raise _LineError(f"uses '{other}' but line {self.format_line} uses "
                                 f"'{self.format}'; a file must use one format")
        fmt = check_record(record)
        if self.format is None:
            self.format, self.format_line = fmt, lineno
        self.num_conversations += 1


def _lines(stream: IO[bytes], max_line: int, sink: Any) -> Iterator[tuple[int, bytes | None]]:
    """Read ``stream`` in chunks, hand each chunk to ``sink(chunk)``, and yield
    ``(line number, line)``; a line longer than ``max_line`` bytes is yielded as None
    (never held whole in memory)."""
    lineno = 0
    buf = bytearray()
    too_long = False
    while chunk := stream.read(CHUNK_BYTES):
        sink(chunk)
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end == -1 else chunk[start:end]
            if not too_long:
                if len(buf) + len(piece) > max_line:
                    too_long = True
                    buf.clear()
                else:
                    buf += piece
            if end == -1:
                break
            lineno += 1
            yield lineno, None if too_long else bytes(buf).rstrip(b"\r")
            buf.clear()
            too_long = False
            start = end + 1
    if buf or too_long:
        yield lineno + 1, None if too_long else bytes(buf).rstrip(b"\r")


def scan_upload(stream: IO[bytes], out: IO[bytes], *, max_bytes: int, max_line: int) -> _Scan:
    """Copy ``stream`` to ``out`` while hashing and validating it line by line.

    Raises 413 ``dataset_too_large`` as soon as more than ``max_bytes`` arrived, and
    InvalidDataset for bad content (stopping after MAX_ERRORS problems).
    """
    scan = _Scan(max_line=max_line)

    def sink(chunk: bytes) -> None:
        scan.num_bytes += len(chunk)
        if scan.num_bytes > max_bytes:
            raise APIError(413, f"the dataset is larger than the {max_bytes}-byte limit",
                           code="dataset_too_large", param="file")
        scan.sha256.update(chunk)
        out.write(chunk)

    for lineno, raw in _lines(stream, max_line, sink):
        scan.line(lineno, raw)
        if len(scan.errors) >= MAX_ERRORS:
            raise InvalidDataset(scan.errors, stopped=True)
    if scan.errors:
        raise InvalidDataset(scan.errors)
    if scan.num_conversations == 0:
        raise InvalidDataset([{"line": None, "message": "the file contains no conversations"}])
    return scan


# --- create, read, delete -----------------------------------------------------------------

def create_upload(session: Session, project_id: str, stream: IO[bytes], *, filename: str | None,
                  name: str | None, settings: Settings) -> tuple[Dataset, bool]:
    """Validate and store an upload; return ``(dataset, created)``. The same content uploaded
    again to the same project returns the existing dataset. Nothing is kept on rejection."""
    directory = datasets_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".upload-{os.urandom(8).hex()}.part"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as out:
            scan = scan_upload(stream, out, max_bytes=max_dataset_bytes(settings),
                               max_line=max_line_bytes(settings))
            out.flush()
            os.fsync(out.fileno())
        digest = scan.sha256.hexdigest()
        existing = _by_sha256(session, project_id, digest)
        if existing is not None:
            _restore_file(tmp, existing)
            return existing, False
        quotas.check_dataset_bytes(session, project_id, scan.num_bytes, settings)
        final = directory / f"{digest}.jsonl"
        os.replace(tmp, final)  # atomic; identical content if another project stored it first
        dataset = Dataset(project_id=project_id, kind="upload",
                          name=_default_name(name, filename, digest),
                          format=scan.format, sha256=digest, path=str(final),
                          num_conversations=scan.num_conversations, num_bytes=scan.num_bytes)
        return _insert_once(session, dataset, lambda: _by_sha256(session, project_id, digest))
    finally:
        tmp.unlink(missing_ok=True)


def _restore_file(tmp: Path, dataset: Dataset) -> None:
    """A re-upload puts back the stored file of an existing dataset if it went missing."""
    path = Path(dataset.path or "")
    if dataset.path and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)


def _default_name(name: str | None, filename: str | None, digest: str) -> str:
    if name is not None:
        return name
    base = Path(filename or "").name.strip()
    return (base or f"{digest[:12]}.jsonl")[:NAME_MAX]


def create_public(session: Session, project_id: str, public_name: str,
                  name: str | None) -> tuple[Dataset, bool]:
    """Register a public preset; registering the same preset again returns the existing one."""
    existing = _by_public_name(session, project_id, public_name)
    if existing is not None:
        return existing, False
    dataset = Dataset(project_id=project_id, kind="public", name=name or public_name,
                      public_name=public_name)
    return _insert_once(session, dataset,
                        lambda: _by_public_name(session, project_id, public_name))


def _insert_once(session: Session, dataset: Dataset,
                 existing: Callable[[], Dataset | None]) -> tuple[Dataset, bool]:
    """Insert ``dataset``; if a concurrent request stored the same one first (the unique key
    says so), return that one instead: ``(dataset, created)``."""
    try:
        with session.begin_nested():
            session.add(dataset)
            session.flush()
    except IntegrityError:
        winner = existing()
        if winner is None:
            raise
        return winner, False
    return dataset, True


def _by_sha256(session: Session, project_id: str, digest: str) -> Dataset | None:
    return session.scalars(select(Dataset).where(Dataset.project_id == project_id,
                                                 Dataset.sha256 == digest)).first()


def _by_public_name(session: Session, project_id: str, public_name: str) -> Dataset | None:
    return session.scalars(select(Dataset).where(Dataset.project_id == project_id,
                                                 Dataset.public_name == public_name)).first()


def get_dataset(session: Session, project_id: str, dataset_id: str, *,
                lock: bool = False) -> Dataset:
    query = select(Dataset).where(Dataset.id == dataset_id, Dataset.project_id == project_id)
    if lock:
        query = query.with_for_update()
    dataset = session.scalars(query).first()
    if dataset is None:
        raise not_found("dataset", dataset_id)
    return dataset


def list_datasets(session: Session, project_id: str, *, limit: int,
                  after: str | None) -> tuple[list[Dataset], bool]:
    query = select(Dataset).where(Dataset.project_id == project_id)
    if after is not None:
        query = query.where(Dataset.id < after)
    rows = list(session.scalars(query.order_by(Dataset.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_dataset(session: Session, project_id: str, dataset_id: str) -> None:
    """Delete a dataset no job of its project references; its file goes after the commit when
    no other dataset (of any project) has the same content."""
    # The row lock makes a concurrent job creation (resolve_for_job: FOR SHARE) wait, or wait
    # for us; either way no job ends up with a deleted dataset. SQLite serializes writers.
    dataset = get_dataset(session, project_id, dataset_id, lock=True)
    job_id = session.scalars(select(Job.id).where(
        Job.project_id == project_id, Job.spec["dataset_id"].as_string() == dataset.id,
    ).order_by(Job.id).limit(1)).first()
    if job_id is not None:
        raise APIError(409, f"dataset {dataset.id} is used by job {job_id}; it cannot be deleted",
                       code="dataset_in_use")
    session.delete(dataset)
    session.flush()
    if dataset.kind == "upload" and dataset.path:
        shared = session.scalar(select(func.count()).select_from(Dataset)
                                .where(Dataset.sha256 == dataset.sha256))
        if not shared:
            path = Path(dataset.path)
            after_commit(session, lambda: _remove_file(path))


def _remove_file(path: Path) -> None:
    """Runs after the commit: the row is gone, so a failure here only leaves an orphan file."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        log.exception("could not remove the file of a deleted dataset: %s", path)


def resolve_for_job(session: Session, project_id: str, ref: str,
                    settings: Settings) -> dict[str, Any]:
    """What a job records about its dataset: ``dataset_id``, ``dataset_path`` (an absolute path,
    or the public preset name; none for a capture, which the worker writes out) and
    ``dataset_kind`` ("upload", "public", "capture", or "path" for a file named directly under
    the data root)."""
    if DATASET_ID.match(ref):
        dataset = session.scalars(
            select(Dataset).where(Dataset.id == ref, Dataset.project_id == project_id)
            .with_for_update(read=True)).first()
        if dataset is None:
            raise APIError(422, f"no dataset with id '{ref}'", code="dataset_not_found",
                           param="dataset")
        if dataset.kind == "public":
            return {"dataset_id": dataset.id, "dataset_path": dataset.public_name,
                    "dataset_kind": "public"}
        if dataset.kind == "capture":  # the worker writes its rows into the job's work dir
            if not dataset.num_conversations:
                raise APIError(422, f"dataset {dataset.id} has captured no rows yet",
                               code="dataset_empty", param="dataset")
            return {"dataset_id": dataset.id, "dataset_path": None, "dataset_kind": "capture",
                    "dataset_format": "messages"}
        if not Path(dataset.path or "").is_file():
            raise APIError(422, f"the file of dataset {dataset.id} is missing from the data root; "
                           "upload it again", code="dataset_not_found", param="dataset")
        return {"dataset_id": dataset.id, "dataset_path": dataset.path, "dataset_kind": "upload",
                "dataset_format": dataset.format}
    path = resolve_under(settings.data_root, ref, param="dataset", what="data")
    if path.is_relative_to(datasets_dir(settings)):  # the upload store, shared by every project
        # The same answer whether the file is there or not: no project learns of another's.
        raise APIError(422, f"dataset '{ref}' is in the upload store: refer to an upload by its "
                       "dataset id (ds_...)", code="invalid_path", param="dataset")
    if not path.is_file():
        raise APIError(422, f"dataset '{ref}' not found under the data root",
                       code="dataset_not_found", param="dataset")
    return {"dataset_id": None, "dataset_path": str(path), "dataset_kind": "path",
            "dataset_format": sniff_format(path)}


def sniff_format(path: Path) -> str | None:
    """``messages`` or ``conversations``, from the first non-blank line of a JSONL file."""
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except (ValueError, RecursionError):
                    return None
                if isinstance(first, dict):
                    return "messages" if "messages" in first else "conversations"
                return None
    return None


def dataset_out(dataset: Dataset) -> DatasetOut:
    from app.services.capture import capture_out  # it validates rows with check_record

    fields = {name: getattr(dataset, name) for name in DatasetOut.model_fields
              if name not in ("object", "capture")}
    return DatasetOut(**fields, capture=capture_out(dataset))
