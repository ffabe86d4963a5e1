"""Job metrics: an index on (job_id, id), for a job's latest training metric (its progress, on
every job answer) read backwards from the newest row of that job.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_job_metrics_job_id_id", "job_metrics", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_metrics_job_id_id", table_name="job_metrics")
