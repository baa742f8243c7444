"""training runs

Revision ID: 0003
Revises: 0002
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'


def upgrade() -> None:
    op.create_table('tuner_train_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('world', sa.Integer(), nullable=False),
    sa.Column('device', sa.String(length=8), nullable=False),
    sa.Column('preset', sa.String(length=255), nullable=False),
    sa.Column('owner', sa.String(length=255), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('oom_stage', sa.Integer(), nullable=True),
    sa.Column('model', sa.JSON(), nullable=True),
    sa.Column('layout', sa.String(length=1024), nullable=True),
    sa.Column('recompute', sa.String(length=1024), nullable=True),
    sa.Column('kernels', sa.String(length=16), nullable=True),
    sa.Column('kernel_tables', sa.JSON(), nullable=True),
    sa.Column('pp', sa.Integer(), nullable=True),
    sa.Column('vpp', sa.Integer(), nullable=True),
    sa.Column('dp', sa.Integer(), nullable=True),
    sa.Column('microbatches', sa.Integer(), nullable=True),
    sa.Column('step_times_s', sa.JSON(), nullable=True),
    sa.Column('losses', sa.JSON(), nullable=True),
    sa.Column('mtp_losses', sa.JSON(), nullable=True),
    sa.Column('step_median_s', sa.Float(), nullable=True),
    sa.Column('step_p20_s', sa.Float(), nullable=True),
    sa.Column('step_p80_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s_per_gpu', sa.Float(), nullable=True),
    sa.Column('model_tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('stage_memory', sa.JSON(), nullable=True),
    sa.Column('versions', sa.JSON(), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('gpu_name', sa.String(length=255), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tuner_train_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuner_train_runs_preset'), ['preset'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_train_runs_status'), ['status'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('tuner_train_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuner_train_runs_status'))
        batch_op.drop_index(batch_op.f('ix_tuner_train_runs_preset'))

    op.drop_table('tuner_train_runs')
