"""Checkpoints: the worker holding the files, and the state of a publish.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("publish_status", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("publish_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        for column in ("publish_error", "publish_status", "worker_id"):
            batch.drop_column(column)
