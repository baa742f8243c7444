"""Engine, sessions and schema upgrades for the tuner database.

SQLite (one file, WAL journal) is the embedded default; PostgreSQL is used for a fleet
through ``TUNER_DB_URL``. The schema is owned by Alembic migrations under
``db/migrations``; ``open_database`` upgrades it on every start so no user ever runs a
migration by hand. Servers started together upgrade one at a time (``schema_lock``): two
unserialized Alembic runs both stamp the version table, and the second fails.

A fleet's PostgreSQL can restart under a running server; ``retrying`` runs a short
transaction again, with backoff, while the server cannot be reached.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import platformdirs
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Optuna owns the default "alembic_version" table in the same database.
VERSION_TABLE = "tuner_alembic_version"
# PostgreSQL advisory lock key of schema upgrades (tuner's and Optuna's): any fixed 64-bit number.
SCHEMA_LOCK_KEY = 0x7475_6E65_7235  # "tuner5"
# How long a server keeps retrying a transaction while the database cannot be reached.
RETRY_BUDGET_S = float(os.environ.get("TUNER_DB_RETRY_S", "120"))
RETRY_FIRST_DELAY_S, RETRY_MAX_DELAY_S = 0.2, 5.0
T = TypeVar("T")
log = logging.getLogger(__name__)


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


@contextmanager
def schema_lock(engine: Engine) -> Iterator[None]:
    """Held while a process creates or upgrades schemas in the database (the tuner's, Optuna's).

    SQLite: an exclusive ``flock`` on ``<database file>.schema-lock``. PostgreSQL: a session
    advisory lock. Other backends (and in-memory SQLite) take none.
    """
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        with open(f"{url.database}.schema-lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif url.get_backend_name() == "postgresql":
        with engine.connect() as connection:
            connection.execute(select(func.pg_advisory_lock(SCHEMA_LOCK_KEY)))
            connection.commit()
            try:
                yield
            finally:
                connection.execute(select(func.pg_advisory_unlock(SCHEMA_LOCK_KEY)))
                connection.commit()
    else:
        yield


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent; one process at a time)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection_engine"] = engine
    try:
        with schema_lock(engine):
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        if is_disconnect(exc):
            raise DatabaseError(f"cannot reach the database {engine.url!r}: {_driver_message(exc)}") from None
        raise DatabaseError(f"cannot upgrade the schema of {engine.url!r}: {_driver_message(exc)}") from None


def _driver_message(exc: SQLAlchemyError) -> str:
    """What the database driver said, on one line, without SQLAlchemy's wrapping and its link to the docs."""
    said = str(getattr(exc, "orig", None) or exc).split("(Background on this error", 1)[0]
    return " ".join(said.split())


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the database being out of reach rather than a bad statement."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (OperationalError, InterfaceError)):
            return True
        if isinstance(seen, DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retrying(action: Callable[[], T], what: str, budget_s: float | None = None) -> T:
    """``action()``, run again with backoff while the database is out of reach, for ``budget_s`` seconds
    (``TUNER_DB_RETRY_S``, default 120). ``action`` must be one transaction: a failed one wrote nothing."""
    deadline = time.monotonic() + (RETRY_BUDGET_S if budget_s is None else budget_s)
    delay = RETRY_FIRST_DELAY_S
    while True:
        try:
            return action()
        except (DatabaseError, SQLAlchemyError) as exc:
            if not is_disconnect(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("database out of reach while %s (%s); retrying in %.1f s", what,
                        str(exc).splitlines()[0][:200], delay)
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_DELAY_S)


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
