"""Deployment replicas: a replica is a deployments row that names its deployment in
``replica_of`` and has its index in ``replica`` (the deployment's own row is replica 0); each
live acceptance point says which replica's engine it counts.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("replica_of", sa.String(40), nullable=True))
        batch.add_column(sa.Column("replica", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.create_foreign_key("fk_deployments_replica_of", "deployments", ["replica_of"],
                                 ["id"], ondelete="CASCADE")
        batch.create_index("ix_deployments_replica_of", ["replica_of"])
    with op.batch_alter_table("deployment_metrics") as batch:
        batch.add_column(sa.Column("replica", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("deployment_metrics") as batch:
        batch.drop_column("replica")
    with op.batch_alter_table("deployments") as batch:
        batch.drop_index("ix_deployments_replica_of")
        batch.drop_constraint("fk_deployments_replica_of", type_="foreignkey")
        batch.drop_column("replica")
        batch.drop_column("replica_of")
