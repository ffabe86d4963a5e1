"""JobOut.stage_progress: the served evaluation's steps as the worker stored them, with the
percent and the time left the API works out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.services.jobs import stage_progress_of

STARTED = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def stored(done: int, total: int = 20) -> dict:
    return {"stage": "evaluating", "what": "the trained drafter: prompt 3 of 9 done",
            "steps_done": done, "total_steps": total, "started_at": STARTED.isoformat()}


def test_no_stage_progress_until_the_worker_writes_one() -> None:
    assert stage_progress_of(None) is None


def test_time_left_is_the_rate_so_far_times_the_steps_left() -> None:
    at = STARTED + timedelta(seconds=30)
    progress = stage_progress_of(stored(5), now=at)
    assert progress is not None
    assert (progress.steps_done, progress.total_steps, progress.percent) == (5, 20, 25.0)
    assert progress.eta_seconds == 90.0  # 6 s a step so far, 15 steps left
    assert progress.what == "the trained drafter: prompt 3 of 9 done"


def test_unknown_before_the_first_step_and_zero_at_the_end() -> None:
    assert stage_progress_of(stored(0), now=STARTED + timedelta(seconds=8)).eta_seconds is None
    done = stage_progress_of(stored(20), now=STARTED + timedelta(seconds=99))
    assert (done.percent, done.eta_seconds) == (100.0, 0.0)
