"""A publish always ends, in ``published`` or ``failed`` (issue 9, point 9): a checkpoint whose
card cannot be prepared fails with the reason, through a real worker, and can be published
again; a publish whose worker went away is failed by the reconciler."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Api, Stack
from tests.support.waiting import wait_for


def checkpoint_on(api: Api, stack: Stack, job_body, worker: str, config: dict) -> str:
    from app.db import session_scope
    from app.db.models import Checkpoint

    job = api.post("/api/jobs", json=job_body()).json()
    directory = Path(stack.env["SPECDECK_WORK_ROOT"]) / job["id"] / "checkpoints" / "0"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job["id"], epoch=0, path=str(directory), is_best=True,
                                worker_id=worker)
        session.add(checkpoint)
        session.flush()
        return checkpoint.id


def publish_status(api: Api, checkpoint_id: str) -> dict:
    return api.get(f"/api/checkpoints/{checkpoint_id}").json()


def test_a_publish_that_cannot_be_prepared_fails_and_can_be_retried(pg_api: Api, pg_stack: Stack,
                                                                     pg_job_body) -> None:
    worker = pg_stack.start_worker("publisher")
    assert pg_api.client.put("/api/secrets/HF_TOKEN", json={"value": "hf_" + "x" * 30},
                             headers=pg_api.headers()).status_code in (200, 201)
    # Not a speculators config: the model card cannot be written.
    checkpoint_id = checkpoint_on(pg_api, pg_stack, pg_job_body, worker.name, {"foo": 1})
    asked = pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish", json={"repo_id": "org/name"})
    assert asked.status_code == 202, asked.text
    failed = wait_for(lambda: (c := publish_status(pg_api, checkpoint_id))["publish_status"]
                      == "failed" and c, 30, "the publish to fail")
    assert "not a DFlash speculators config" in failed["publish_error"], failed
    again = pg_api.post(f"/api/checkpoints/{checkpoint_id}/publish", json={"repo_id": "org/name"})
    assert again.status_code == 202, again.text  # not stuck in publishing


def test_a_publish_whose_worker_died_is_failed_by_the_reconciler(pg_api: Api, pg_stack: Stack,
                                                                 pg_job_body) -> None:
    from app.db import session_scope
    from app.db.models import Checkpoint

    doomed = pg_stack.start_worker("doomed-publisher")
    checkpoint_id = checkpoint_on(pg_api, pg_stack, pg_job_body, doomed.name,
                                  {"speculators_model_type": "dflash", "block_size": 8})
    doomed.kill()
    with session_scope() as session:  # it was publishing when its worker died
        session.get(Checkpoint, checkpoint_id).publish_status = "publishing"
    pg_stack.start_worker("survivor", SPECDECK_RECONCILE_SECONDS="1")
    failed = wait_for(lambda: (c := publish_status(pg_api, checkpoint_id))["publish_status"]
                      == "failed" and c, 60, "the reconciler to fail the publish")
    assert "doomed-publisher" in failed["publish_error"], failed
