"""layer profiles and plans

Revision ID: 0002
Revises: 0001
"""

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'


def upgrade() -> None:
    op.create_table('tuner_layer_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_kind', sa.String(length=255), nullable=False),
    sa.Column('gpu_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('mbs', sa.Integer(), nullable=False),
    sa.Column('ep', sa.Integer(), nullable=False),
    sa.Column('layer_kind', sa.String(length=32), nullable=False),
    sa.Column('forward_ms', sa.Float(), nullable=False),
    sa.Column('backward_ms', sa.Float(), nullable=False),
    sa.Column('recompute_backward_ms', sa.Float(), nullable=False),
    sa.Column('activation_bytes', sa.BigInteger(), nullable=False),
    sa.Column('recompute_kept_bytes', sa.BigInteger(), nullable=False),
    sa.Column('params', sa.BigInteger(), nullable=False),
    sa.Column('expert_params', sa.BigInteger(), nullable=True),
    sa.Column('optimizer_ms_per_param', sa.Float(), nullable=True),
    sa.Column('p2p_bytes', sa.BigInteger(), nullable=False),
    sa.Column('alltoall_ms', sa.Float(), nullable=True),
    sa.Column('kernel_tables', sa.Text(), nullable=False),
    sa.Column('toolchain', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('gpu_kind', 'model', 'seq', 'mbs', 'ep', 'layer_kind', 'kernel_tables',
                        name='uq_tuner_layer_profiles_key')
    )
    with op.batch_alter_table('tuner_layer_profiles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuner_layer_profiles_gpu_kind'), ['gpu_kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_layer_profiles_model'), ['model'], unique=False)

    op.create_table('tuner_plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_key', sa.String(length=64), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('plans', sa.JSON(), nullable=False),
    sa.Column('step_ms', sa.Float(), nullable=False),
    sa.Column('tokens_per_s_per_gpu', sa.Float(), nullable=False),
    sa.Column('tflops_per_gpu', sa.Float(), nullable=True),
    sa.Column('lower_bound_ms', sa.Float(), nullable=False),
    sa.Column('calibration', sa.JSON(), nullable=False),
    sa.Column('profile_rows', sa.JSON(), nullable=False),
    sa.Column('kernel_tables', sa.Text(), nullable=False),
    sa.Column('profiles_from', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tuner_plans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuner_plans_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_plans_request_key'), ['request_key'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('tuner_plans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuner_plans_request_key'))
        batch_op.drop_index(batch_op.f('ix_tuner_plans_created_at'))

    op.drop_table('tuner_plans')
    with op.batch_alter_table('tuner_layer_profiles', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuner_layer_profiles_model'))
        batch_op.drop_index(batch_op.f('ix_tuner_layer_profiles_gpu_kind'))

    op.drop_table('tuner_layer_profiles')
