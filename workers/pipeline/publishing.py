"""Stage: publish the best checkpoint to the Hub repo the job names."""

from __future__ import annotations

from app.db import session_scope
from app.schemas.job_spec import JobSpec
from app.services.secrets import HF_TOKEN
from workers.publish import MissingToken, best_checkpoint, prepare, record
from workers.runner import JobContext, StageFailed


def publish(ctx: JobContext[JobSpec]) -> None:
    repo_id = ctx.spec.publish
    assert repo_id is not None, "the pipeline runs this stage only when the job publishes"
    work_dir = ctx.paths.root / "publish"
    with session_scope() as session:
        checkpoint = best_checkpoint(session, ctx.job_id)
        if checkpoint is None:
            raise StageFailed("there is no checkpoint to publish", code="no_checkpoint")
        try:
            command = prepare(session, checkpoint, repo_id, private=True, work_dir=work_dir,
                              settings=ctx.settings)
        except MissingToken as exc:
            raise StageFailed(str(exc), code="missing_secret") from exc
        checkpoint_id, epoch = checkpoint.id, checkpoint.epoch
    ctx.secrets.append(command.env[HF_TOKEN])  # redacted from the job's log, just in case
    ctx.run(command)
    with session_scope() as session:
        result = record(session, checkpoint_id, work_dir, repo_id)
    change = "a new commit" if result["changed"] else "no change since the last publish"
    ctx.event("published", f"epoch {epoch + 1} published to {repo_id}: {change} "
              f"({result['commit_sha'][:12]})", result)
