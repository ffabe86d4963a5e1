"""GPU scheduling: allocations, and the worker and allocation a job was placed on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "allocations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("resource", sa.String(length=8), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["worker_id"], ["workers.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("worker_id", "resource", "idx", name="uq_allocations_unit"),
    )
    with op.batch_alter_table("allocations") as batch:
        batch.create_index("ix_allocations_job_id", ["job_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("allocation", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("allocation")
        batch.drop_column("worker_id")
    op.drop_table("allocations")
