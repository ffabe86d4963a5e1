"""The evaluating stage against the database: a best checkpoint that already carries its own
evaluation (a job resumed after its worker died) is not evaluated again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Api, Stack
from tests.unit.test_evaluate import EVALUATION


class NothingMayRun:
    """A stage context that records events and refuses to start anything."""

    def __init__(self, job_id: str, spec: dict[str, Any]) -> None:
        self.job_id, self.spec, self.plan = job_id, spec, object()
        self.events: list[tuple[str, str]] = []
        self.verifier_server = None

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((kind, message))

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the stage used ctx.{name}: it must do nothing")


def test_a_checkpoint_with_its_evaluation_is_not_evaluated_again(pg_api: Api, pg_stack: Stack,
                                                                  pg_job_body) -> None:
    from app.db import session_scope
    from app.db.models import Checkpoint, Job, JobCandidate
    from app.schemas.job_spec import JobSpec
    from workers.pipeline.evaluate import evaluate

    job_id = pg_api.post("/api/jobs", json=pg_job_body(evaluate={"prompts": 8, "baseline": False, "ngram": False})).json()["id"]
    with session_scope() as session:
        spec = JobSpec.load(session.get(Job, job_id).spec)
        session.query(JobCandidate).filter_by(job_id=job_id).one().status = "trained"
        older = Checkpoint(job_id=job_id, epoch=0, path="/w/0")
        best = Checkpoint(job_id=job_id, epoch=1, path="/w/1", is_best=True)
        session.add_all([older, best])
        session.flush()
        recorded = {**EVALUATION, "checkpoint_id": best.id, "rounds": 3}
        best.evaluation = recorded
        best_id = best.id

    ctx = NothingMayRun(job_id, spec)
    evaluate(ctx)  # type: ignore[arg-type]
    assert ctx.events == [("skipped", "the checkpoints are already evaluated; keeping their "
                                      "evaluation")]
    with session_scope() as session:
        assert session.get(Checkpoint, best_id).evaluation == recorded
    assert pg_api.get(f"/api/checkpoints/{best_id}").json()["evaluation"] == recorded


SETTINGS = {"prompts": 8, "max_tokens": 64, "baseline": False, "ngram": False,
            "checkpoints": "best", "rounds": 3}


@pytest.mark.parametrize("change", [{"checkpoint_id": "ckpt_another"}, {"max_tokens": 32},
                                    {"requested_prompts": 4}, {"checkpoints": "last:2"},
                                    {"rounds": 1}])
def test_an_evaluation_of_something_else_does_not_count(change: dict[str, Any]) -> None:
    from app.db.models import Checkpoint
    from app.schemas.jobs import EvaluateSpec
    from workers.pipeline.evaluate import _already_evaluated

    settings = EvaluateSpec(**SETTINGS)
    measured = {**EVALUATION, "rounds": 3}
    checkpoint = Checkpoint(id="ckpt_1", evaluation=measured)
    assert _already_evaluated(checkpoint, settings)
    checkpoint.evaluation = {**measured, **change}
    assert not _already_evaluated(checkpoint, settings)
    # Asked for a baseline now, evaluated without it then: evaluated again.
    checkpoint.evaluation = measured
    assert not _already_evaluated(checkpoint, EvaluateSpec(**{**SETTINGS, "baseline": True}))
    assert not _already_evaluated(checkpoint, EvaluateSpec(**{**SETTINGS, "ngram": True}))
