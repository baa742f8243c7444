"""Per-layer profiles in the database: store what the profiler measured, read it back as planner costs.

A row is one layer kind (``db.planning.LAYER_KINDS``) of one model preset, measured on one GPU
kind at one (seq, mbs, ep) with one set of kernel tables. Storing a row with the same key again
replaces it (newest wins; ``created_at`` moves on). Loading takes, per layer kind, the newest row
of that (GPU kind, model, seq, mbs, ep), whatever its kernel tables, and maps every layer id of
the model to its kind with the preset (``v4.config.layer_kind``: the attention type from the
layer's compress ratio, hash routing for the first ``hash_layers`` layers, the MTP layer).

When the database has no rows of the GPU kind at the key, ``load_costs`` reads the profiles
shipped with the package for that kind (``tuner.plan.packaged``) and says so in
``LoadedCosts.source``; a database row, even of an incomplete set, always wins over them.

The EP all-to-all (``tuner profile alltoall``) is stored apart, one row per (GPU kind, model,
seq, mbs, ep) in ``tuner_alltoall_profiles``: it depends on neither the layer kind (every V4
layer has the same MoE volume) nor the kernel tables, so the loader needs one lookup by the key
it already has and gives the time to every MoE layer (all decoder layers and the MTP layer);
a re-profile of the layers, or layers profiled later with other tables, neither wipes nor lacks
it. Storing it on the layer rows instead would copy one number onto every kind and kernel path.
The row is listed with the layer rows a plan was computed from (kind ``alltoall``), so a stored
plan is stale once the all-to-all is measured again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, select

from db import session_scope
from db.models import utcnow
from db.planning import LAYER_KINDS, AlltoallProfile, LayerProfile
from tuner.plan.costs import LayerCost, ProfiledCosts, StageExtras
from tuner.plan.packaged import packaged_kinds, packaged_profile
from v4.config import ModelConfig, layer_kind, load_preset

EXTRA_KINDS = ("embedding", "head")
ALLTOALL_KIND = "alltoall"  # how a plan lists the all-to-all row among its profile rows


class ProfileError(ValueError):
    """Profiles that cannot be stored or used; the message says which and why."""


class ProfilesMissing(LookupError):
    """The database lacks the layer kinds a model needs at the asked (GPU kind, seq, mbs, ep)."""


class Measured(Protocol):
    """What the profiler hands over per layer kind (``tuner.train.profile_layers.LayerCost`` has these)."""

    layer_kind: str
    forward_ms: float
    backward_ms: float
    recompute_backward_ms: float
    activation_bytes: int
    recompute_kept_bytes: int
    params: int
    optimizer_ms_per_param: float | None
    p2p_bytes: int


_NUMBERS = ("forward_ms", "backward_ms", "recompute_backward_ms", "activation_bytes", "recompute_kept_bytes",
            "params", "p2p_bytes")


def _check(cost: Measured) -> None:
    if cost.layer_kind not in LAYER_KINDS:
        raise ProfileError(f"layer_kind must be one of {LAYER_KINDS}, got {cost.layer_kind!r}")
    for name in _NUMBERS + ("optimizer_ms_per_param", "expert_params"):
        value = getattr(cost, name, None)
        if value is None and name not in _NUMBERS:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"{cost.layer_kind}.{name} must be a finite number >= 0, got {value!r}")


def store_profiles(engine: Engine, costs: Iterable[Measured], *, gpu_kind: str, gpu_memory_bytes: int | None,
                   model: str, seq: int, mbs: int, ep: int, kernel_tables: str,
                   toolchain: dict[str, Any] | None = None) -> list[int]:
    """Store one row per measured layer kind, replacing rows with the same key; returns their ids.

    ``costs`` may carry ``expert_params`` (expert weights among ``params``); without it the
    loader derives them from the preset.
    """
    costs = list(costs)
    for cost in costs:
        _check(cost)
    kinds = [c.layer_kind for c in costs]
    if len(set(kinds)) != len(kinds):
        raise ProfileError(f"one measurement per layer kind, got {sorted(kinds)}")
    key = dict(gpu_kind=gpu_kind, model=model, seq=seq, mbs=mbs, ep=ep, kernel_tables=kernel_tables)
    ids = []
    with session_scope(engine) as session:
        for cost in costs:
            row = session.scalars(select(LayerProfile).filter_by(layer_kind=cost.layer_kind, **key)).one_or_none()
            if row is None:
                row = LayerProfile(layer_kind=cost.layer_kind, **key)
                session.add(row)
            for name in _NUMBERS + ("optimizer_ms_per_param",):
                setattr(row, name, getattr(cost, name))
            row.expert_params = getattr(cost, "expert_params", None)
            row.selective_kept_bytes = getattr(cost, "selective_kept_bytes", None)
            row.gpu_memory_bytes = gpu_memory_bytes
            row.toolchain = toolchain or {}
            row.created_at = utcnow()
            session.flush()
            ids.append(row.id)
    return ids


class MeasuredAlltoall(Protocol):
    """What ``workers.alltoall_cost.AlltoallCost`` hands over."""

    dispatch_ms: float
    combine_ms: float
    alltoall_ms: float
    gbps: float
    reps: int


def store_alltoall(engine: Engine, cost: MeasuredAlltoall, *, gpu_kind: str, model: str, seq: int, mbs: int, ep: int,
                   rows_per_rank: int, hidden: int, bytes_per_rank: int,
                   toolchain: dict[str, Any] | None = None) -> int:
    """Store one all-to-all measurement, replacing the row with the same key; returns its id."""
    for name in ("dispatch_ms", "combine_ms", "alltoall_ms", "gbps"):
        value = getattr(cost, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"alltoall.{name} must be a finite number >= 0, got {value!r}")
    key = dict(gpu_kind=gpu_kind, model=model, seq=seq, mbs=mbs, ep=ep)
    with session_scope(engine) as session:
        row = session.scalars(select(AlltoallProfile).filter_by(**key)).one_or_none()
        if row is None:
            row = AlltoallProfile(**key)
            session.add(row)
        row.rows_per_rank, row.hidden, row.bytes_per_rank = rows_per_rank, hidden, bytes_per_rank
        row.dispatch_ms, row.combine_ms, row.alltoall_ms = cost.dispatch_ms, cost.combine_ms, cost.alltoall_ms
        row.gbps, row.reps, row.toolchain, row.created_at = cost.gbps, cost.reps, toolchain or {}, utcnow()
        session.flush()
        return row.id


def stored_alltoall(engine: Engine, gpu_kind: str, model: str, seq: int, mbs: int, ep: int) -> AlltoallProfile | None:
    """The all-to-all measured at the key, or None."""
    with session_scope(engine) as session:
        return session.scalars(select(AlltoallProfile).filter_by(
            gpu_kind=gpu_kind, model=model, seq=seq, mbs=mbs, ep=ep)).one_or_none()


@dataclass(frozen=True)
class ProfileRow:
    """Which stored row a layer kind's costs came from (what a plan records to detect staleness)."""

    id: int | None  # None: a packaged row (``tuner.plan.packaged``), which has no database id
    layer_kind: str
    created_at: datetime
    kernel_tables: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "layer_kind": self.layer_kind, "created_at": self.created_at.isoformat(),
                "kernel_tables": self.kernel_tables}


@dataclass(frozen=True)
class LoadedCosts:
    """The planner's costs for one model, and the rows they came from."""

    costs: ProfiledCosts
    rows: tuple[ProfileRow, ...]
    gpu_memory_bytes: int | None
    source: str = "database"
    """Where the rows came from: ``database``, or the packaged file with its provenance."""

    @property
    def kernel_tables(self) -> str:
        """The kernel tables the layer rows were measured with (one key, or several joined by ``+``)."""
        return "+".join(sorted({r.kernel_tables for r in self.rows if r.layer_kind != ALLTOALL_KIND}))

    @property
    def alltoall_measured(self) -> bool:
        """Whether the EP all-to-all of the key was measured (``tuner profile alltoall``)."""
        return any(r.layer_kind == ALLTOALL_KIND for r in self.rows)


def model_layer_kinds(config: ModelConfig) -> list[str]:
    """The profile kind of every layer id of the model, the MTP layer last."""
    return [layer_kind(config, i) for i in config.layer_ids]


def expert_params(config: ModelConfig, ep: int) -> int:
    """Expert weights one GPU holds per MoE layer: ``experts / ep`` experts of W1, W3 (D -> F) and W2 (F -> D)."""
    return config.experts // ep * 3 * config.hidden * config.expert_ffn


PLANNING_ORDER = ("triton", "eager")  # without a choice: the kernels training runs with, else eager


def newest_rows(engine: Engine, gpu_kind: str, model: str, seq: int, mbs: int,
                ep: int) -> dict[str, dict[str, LayerProfile]]:
    """Per kernel path (``kernel_tables`` up to its first ':', e.g. ``triton:sm_90:...``) and layer
    kind, the newest stored row for the key."""
    with session_scope(engine) as session:
        rows = session.scalars(select(LayerProfile).filter_by(gpu_kind=gpu_kind, model=model, seq=seq, mbs=mbs, ep=ep)
                               .order_by(LayerProfile.created_at, LayerProfile.id)).all()
    by_path: dict[str, dict[str, LayerProfile]] = {}
    for row in rows:  # later rows win
        by_path.setdefault(row.kernel_tables.partition(":")[0], {})[row.layer_kind] = row
    return by_path


def profiled_gpu_kinds(engine: Engine, model: str, seq: int, mbs: int, ep: int) -> list[str]:
    """The GPU kinds with any profile row of ``model`` at (seq, mbs, ep)."""
    with session_scope(engine) as session:
        return sorted(session.scalars(select(LayerProfile.gpu_kind).filter_by(model=model, seq=seq, mbs=mbs, ep=ep)
                                      .distinct()).all())


def load_costs(engine: Engine, gpu_kind: str, model: str, seq: int, mbs: int, ep: int,
               kernels: str | None = None, *, config: ModelConfig | None = None,
               packaged: str | None = None) -> LoadedCosts:
    """The planner's costs of ``model`` (a preset) from the newest profiles at (gpu_kind, seq, mbs, ep).

    The rows come from one kernel path: ``kernels`` (triton or eager), else the Triton rows when
    they cover the model (the kernels training runs with), else the eager ones; never a mix, and
    never the eager rows just because they were profiled later. When the database has no such
    rows, the profiles shipped for GPU kind ``packaged`` (``tuner.plan.packaged``) stand in, and
    :attr:`LoadedCosts.source` says so. ``config`` is the preset when the caller already loaded it.

    Every decoder layer and the MTP layer take their kind's costs; the embedding and the head
    become the stage extras. ``p2p_bytes`` is the most any stage boundary sends (after a decoder
    layer or the embedding); ``optimizer_ms_per_param`` the parameter-weighted mean over the
    layers that measured it; ``alltoall_ms`` of every layer (all are MoE layers) the stored
    all-to-all of the key, None when it was not measured. Raises ProfilesMissing naming the
    missing kinds.
    """
    config = config or load_preset(model)
    kinds = model_layer_kinds(config)
    if kernels is not None and kernels not in PLANNING_ORDER:
        raise ValueError(f"kernels: {kernels!r} is not one of {', '.join(PLANNING_ORDER)}")
    needed = list(dict.fromkeys(kinds + list(EXTRA_KINDS)))
    by_path = newest_rows(engine, gpu_kind, model, seq, mbs, ep)
    paths = [kernels] if kernels else list(PLANNING_ORDER)
    source, alltoall = "database", None
    for path in paths:
        rows = by_path.get(path, {})
        missing = [k for k in needed if k not in rows]
        if not missing:
            alltoall = stored_alltoall(engine, gpu_kind, model, seq, mbs, ep)
            break
    if missing and packaged and not any(by_path.get(path) for path in paths):
        for path in paths:
            shipped = packaged_profile(packaged, model, seq, mbs, ep, path)
            if shipped is not None and all(k in shipped.rows for k in needed):
                rows, alltoall, source, missing = shipped.rows, shipped.alltoall, shipped.describe(), []
                break
    if missing:
        have = profiled_gpu_kinds(engine, model, seq, mbs, ep)
        shipped_kinds = packaged_kinds()
        what = "measured profiles" if len(missing) == len(needed) else f"{', '.join(missing)} profile"
        raise ProfilesMissing(
            f"no {what} of {model} on {gpu_kind!r} at seq {seq}, mbs {mbs}, ep {ep}"
            f" ({kernels or 'triton or eager'} kernels) in the database"
            + (f" or the packaged profiles (shipped for {', '.join(shipped_kinds) or 'no GPU kind'})" if packaged else "")
            + (f"; GPU kinds with profiles of it in the database: {', '.join(have)}" if have else ""))
    moe = expert_params(config, ep)

    def cost(kind: str) -> LayerCost:
        row = rows[kind]
        experts = row.expert_params if row.expert_params is not None else min(moe, row.params)
        return LayerCost(kind, row.forward_ms, row.backward_ms, row.activation_bytes,
                         min(row.recompute_kept_bytes, row.activation_bytes), row.params, experts,
                         max(0.0, row.recompute_backward_ms - row.backward_ms))

    layers = tuple(cost(k) for k in kinds)
    embedding, head = rows["embedding"], rows["head"]
    extras = StageExtras(embedding.forward_ms, embedding.backward_ms, embedding.activation_bytes, embedding.params,
                         head.forward_ms, head.backward_ms, head.activation_bytes, head.params)
    timed = [(rows[k].optimizer_ms_per_param, rows[k].params) for k in kinds + list(EXTRA_KINDS)
             if rows[k].optimizer_ms_per_param is not None]
    weight = sum(p for _, p in timed)
    optimizer = sum(t * p for t, p in timed) / weight if weight else None
    p2p = max(rows[k].p2p_bytes for k in set(kinds[:-1]) | {"embedding"})
    used = tuple(ProfileRow(rows[k].id, k, rows[k].created_at, rows[k].kernel_tables)
                 for k in sorted(set(kinds) | set(EXTRA_KINDS)))
    if alltoall is not None:
        used += (ProfileRow(alltoall.id, ALLTOALL_KIND, alltoall.created_at, ""),)
    alltoall_ms = tuple(None if alltoall is None else alltoall.alltoall_ms for _ in kinds)
    memory = {rows[k].gpu_memory_bytes for k in rows} - {None}
    return LoadedCosts(ProfiledCosts(layers, extras, alltoall_ms, p2p, optimizer), used, min(memory) if memory else None,
                       source)
