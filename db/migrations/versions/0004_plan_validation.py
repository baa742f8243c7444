"""plan validations: training runs linked to plans

Revision ID: 0004
Revises: 0003
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'


def upgrade() -> None:
    op.create_table('tuner_plan_validations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('gpu_kind', sa.String(length=255), nullable=False),
    sa.Column('device', sa.String(length=8), nullable=False),
    sa.Column('iters', sa.Integer(), nullable=False),
    sa.Column('warmup_iters', sa.Integer(), nullable=False),
    sa.Column('calibration_before', sa.JSON(), nullable=False),
    sa.Column('calibration_after', sa.JSON(), nullable=False),
    sa.Column('fit', sa.JSON(), nullable=False),
    sa.Column('candidates', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['tuner_plans.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tuner_plan_validations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tuner_plan_validations_plan_id'), ['plan_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_plan_validations_gpu_kind'), ['gpu_kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_tuner_plan_validations_created_at'), ['created_at'], unique=False)

    with op.batch_alter_table('tuner_train_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('plan_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('plan_candidate', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_tuner_train_runs_plan_id'), ['plan_id'], unique=False)
        batch_op.create_foreign_key('fk_tuner_train_runs_plan_id', 'tuner_plans', ['plan_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('tuner_train_runs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_tuner_train_runs_plan_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_tuner_train_runs_plan_id'))
        batch_op.drop_column('plan_candidate')
        batch_op.drop_column('plan_id')

    with op.batch_alter_table('tuner_plan_validations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tuner_plan_validations_created_at'))
        batch_op.drop_index(batch_op.f('ix_tuner_plan_validations_gpu_kind'))
        batch_op.drop_index(batch_op.f('ix_tuner_plan_validations_plan_id'))

    op.drop_table('tuner_plan_validations')
