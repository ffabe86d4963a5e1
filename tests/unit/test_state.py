"""The state machine: the table is the only way statuses change, and every change is an event."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.db.models import Job, JobEvent, Project
from app.services.state import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobStatus,
    Stage,
    StaleJob,
    initialize,
    transition,
)


@pytest.fixture
def session(sqlite_url: str):  # a fresh migrated SQLite file
    from app.db import make_engine
    from sqlalchemy.orm import Session

    engine = make_engine(sqlite_url)
    with Session(engine) as session:
        project = Project(name=f"p-{id(session)}")
        session.add(project)
        session.flush()
        session.info["project"] = project.id
        yield session
        session.rollback()
    engine.dispose()


def new_job(session) -> Job:
    job = Job(project_id=session.info["project"], spec={})
    initialize(session, job)
    return job


def test_terminal_states_allow_nothing() -> None:
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize("start, to", [
    (JobStatus.QUEUED, JobStatus.SUCCEEDED),
    (JobStatus.QUEUED, JobStatus.CANCELLING),
    (JobStatus.CANCELLING, JobStatus.RUNNING),
])
def test_illegal_transitions_raise(session, start: JobStatus, to: JobStatus) -> None:
    job = new_job(session)
    if start == JobStatus.CANCELLING:
        transition(session, job, JobStatus.RUNNING)
        transition(session, job, JobStatus.CANCELLING)
    with pytest.raises(IllegalTransition):
        transition(session, job, to)


def test_every_transition_writes_an_event_and_stamps_times(session) -> None:
    job = new_job(session)
    transition(session, job, JobStatus.RUNNING, columns={"lock_token": "t", "attempt": 1})
    transition(session, job, JobStatus.RUNNING, stage=Stage.TRAINING, token="t")
    transition(session, job, JobStatus.SUCCEEDED, stage=None, token="t")
    events = session.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)).all()
    assert [(e.status, e.stage) for e in events] == [
        ("queued", None), ("running", None), ("running", "training"), ("succeeded", None)]
    assert job.started_at and job.finished_at and job.lock_token is None


def test_a_write_with_a_foreign_token_is_stale(session) -> None:
    job = new_job(session)
    transition(session, job, JobStatus.RUNNING, columns={"lock_token": "mine"})
    with pytest.raises(StaleJob):
        transition(session, job, JobStatus.SUCCEEDED, token="someone-elses")
    assert session.get(Job, job.id).status == "running"


def test_a_stale_view_of_the_status_is_refused(session) -> None:
    job = new_job(session)
    other_view = Job(id=job.id, project_id=job.project_id, spec={}, status="queued", attempt=0)
    transition(session, job, JobStatus.CANCELLED)
    with pytest.raises(StaleJob):
        transition(session, other_view, JobStatus.RUNNING)


def test_nothing_else_assigns_status() -> None:
    """Only app/services/state.py may write Job.status or Job.stage."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.glob("app/**/*.py"), *root.glob("workers/**/*.py")]:
        if path.name == "state.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # attribute assignment (job.status = ...) or a bulk write (.values(status=...))
            if re.search(r"\bjob\.(status|stage)\s*=(?!=)|\.values\([^)]*\b(status|stage)\s*=", line):
                offenders.append(f"{path}:{number}: {line.strip()}")
    assert offenders == []
