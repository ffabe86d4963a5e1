"""Drafter kinds and bake-offs: a job trains one or more candidates (``job_candidates``, one
row each, with its status, training cost and served figures); checkpoints and metrics say
which candidate they are of, and checkpoints their kind. Every job made before has one
candidate, DFlash, filled in from the job.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A job's status -> its one candidate's (a succeeded job's: evaluated, or trained when it skipped
# the evaluation).
STATUS = {"queued": "pending", "running": "training", "cancelling": "training",
          "failed": "stopped", "cancelled": "stopped"}


def upgrade() -> None:
    op.create_table(
        "job_candidates",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("steps_per_epoch", sa.Integer(), nullable=True),
        sa.Column("train_seconds", sa.Float(), nullable=True),
        sa.Column("train_cpu_seconds", sa.Float(), nullable=True),
        sa.Column("train_gpu_seconds", sa.Float(), nullable=True),
        sa.Column("evaluation", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "idx", name="uq_job_candidates_job_idx"),
    )
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("status", sa.String),
                    sa.column("steps_per_epoch", sa.Integer), sa.column("evaluation", sa.JSON),
                    sa.column("created_at"), sa.column("updated_at"))
    status = sa.case(*((jobs.c.status == job, candidate) for job, candidate in STATUS.items()),
                     (jobs.c.evaluation.is_not(None), "evaluated"), else_="trained")
    columns = ["id", "job_id", "idx", "name", "kind", "status", "steps_per_epoch", "evaluation",
               "created_at", "updated_at"]
    candidates = sa.table("job_candidates", *(sa.column(c) for c in columns))
    op.execute(sa.insert(candidates).from_select(columns, sa.select(
        sa.literal("cand_") + sa.func.substr(jobs.c.id, 5), jobs.c.id, sa.literal(0),
        sa.literal("dflash"), sa.literal("dflash"), status, jobs.c.steps_per_epoch,
        jobs.c.evaluation, jobs.c.created_at, jobs.c.updated_at)))
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("candidate", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False,
                                   server_default="dflash"))
        batch.drop_constraint("uq_checkpoints_job_epoch", type_="unique")
        batch.create_unique_constraint("uq_checkpoints_job_candidate_epoch",
                                       ["job_id", "candidate", "epoch"])
    with op.batch_alter_table("job_metrics") as batch:
        batch.add_column(sa.Column("candidate", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job_metrics") as batch:
        batch.drop_column("candidate")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("uq_checkpoints_job_candidate_epoch", type_="unique")
        batch.create_unique_constraint("uq_checkpoints_job_epoch", ["job_id", "epoch"])
        batch.drop_column("kind")
        batch.drop_column("candidate")
    op.drop_table("job_candidates")
