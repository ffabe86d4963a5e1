"""Encrypted project secrets; the Hub commit and URL of a published checkpoint.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        sa.Column("project_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("project_id", "name", name="uq_secrets_project_name"),
    )
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("hub_repo", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("hub_commit", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("hub_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("published_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        for column in ("published_at", "hub_url", "hub_commit", "hub_repo"):
            batch.drop_column(column)
    op.drop_table("secrets")
