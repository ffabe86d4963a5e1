"""A checkpoint the trainer saves when stopped mid-epoch (its "interrupted" directory) is listed
as partial, on both databases: never the best, never evaluated or published by default, and
replaced by the epoch's own checkpoint when training resumes. (The trainer's lines that announce
it: tests/local_runtime/test_local_trainer_output.py::test_interrupted_run.)"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.conftest import Api, Stack
from tests.integration.test_datasets_api import add_job, project_of


def checkpoints(api: Api, job_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/api/jobs/{job_id}/checkpoints")
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_a_checkpoint_saved_mid_epoch_is_partial_until_the_epoch_ends(api: Api, stack: Stack) -> None:
    from app.db import session_scope
    from app.schemas.jobs import EvaluateSpec
    from workers.pipeline.evaluate import chosen
    from workers.pipeline.training import record_partial, upsert_checkpoint
    from workers.publish import best_checkpoint

    job_id = add_job(project_of(stack, api), {"verifier": "demo", "dataset": "demo.jsonl"})
    with session_scope() as session:
        upsert_checkpoint(session, job_id, 0, "/ck/0", "w1", best=True)
        # Stopped before epoch 1's first step: the same weights as epoch 0's; nothing new.
        assert not record_partial(session, job_id, 0, "/ck/interrupted", "w1")
        # Stopped during epoch 1.
        assert record_partial(session, job_id, 1, "/ck/interrupted", "w1")
    listed = checkpoints(api, job_id)
    assert [(c["epoch"], c["path"], c["partial"], c["is_best"]) for c in listed] == [
        (0, "/ck/0", False, True), (1, "/ck/interrupted", True, False)]

    with session_scope() as session:
        # The job's checkpoint (evaluation, publish, deploy) is never the partial one, even
        # when it is the latest and nothing is marked best; nor among the last N evaluated.
        session.execute(sa.text(
            "UPDATE checkpoints SET is_best = false WHERE job_id = :id"), {"id": job_id})
        assert best_checkpoint(session, job_id).epoch == 0
        settings = EvaluateSpec(prompts=1, max_tokens=8, baseline=False, ngram=False,
                                checkpoints="last:2")
        assert [c.epoch for c in chosen(session, job_id, 0, settings)] == [0]
        # Training resumed and finished epoch 1: its own checkpoint replaces the partial one.
        upsert_checkpoint(session, job_id, 1, "/ck/1", "w2", best=True)
    assert [(c["epoch"], c["path"], c["partial"], c["is_best"]) for c in checkpoints(api, job_id)] == [
        (0, "/ck/0", False, False), (1, "/ck/1", False, True)]
