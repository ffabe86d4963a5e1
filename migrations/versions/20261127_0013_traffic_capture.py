"""Traffic capture: a capture dataset's settings and counters, its encrypted rows, the dataset a
deployment captures into, and the per-request acceptance length on usage rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "captures",
        sa.Column("dataset_id", sa.String(length=40), nullable=False),
        sa.Column("sample_rate", sa.Float(), nullable=False),
        sa.Column("max_rows", sa.BigInteger(), nullable=False),
        sa.Column("max_bytes", sa.BigInteger(), nullable=False),
        sa.Column("retention_days", sa.Integer(), nullable=False),
        sa.Column("dropped_queue_full", sa.BigInteger(), nullable=False),
        sa.Column("dropped_limit_reached", sa.BigInteger(), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id"),
    )
    op.create_table(
        "captured_rows",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("dataset_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("num_bytes", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_captured_rows_dataset_id_created_at", "captured_rows",
                    ["dataset_id", "created_at"])
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("capture_dataset_id", sa.String(length=40), nullable=True))
        batch_op.create_foreign_key("fk_deployments_capture_dataset_id_datasets", "datasets",
                                    ["capture_dataset_id"], ["id"], ondelete="SET NULL")
        batch_op.create_index("ix_deployments_capture_dataset_id", ["capture_dataset_id"])
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("acceptance_length", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.drop_column("acceptance_length")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index("ix_deployments_capture_dataset_id")
        batch_op.drop_constraint("fk_deployments_capture_dataset_id_datasets", type_="foreignkey")
        batch_op.drop_column("capture_dataset_id")
    op.drop_index("ix_captured_rows_dataset_id_created_at", table_name="captured_rows")
    op.drop_table("captured_rows")
    op.drop_table("captures")
