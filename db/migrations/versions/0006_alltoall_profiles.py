"""EP all-to-all profiles in their own table; the layer profiles' never-set alltoall_ms column goes

Revision ID: 0006
Revises: 0005
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'


def upgrade() -> None:
    op.create_table('tuner_alltoall_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_kind', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('mbs', sa.Integer(), nullable=False),
    sa.Column('ep', sa.Integer(), nullable=False),
    sa.Column('rows_per_rank', sa.BigInteger(), nullable=False),
    sa.Column('hidden', sa.Integer(), nullable=False),
    sa.Column('bytes_per_rank', sa.BigInteger(), nullable=False),
    sa.Column('dispatch_ms', sa.Float(), nullable=False),
    sa.Column('combine_ms', sa.Float(), nullable=False),
    sa.Column('alltoall_ms', sa.Float(), nullable=False),
    sa.Column('gbps', sa.Float(), nullable=False),
    sa.Column('reps', sa.Integer(), nullable=False),
    sa.Column('toolchain', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('gpu_kind', 'model', 'seq', 'mbs', 'ep', name='uq_tuner_alltoall_profiles_key')
    )
    with op.batch_alter_table('tuner_alltoall_profiles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuner_alltoall_profiles_gpu_kind'), ['gpu_kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_alltoall_profiles_model'), ['model'], unique=False)
    # The one-GPU profiler never set it (it cannot time an all-to-all); the measurement lives above.
    with op.batch_alter_table('tuner_layer_profiles') as batch:
        batch.drop_column('alltoall_ms')


def downgrade() -> None:
    with op.batch_alter_table('tuner_layer_profiles') as batch:
        batch.add_column(sa.Column('alltoall_ms', sa.Float(), nullable=True))
    with op.batch_alter_table('tuner_alltoall_profiles', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuner_alltoall_profiles_model'))
        batch_op.drop_index(batch_op.f('ix_tuner_alltoall_profiles_gpu_kind'))
    op.drop_table('tuner_alltoall_profiles')
