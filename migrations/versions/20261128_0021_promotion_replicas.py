"""A promotion's replica steps: each replica past 0 switches by a promotions row of its own,
which names the deployment's row in ``promotion_of``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("promotions") as batch:
        batch.add_column(sa.Column("promotion_of", sa.String(40), nullable=True))
        batch.create_foreign_key("fk_promotions_promotion_of", "promotions", ["promotion_of"],
                                 ["id"], ondelete="CASCADE")
        batch.create_index("ix_promotions_promotion_of", ["promotion_of"])


def downgrade() -> None:
    with op.batch_alter_table("promotions") as batch:
        batch.drop_index("ix_promotions_promotion_of")
        batch.drop_constraint("fk_promotions_promotion_of", type_="foreignkey")
        batch.drop_column("promotion_of")
