"""The Ray node that measured each trial; indexes for the queue's claim and the runner's per-sweep lookups

Revision ID: 0007
Revises: 0006
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'


def upgrade() -> None:
    with op.batch_alter_table('tuner_trials') as batch:
        batch.add_column(sa.Column('node', sa.String(length=64), nullable=True))
        batch.create_index('ix_tuner_trials_sweep_identity', ['sweep_id', 'identity'])
        batch.create_index('ix_tuner_trials_sweep_shape', ['sweep_id', 'shape_key'])
    with op.batch_alter_table('tuner_sweeps') as batch:
        batch.create_index('ix_tuner_sweeps_status_heartbeat', ['status', 'heartbeat_at'])


def downgrade() -> None:
    with op.batch_alter_table('tuner_sweeps') as batch:
        batch.drop_index('ix_tuner_sweeps_status_heartbeat')
    with op.batch_alter_table('tuner_trials') as batch:
        batch.drop_index('ix_tuner_trials_sweep_shape')
        batch.drop_index('ix_tuner_trials_sweep_identity')
        batch.drop_column('node')
