"""Live acceptance: one row per scrape interval of a deployment's engine /metrics.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deployment_metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("interval_seconds", sa.Float(), nullable=False),
        sa.Column("drafter", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=40), nullable=True),
        sa.Column("num_drafts", sa.BigInteger(), nullable=False),
        sa.Column("num_draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("num_accepted_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted_per_position", sa.JSON(), nullable=False),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("acceptance_length", sa.Float(), nullable=True),
        sa.Column("draft_acceptance_rate", sa.Float(), nullable=True),
        sa.Column("per_position_acceptance", sa.JSON(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_deployment_metrics_deployment_id_id", "deployment_metrics",
                    ["deployment_id", "id"])
    op.create_index("ix_deployment_metrics_deployment_id_created_at", "deployment_metrics",
                    ["deployment_id", "created_at"])


def downgrade() -> None:
    op.drop_table("deployment_metrics")
