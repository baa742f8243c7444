"""SQLAlchemy models of the planner: per-layer profiles, EP all-to-all profiles and the plans made from them.

A profile row is one layer kind of one model measured on one GPU kind at one (seq, mbs, ep),
with the kernel tables it ran with; measuring the same again replaces the row (its
``created_at`` moves on), so a plan that recorded the rows' ids and times can tell when it
went stale. An all-to-all row is the expert-parallel dispatch + combine of one MoE layer
measured across ``ep`` GPUs of one node (``tuner profile alltoall``), keyed like the layer rows
but without layer kind or kernel tables: it depends on neither (every V4 layer has the same MoE
volume, and NCCL moves it whatever kernels run), so it is measured and stored once, survives a
re-profile of the layers, and serves rows profiled later with other tables. A plan row keeps the request, the chosen plan and the runners-up, the predicted
figures, the calibration and which profile rows and kernel tables it was computed from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from db.models import Base, utcnow

LAYER_KINDS = ("window/hash", "window/learned", "csa/hash", "csa/learned", "hca/hash", "hca/learned",
               "mtp", "embedding", "head")


class LayerProfile(Base):
    __tablename__ = "tuner_layer_profiles"
    __table_args__ = (UniqueConstraint("gpu_kind", "model", "seq", "mbs", "ep", "layer_kind", "kernel_tables",
                                       name="uq_tuner_layer_profiles_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_kind: Mapped[str] = mapped_column(String(255), index=True)  # the device name, e.g. "NVIDIA H200"
    gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)  # None when profiled on the CPU
    model: Mapped[str] = mapped_column(String(64), index=True)  # preset name
    seq: Mapped[int] = mapped_column(Integer)
    mbs: Mapped[int] = mapped_column(Integer)
    ep: Mapped[int] = mapped_column(Integer)
    layer_kind: Mapped[str] = mapped_column(String(32))
    forward_ms: Mapped[float] = mapped_column(Float)
    backward_ms: Mapped[float] = mapped_column(Float)
    recompute_backward_ms: Mapped[float] = mapped_column(Float)  # backward including the recompute forward
    activation_bytes: Mapped[int] = mapped_column(BigInteger)
    recompute_kept_bytes: Mapped[int] = mapped_column(BigInteger)
    selective_kept_bytes: Mapped[dict[str, int] | None] = mapped_column(JSON)  # per selective module alone
    params: Mapped[int] = mapped_column(BigInteger)  # held by one GPU: experts already divided by ep
    expert_params: Mapped[int | None] = mapped_column(BigInteger)  # of which expert weights (None: from the preset)
    optimizer_ms_per_param: Mapped[float | None] = mapped_column(Float)
    p2p_bytes: Mapped[int] = mapped_column(BigInteger)  # sent to the next stage per microbatch
    kernel_tables: Mapped[str] = mapped_column(Text)
    toolchain: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AlltoallProfile(Base):
    """One MoE layer's EP all-to-all at (gpu_kind, model, seq, mbs, ep), measured apart from the layer profiles.

    ``alltoall_ms`` is what the planner adds to a MoE layer's forward (and, the gradients
    moving the same volume back, to its backward and to its recompute): it is *not* inside
    the layer rows' ``forward_ms``, which one GPU measures without any EP traffic.
    """

    __tablename__ = "tuner_alltoall_profiles"
    __table_args__ = (UniqueConstraint("gpu_kind", "model", "seq", "mbs", "ep", name="uq_tuner_alltoall_profiles_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_kind: Mapped[str] = mapped_column(String(255), index=True)  # as the layer rows: "NVIDIA H200", "cpu"
    model: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    mbs: Mapped[int] = mapped_column(Integer)
    ep: Mapped[int] = mapped_column(Integer)
    rows_per_rank: Mapped[int] = mapped_column(BigInteger)  # mbs * seq * experts_per_token (token, expert) rows
    hidden: Mapped[int] = mapped_column(Integer)  # bf16 values per row
    bytes_per_rank: Mapped[int] = mapped_column(BigInteger)  # leaving one rank per all-to-all (its own share stays)
    dispatch_ms: Mapped[float] = mapped_column(Float)  # median over reps of the slowest rank
    combine_ms: Mapped[float] = mapped_column(Float)
    alltoall_ms: Mapped[float] = mapped_column(Float)  # dispatch + combine: one forward, intra-node
    gbps: Mapped[float] = mapped_column(Float)  # bytes leaving a rank per second over both, in GB/s
    reps: Mapped[int] = mapped_column(Integer)
    toolchain: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StoredPlan(Base):
    __tablename__ = "tuner_plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_key: Mapped[str] = mapped_column(String(64), index=True)  # hash of the canonical request
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    plans: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # the chosen plan first, then the runners-up
    step_ms: Mapped[float] = mapped_column(Float)
    tokens_per_s_per_gpu: Mapped[float] = mapped_column(Float)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Float)
    lower_bound_ms: Mapped[float] = mapped_column(Float)
    calibration: Mapped[dict[str, Any]] = mapped_column(JSON)
    profile_rows: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{id, layer_kind, created_at}]
    kernel_tables: Mapped[str] = mapped_column(Text)
    profiles_from: Mapped[str | None] = mapped_column(String(255))  # another GPU kind's profiles, if so
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
