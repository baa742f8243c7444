"""SQLAlchemy model of a plan validation (``tuner plan validate``): a stored plan checked against real runs.

One row per validation: the plan it checked, where the runs ran, the calibration the predictions
used and the one refitted from the runs, the fit's figures, and per candidate (the planner's top
plans and the baselines) its predictions and the id of the training run that measured it (the
``tuner_train_runs`` rows also carry ``plan_id`` and ``plan_candidate``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from db.models import Base, utcnow


class PlanValidation(Base):
    __tablename__ = "tuner_plan_validations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("tuner_plans.id"), index=True)
    gpu_kind: Mapped[str] = mapped_column(String(255), index=True)  # as profiles are keyed: "NVIDIA H200", "cpu"
    device: Mapped[str] = mapped_column(String(8))  # cpu or cuda, as run
    iters: Mapped[int] = mapped_column(Integer)
    warmup_iters: Mapped[int] = mapped_column(Integer)
    calibration_before: Mapped[dict[str, Any]] = mapped_column(JSON)
    calibration_after: Mapped[dict[str, Any]] = mapped_column(JSON)  # refitted from the runs
    fit: Mapped[dict[str, Any]] = mapped_column(JSON)  # what was fitted, over how many points, residuals
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # predictions, run id, measured figures
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
