"""layer profiles: bytes kept with each selective-recompute module alone

Revision ID: 0005
Revises: 0004
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'


def upgrade() -> None:
    with op.batch_alter_table('tuner_layer_profiles') as batch:
        batch.add_column(sa.Column('selective_kept_bytes', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tuner_layer_profiles') as batch:
        batch.drop_column('selective_kept_bytes')
