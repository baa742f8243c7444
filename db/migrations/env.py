"""Alembic environment: runs migrations on the engine handed over by ``db.engine.upgrade``."""

from alembic import context

from db.engine import VERSION_TABLE
from db.models import Base

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
