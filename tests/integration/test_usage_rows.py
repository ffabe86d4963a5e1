"""The gateway's usage rows as they reach the database (``UsageRecorder.write`` in
app/services/gateway.py), on both databases: PostgreSQL takes a batch with COPY, SQLite with an
executemany; every field comes back as it was recorded, the keys' ``last_used_at`` moves forward,
and a batch with a row of a key deleted since keeps every other row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.conftest import Stack
from tests.integration.test_gateway import make_key


def rows(project_id: str) -> list[tuple]:
    from sqlalchemy import select

    from app.db import session_scope
    from app.db.models import Usage

    with session_scope() as session:
        return [(u.api_key_id, u.deployment_id, u.model, u.prompt_tokens, u.completion_tokens,
                 u.acceptance_length, u.created_at)
                for u in session.scalars(select(Usage).where(Usage.project_id == project_id)
                                         .order_by(Usage.id))]


def row(key, when: datetime, **fields: object) -> dict:
    return {"api_key_id": key.id, "project_id": key.project_id, "deployment_id": "dep-1",
            "model": "served", "prompt_tokens": 5, "completion_tokens": 8,
            "acceptance_length": None, "created_at": when, **fields}


def test_a_batch_is_written_whole_and_a_deleted_keys_rows_are_dropped(stack: Stack) -> None:
    from app.db import session_scope
    from app.db.models import ApiKey
    from app.services.gateway import UsageRecorder

    key, doomed = make_key(), make_key()
    when = datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=UTC)
    recorder = UsageRecorder(interval=60)
    batch = [row(key, when, acceptance_length=3.25),
             row(key, when + timedelta(seconds=1), deployment_id=None, model="it's \"quoted\"\t",
                 prompt_tokens=0, completion_tokens=0)]
    assert recorder.write(batch) == 2
    assert rows(key.project_id) == [
        (key.id, "dep-1", "served", 5, 8, 3.25, when),
        (key.id, None, "it's \"quoted\"\t", 0, 0, None, when + timedelta(seconds=1))]
    with session_scope() as session:
        assert session.get(ApiKey, key.id).last_used_at == when + timedelta(seconds=1)
        session.delete(session.get(ApiKey, doomed.id))

    later = when + timedelta(minutes=1)
    recorder.write([row(key, later), row(doomed, later), row(key, later, prompt_tokens=7)])
    assert [r[3] for r in rows(key.project_id)] == [5, 0, 5, 7]
    assert rows(doomed.project_id) == []
    with session_scope() as session:
        assert session.get(ApiKey, key.id).last_used_at == later
