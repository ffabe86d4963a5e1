"""Deployments (served drafters), their events, gateway usage; allocations held by deployments.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 22:13:03.349338
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('deployments',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('project_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('upstream_url', sa.Text(), nullable=True),
    sa.Column('api_key_ciphertext', sa.Text(), nullable=True),
    sa.Column('restarts', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('lock_owner', sa.String(length=255), nullable=True),
    sa.Column('lock_token', sa.String(length=64), nullable=True),
    sa.Column('lock_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('pgids', sa.JSON(), nullable=True),
    sa.Column('pgid_host', sa.String(length=255), nullable=True),
    sa.Column('kicked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('worker_id', sa.String(length=255), nullable=True),
    sa.Column('allocation', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.create_index('ix_deployments_project_id_id', ['project_id', 'id'], unique=False)
        batch_op.create_index('ix_deployments_project_name', ['project_id', 'name'], unique=False)

    op.create_table('deployment_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('deployment_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=True),
    sa.Column('stage', sa.String(length=32), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('deployment_events', schema=None) as batch_op:
        batch_op.create_index('ix_deployment_events_deployment_id_id', ['deployment_id', 'id'], unique=False)

    op.create_table('usage',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('api_key_id', sa.String(length=40), nullable=False),
    sa.Column('project_id', sa.String(length=40), nullable=False),
    sa.Column('deployment_id', sa.String(length=40), nullable=True),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.create_index('ix_usage_api_key_id_created_at', ['api_key_id', 'created_at'], unique=False)

    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deployment_id', sa.String(length=40), nullable=True))
        batch_op.create_index(batch_op.f('ix_allocations_deployment_id'), ['deployment_id'], unique=False)
        batch_op.create_foreign_key('fk_allocations_deployment_id', 'deployments', ['deployment_id'], ['id'], ondelete='CASCADE')


def downgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_constraint('fk_allocations_deployment_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_allocations_deployment_id'))
        batch_op.drop_column('deployment_id')

    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.drop_index('ix_usage_api_key_id_created_at')

    op.drop_table('usage')
    with op.batch_alter_table('deployment_events', schema=None) as batch_op:
        batch_op.drop_index('ix_deployment_events_deployment_id_id')

    op.drop_table('deployment_events')
    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.drop_index('ix_deployments_project_name')
        batch_op.drop_index('ix_deployments_project_id_id')

    op.drop_table('deployments')
