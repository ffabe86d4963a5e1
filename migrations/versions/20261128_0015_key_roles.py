"""Key roles: admin (everything), member (train, deploy, chat; not keys, secrets or webhooks),
inference (/v1 alone). Keys made before roles existed could do everything: they are admins.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("role", sa.String(length=16), nullable=False,
                                   server_default="admin"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("role")
