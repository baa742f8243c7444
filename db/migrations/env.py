"""Alembic environment: runs migrations on the engine handed over by ``db.engine.upgrade``."""

from alembic import context

from db.engine import VERSION_TABLE
import db.planning  # noqa: F401  (puts the planner's tables on Base.metadata)
from db.models import Base
from db import training  # noqa: F401 - registers tuner_train_runs on Base.metadata
from db import validation  # noqa: F401 - registers tuner_plan_validations on Base.metadata

engine = context.config.attributes["connection_engine"]
with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
