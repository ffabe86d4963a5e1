"""A dataset's rows as a reader sees them: each turn's role and text, cut to a readable length.

Uploads are read from their file (validated at upload, so every line parses); captured rows are
decrypted from the database, oldest first. A public preset has no rows here: the worker
downloads it when a job trains on it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from cryptography.fernet import InvalidToken
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import CapturedRow, Dataset
from app.errors import APIError
from app.schemas.datasets import DatasetPreview, PreviewRow, PreviewTurn
from app.services.secrets import cipher
from app.settings import Settings

TEXT_MAX = 2000  # characters of a turn shown
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text ones
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _turn(turn: dict[str, Any]) -> PreviewTurn:
    role = str(turn.get("role", turn.get("from", "")))
    text = _text(turn.get("content", turn.get("value")))
    if not text and turn.get("tool_calls"):
        text = "(calls a tool)"
    return PreviewTurn(role=SHAREGPT_ROLES.get(role, role), text=text[:TEXT_MAX],
                       cut=len(text) > TEXT_MAX)


def _row(index: int, raw: bytes) -> PreviewRow:
    record = json.loads(raw)
    turns = record.get("messages", record.get("conversations")) or []
    return PreviewRow(index=index, turns=[_turn(t) for t in turns if isinstance(t, dict)])


def _upload_lines(dataset: Dataset) -> Iterator[bytes]:
    try:
        with open(dataset.path or "", "rb") as f:
            yield from (raw for raw in f if raw.strip())
    except FileNotFoundError:
        raise APIError(409, f"the file of dataset {dataset.id} is missing from the data root; "
                       "upload it again", code="dataset_file_missing") from None


def _captured_lines(session: Session, dataset: Dataset, settings: Settings,
                    offset: int, limit: int) -> Iterator[bytes]:
    fernet = cipher(settings)
    query = (select(CapturedRow.ciphertext).where(CapturedRow.dataset_id == dataset.id)
             .order_by(CapturedRow.created_at, CapturedRow.id).offset(offset).limit(limit))
    for ciphertext in session.scalars(query):
        try:
            yield fernet.decrypt(ciphertext.encode())
        except InvalidToken:
            raise APIError(409, f"the rows of dataset {dataset.id} cannot be decrypted with "
                           "SPECDECK_SECRET_KEY or SPECDECK_SECRET_KEY_PREVIOUS",
                           code="dataset_undecryptable") from None


def preview(session: Session, dataset: Dataset, settings: Settings, *, offset: int,
            limit: int) -> DatasetPreview:
    """Rows ``offset`` .. ``offset + limit - 1`` of the dataset (one more is read to know
    whether there are more)."""
    if dataset.kind == "public":
        raise APIError(409, f"dataset {dataset.id} is the public preset '{dataset.public_name}': "
                       "the worker downloads it when a job trains on it, so it has no rows "
                       "here to preview", code="no_preview")
    if dataset.kind == "capture":
        lines = _captured_lines(session, dataset, settings, offset, limit + 1)
    else:
        lines = itertools.islice(_upload_lines(dataset), offset, offset + limit + 1)
    raws = list(lines)
    rows = [_row(offset + i, raw) for i, raw in enumerate(raws[:limit])]
    return DatasetPreview(data=rows, offset=offset, has_more=len(raws) > limit)
