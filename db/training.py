"""SQLAlchemy model of a measured V4 training run (``tuner train run|queue``), queued and leased like a sweep.

A row holds the request (a ``v4.pipeline.RunConfig`` as JSON, the world size and the device as
asked) and, once run, what the run measured: every iteration's step time and losses, steady-state
step-time statistics with the warm-up iterations left out, throughput, memory per pipeline rank,
and the provenance that makes two rows comparable (resolved preset, layout, recompute plan,
kernels and tuned-table hash, versions, host and GPU).
"""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from db.models import Base, LeasedJob


class TrainStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    ok = "ok"
    oom = "oom"
    error = "error"
    cancelled = "cancelled"


class TrainRun(LeasedJob, Base):
    """One training run; the lease columns (status, owner, heartbeat, times, error) come from LeasedJob."""

    __tablename__ = "tuner_train_runs"

    # the request
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # RunConfig fields; device resolved when run
    world: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(8))  # as asked: auto, cpu or cuda
    preset: Mapped[str] = mapped_column(String(255), index=True)
    oom_stage: Mapped[int | None] = mapped_column(Integer)
    # what was run
    model: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the resolved ModelConfig
    layout: Mapped[str | None] = mapped_column(String(1024))  # canonical layout text
    recompute: Mapped[str | None] = mapped_column(String(1024))  # canonical recompute plan text
    kernels: Mapped[str | None] = mapped_column(String(16))
    kernel_tables: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # arch and sha256 of the tuned table used
    pp: Mapped[int | None] = mapped_column(Integer)
    vpp: Mapped[int | None] = mapped_column(Integer)
    dp: Mapped[int | None] = mapped_column(Integer)
    microbatches: Mapped[int | None] = mapped_column(Integer)
    # what was measured
    step_times_s: Mapped[list[float] | None] = mapped_column(JSON)
    losses: Mapped[list[float] | None] = mapped_column(JSON)
    mtp_losses: Mapped[list[float] | None] = mapped_column(JSON)
    step_median_s: Mapped[float | None] = mapped_column(Float)
    step_p20_s: Mapped[float | None] = mapped_column(Float)
    step_p80_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s_per_gpu: Mapped[float | None] = mapped_column(Float)
    model_tflops_per_gpu: Mapped[float | None] = mapped_column(Float)
    stage_memory: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # v4.pipeline.StageMemory per rank
    # where it ran
    versions: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # python, torch, triton, cuda, hip, driver
    host: Mapped[str | None] = mapped_column(String(255))
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    # the plan this run validates (``tuner plan validate``) and which of its candidates it ran
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_plans.id"), index=True)
    plan_candidate: Mapped[str | None] = mapped_column(String(64))
