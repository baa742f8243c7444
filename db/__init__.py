"""The tuner's SQL database: models, engine and migrations."""

from db.engine import DatabaseError, default_url, make_engine, open_database, retrying, schema_lock, session_scope
from db.models import Base, Sweep, SweepStatus, Trial, TrialStatus

__all__ = [
    "Base", "DatabaseError", "Sweep", "SweepStatus", "Trial", "TrialStatus",
    "default_url", "make_engine", "open_database", "retrying", "schema_lock", "session_scope",
]
