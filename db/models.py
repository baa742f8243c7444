"""SQLAlchemy models: a sweep (one queued job) and its trials (one measured config each).

Table names carry a ``tuner_`` prefix because Optuna keeps its studies in the same
database with its own tables and its own ``alembic_version`` table.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class SweepStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class TrialStatus(str, enum.Enum):
    ok = "ok"
    pruned = "pruned"
    compile_error = "compile_error"
    crash = "crash"
    timeout = "timeout"
    wrong = "wrong"


class LeasedJob:
    """The columns the job queue (``tuner.sweep.queue``) claims, renews and closes: sweeps and training runs.

    ``status`` holds the job's own status names, of which ``queued``, ``running`` and ``cancelled``
    are shared by every kind of job.
    """

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default=SweepStatus.queued.value)
    owner: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)


class Sweep(LeasedJob, Base):
    __tablename__ = "tuner_sweeps"
    __table_args__ = (Index("ix_tuner_sweeps_status_heartbeat", "status", "heartbeat_at"),)

    kernel: Mapped[str] = mapped_column(String(128), index=True)
    arch: Mapped[str] = mapped_column(String(32))  # as asked: "auto" until a server resolves it
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)

    trials: Mapped[list[Trial]] = relationship(back_populates="sweep")


class Trial(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (Index("ix_tuner_trials_sweep_identity", "sweep_id", "identity"),
                      Index("ix_tuner_trials_sweep_shape", "sweep_id", "shape_key"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("tuner_sweeps.id"), index=True)
    kernel: Mapped[str] = mapped_column(String(128), index=True)
    shape_key: Mapped[str] = mapped_column(String(255), index=True)
    arch: Mapped[str] = mapped_column(String(32), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    identity: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    median_ms: Mapped[float | None] = mapped_column(Float)
    p20_ms: Mapped[float | None] = mapped_column(Float)
    p80_ms: Mapped[float | None] = mapped_column(Float)
    reps: Mapped[int | None] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    node: Mapped[str | None] = mapped_column(String(64))  # the Ray node id of the worker that measured it
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    sm_count: Mapped[int | None] = mapped_column(Integer)
    versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    retime_ms: Mapped[float | None] = mapped_column(Float)
    is_winner: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    sweep: Mapped[Sweep] = relationship(back_populates="trials")
