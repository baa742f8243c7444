"""Engine, sessions and schema upgrades for the tuner database.

SQLite (one file, WAL journal) is the embedded default; PostgreSQL is used for a fleet
through ``TUNER_DB_URL``. The schema is owned by Alembic migrations under
``db/migrations``; ``open_database`` upgrades it on every start so no user ever runs a
migration by hand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Optuna owns the default "alembic_version" table in the same database.
VERSION_TABLE = "tuner_alembic_version"


class DatabaseError(RuntimeError):
    """The database could not be reached, upgraded or written."""


def default_url() -> str:
    """``TUNER_DB_URL`` when set, else a SQLite file in the user's data directory."""
    url = os.environ.get("TUNER_DB_URL")
    if url:
        return url
    data_dir = Path(platformdirs.user_data_dir("v4-tuner"))
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / 'tuner.db'}"


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL and a busy timeout for concurrent readers."""
    try:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(url, pool_pre_ping=True)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise DatabaseError(f"cannot open database {url!r}: {exc}") from None
    return engine


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection_engine"] = engine
    try:
        command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot upgrade the schema of {engine.url!r}: {exc}") from None


def open_database(url: str | None = None) -> Engine:
    """Engine for ``url`` (default: ``default_url()``) with the schema upgraded."""
    engine = make_engine(url or default_url())
    upgrade(engine)
    return engine


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = sessionmaker(engine, expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        raise DatabaseError(str(exc)) from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
