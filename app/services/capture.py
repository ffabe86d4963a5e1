"""Traffic capture (opt-in per deployment): the gateway records a sample of a deployment's
requests, each as ``{"messages": [... the request's messages, the assistant's reply]}``, into a
project dataset of kind "capture", Fernet-encrypted at rest (the key of app/services/secrets.py).

* ``start``: the dataset a deployment captures into (a new one, or the one its name captured
  into before), with the settings of its ``capture`` option.
* ``Sampled`` and ``store``: what the gateway queues on the request path (references only: the
  parsed request messages and the response bytes or forwarded SSE chunks), and what its
  background writer does with a batch: assemble the reply, drop unfinished or unusable ones,
  encrypt, insert within the dataset's limits, and count drops.
* ``purge_expired``: retention, run by the workers' reconciler.
* ``export_jsonl``: the decrypted rows as JSONL, for a job's data stage.

Every change to a capture's rows and counters happens under its dataset's row lock, which is
also what ``DELETE /api/datasets/{id}`` takes first; the rows go with the dataset (FK cascade).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.fernet import InvalidToken, MultiFernet
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.db.models import Capture, CapturedRow, Dataset, Deployment, utcnow
from app.schemas.capture import CaptureDropped, CaptureOptions, CaptureOut
from app.schemas.datasets import NAME_MAX
from app.services.datasets import check_record

log = logging.getLogger(__name__)

KIND = "capture"
FINISHED = frozenset({"stop", "length"})  # a reply that ended normally; others are not kept
# SSE events and, at the odd indices, the blank lines between them.
EVENT_SPLIT = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")


def start(session: Session, project_id: str, name: str, options: CaptureOptions) -> Dataset:
    """The dataset deployment ``name`` captures into: the one the newest deployment of that
    name captured into, if it still exists (a redeploy carries on filling it), with these
    settings; else a new one."""
    dataset = session.scalars(
        select(Dataset).join(Deployment, Deployment.capture_dataset_id == Dataset.id)
        .where(Deployment.project_id == project_id, Deployment.name == name)
        .order_by(Deployment.created_at.desc(), Deployment.id.desc()).limit(1)
        .with_for_update(of=Dataset)).first()
    settings = options.model_dump()
    if dataset is None or dataset.capture is None:
        dataset = Dataset(project_id=project_id, kind=KIND, name=f"capture of {name}"[:NAME_MAX],
                          format="messages", num_conversations=0, num_bytes=0)
        dataset.capture = Capture(**settings, dropped_queue_full=0, dropped_limit_reached=0)
        session.add(dataset)
    else:
        for field, value in settings.items():
            setattr(dataset.capture, field, value)
    session.flush()
    return dataset


def capture_out(dataset: Dataset | None, options: dict[str, Any] | None = None
                ) -> CaptureOut | None:
    """The summary of ``dataset``'s capture; with no dataset (deleted), ``options`` (what the
    deployment asked for) with nothing captured, or None when it asked for none."""
    capture = dataset.capture if dataset is not None else None
    if capture is None or dataset is None:
        if not options:
            return None
        return CaptureOut(dataset_id=None, **options, rows=0, bytes=0,
                          dropped=CaptureDropped(queue_full=0, limit_reached=0),
                          first_at=None, last_at=None)
    return CaptureOut(
        dataset_id=dataset.id, sample_rate=capture.sample_rate, max_rows=capture.max_rows,
        max_bytes=capture.max_bytes, retention_days=capture.retention_days,
        rows=dataset.num_conversations or 0, bytes=dataset.num_bytes or 0,
        dropped=CaptureDropped(queue_full=capture.dropped_queue_full,
                               limit_reached=capture.dropped_limit_reached),
        first_at=capture.first_at, last_at=capture.last_at)


# --- recording ---------------------------------------------------------------------------------

@dataclass(slots=True)
class Sampled:
    """A sampled request as the gateway queues it: no parsing or copying on the request path.
    ``reply`` is the response body, or (``stream``) the SSE chunks forwarded to the client."""

    dataset_id: str
    at: float  # time.time() when it ended
    messages: Any
    reply: bytes | list[bytes]
    stream: bool


def event_json(event: bytes) -> Any:
    """The JSON of one SSE event's ``data:`` lines (None: it has none)."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    return json.loads(b"\n".join(lines)) if lines else None


def reply_of_completion(body: bytes) -> tuple[str, str | None] | None:
    """(content, finish_reason) of the first choice of a chat completion."""
    try:
        choice = json.loads(body)["choices"][0]
        return choice["message"]["content"], choice.get("finish_reason")
    except (ValueError, LookupError, TypeError):
        return None


def reply_of_stream(chunks: list[bytes]) -> tuple[str, str | None] | None:
    """(content, finish_reason) of choice 0, assembled from a stream's chunks."""
    parts: list[str] = []
    finish = None
    for event in EVENT_SPLIT.split(b"".join(chunks))[::2]:
        try:
            payload = event_json(event)
        except ValueError:
            continue  # "data: [DONE]"
        if not isinstance(payload, dict):
            continue
        if "error" in payload:
            return None
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                parts.append(delta["content"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return "".join(parts), finish


def row_of(sampled: Sampled) -> bytes | None:
    """The row's JSON, or None for a reply that did not finish (stop or length), is empty, or
    a conversation the training pipeline could not read."""
    reply = (reply_of_stream(sampled.reply) if sampled.stream  # type: ignore[arg-type]
             else reply_of_completion(sampled.reply))  # type: ignore[arg-type]
    if reply is None or reply[1] not in FINISHED or not isinstance(reply[0], str):
        return None
    if not isinstance(sampled.messages, list):
        return None
    messages = [{**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer"
                else m for m in sampled.messages]
    record = {"messages": [*messages, {"role": "assistant", "content": reply[0]}]}
    try:
        check_record(record)
    except Exception:  # noqa: BLE001 (the dataset validator's line error): not trainable
        return None
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


def store(session: Session, batch: list[Sampled], dropped_queue: dict[str, int],
          fernet: MultiFernet) -> int:
    """Write a batch within each dataset's limits (the rest counted as dropped there), with
    the drops of full queues; how many rows went in. A deleted dataset's rows are discarded."""
    rows: dict[str, list[tuple[datetime, bytes]]] = defaultdict(list)
    for sampled in batch:
        plain = row_of(sampled)
        if plain is not None:
            rows[sampled.dataset_id].append((datetime.fromtimestamp(sampled.at, UTC), plain))
    written = 0
    for dataset_id in sorted(set(rows) | set(dropped_queue)):
        dataset = session.scalars(select(Dataset).where(Dataset.id == dataset_id)
                                  .with_for_update()).first()
        if dataset is None or dataset.capture is None:
            continue  # deleted since: capture stopped
        capture = dataset.capture
        capture.dropped_queue_full += dropped_queue.get(dataset_id, 0)
        count, size = dataset.num_conversations or 0, dataset.num_bytes or 0
        values = []
        for at, plain in rows.get(dataset_id, ()):
            if count + 1 > capture.max_rows or size + len(plain) > capture.max_bytes:
                capture.dropped_limit_reached += 1
                continue
            count, size = count + 1, size + len(plain)
            values.append({"dataset_id": dataset_id, "created_at": at, "num_bytes": len(plain),
                           "ciphertext": fernet.encrypt(plain).decode()})
        if values:
            session.execute(insert(CapturedRow), values)
            dataset.num_conversations, dataset.num_bytes = count, size
            newest = max(v["created_at"] for v in values)
            oldest = min(v["created_at"] for v in values)
            capture.first_at = min(capture.first_at, oldest) if capture.first_at else oldest
            capture.last_at = max(capture.last_at, newest) if capture.last_at else newest
            written += len(values)
    return written


# --- retention, export -------------------------------------------------------------------------

def purge_expired(session: Session, now: datetime | None = None) -> int:
    """Delete the rows past their capture's ``retention_days``; how many."""
    now = now or utcnow()
    purged = 0
    for dataset_id, days, first_at in session.execute(
            select(Capture.dataset_id, Capture.retention_days, Capture.first_at)
            .where(Capture.first_at.is_not(None))).all():
        cutoff = now - timedelta(days=days)
        if first_at >= cutoff:
            continue
        dataset = session.scalars(select(Dataset).where(Dataset.id == dataset_id)
                                  .with_for_update(skip_locked=True)).first()
        if dataset is None or dataset.capture is None:
            continue  # deleted, or being written: the next round
        old = (CapturedRow.dataset_id == dataset_id) & (CapturedRow.created_at < cutoff)
        count, size = session.execute(select(func.count(), func.coalesce(
            func.sum(CapturedRow.num_bytes), 0)).where(old)).one()
        session.execute(delete(CapturedRow).where(old))
        dataset.num_conversations = max(0, (dataset.num_conversations or 0) - count)
        dataset.num_bytes = max(0, (dataset.num_bytes or 0) - size)
        dataset.capture.first_at = session.scalar(select(func.min(CapturedRow.created_at))
                                                  .where(CapturedRow.dataset_id == dataset_id))
        if dataset.capture.first_at is None:
            dataset.capture.last_at = None
        purged += count
    return purged


def export_jsonl(session: Session, dataset_id: str, target: Path, fernet: MultiFernet) -> int:
    """Write the dataset's rows, decrypted, oldest first, to ``target`` (owner-only, written
    atomically); how many."""
    partial = target.with_name(target.name + ".partial")
    written = 0
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        query = (select(CapturedRow.ciphertext).where(CapturedRow.dataset_id == dataset_id)
                 .order_by(CapturedRow.created_at, CapturedRow.id))
        for ciphertext in session.scalars(query.execution_options(yield_per=1000)):
            try:
                out.write(fernet.decrypt(ciphertext.encode()) + b"\n")
            except InvalidToken as exc:
                partial.unlink(missing_ok=True)
                raise RuntimeError(f"the rows of dataset {dataset_id} cannot be decrypted with "
                                   "SPECDECK_SECRET_KEY or SPECDECK_SECRET_KEY_PREVIOUS") from exc
            written += 1
    partial.replace(target)
    return written
