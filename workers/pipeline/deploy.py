"""Stage: the job's ``deploy`` option. After the gate passed (a missed gate fails the job in
the evaluating stage, so nothing is promoted), the evaluated checkpoint is promoted to the
named deployment: a promotion is recorded, and the deployment's worker switches to it without
downtime. The job does not wait for the switch; the promotion's steps are the deployment's
events (GET /api/deployments/{id}/promotions)."""

from __future__ import annotations

from typing import Any

from app.errors import APIError
from app.schemas.job_spec import JobSpec
from app.services.promotions import request_promotion, serving_deployment
from app.services.state import record_event
from workers.runner import JobContext, StageFailed


def deploy(ctx: JobContext[JobSpec]) -> None:
    assert ctx.spec.deploy is not None, "the pipeline runs this stage only when the job deploys"
    name = ctx.spec.deploy.deployment

    def write(session: Any) -> None:
        job = ctx.lease.load(session)
        checkpoint_id = (job.evaluation or {}).get("checkpoint_id")
        if checkpoint_id is None:
            raise StageFailed("no evaluated checkpoint to promote", code="deploy_failed")
        deployment = serving_deployment(session, job.project_id, name)
        if deployment is None:
            raise StageFailed(f"no starting or ready deployment named '{name}' to promote "
                              f"checkpoint {checkpoint_id} to", code="deploy_failed")
        promotion = request_promotion(session, deployment, checkpoint_id, param="deploy",
                                      job_id=job.id)
        record_event(session, job, "deploy", f"promotion {promotion.id} of checkpoint "
                     f"{checkpoint_id} to deployment {name} ({deployment.id}) requested",
                     {"promotion": promotion.id, "deployment": deployment.id,
                      "checkpoint_id": checkpoint_id})

    try:
        ctx.write(write)
    except APIError as exc:  # another promotion in progress, the drafter already served ...
        raise StageFailed(f"promoting to deployment {name} failed: {exc.message}",
                          code="deploy_failed") from exc
