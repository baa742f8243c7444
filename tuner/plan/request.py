"""One ``tuner plan`` request end to end: validate, load profiles, search every (pp, vpp), compare with
the last stored plan of the same request, store the new one.

The steps, in order:

1. the request is validated (:class:`PlanRequest`; errors name the field);
2. the costs come from the profiles of the GPU kind planned for, or of ``profiles_from`` with every
   time scaled by ``scale_time`` (then every output says so);
3. every (pp, vpp) the cluster allows (``parallel.parallelisms``) becomes an iteration model, and
   one search over all of them returns the best plans and a proven lower bound;
4. the newest stored plan of the same request is stale when the profile rows or kernel tables it
   was computed from are no longer the newest, or when the target's tuned table has changed since
   the profiles were measured;
5. the plan is stored in ``tuner_plans``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator
from sqlalchemy import Engine, select

from db import session_scope
from db.planning import StoredPlan
from tuner.plan.costs import Calibration, MemoryModel, ProfiledCosts
from tuner.plan.hardware import GpuKind, UnknownGpu, gpu_kind
from tuner.plan.iteration import IterationModel, Plan, PlanInputs
from v4.layout import megatron_recompute
from tuner.plan.parallel import Cluster, Parallelism, ParallelismError, parallelisms
from tuner.plan.profiles import LoadedCosts, ProfilesMissing, load_costs
from tuner.plan.search import SearchResult, search
from kernels.provenance import kernel_tables, tables_key
from v4.config import PresetError, load_preset

DEFAULT_TOLERANCE = 0.002  # prune what cannot beat the best plans by more than 0.2 %
SEARCH_NODES = 4_000  # partial splits expanded per request, shared by its (pp, vpp): a V4-Flash request in seconds


class RequestError(ValueError):
    """A request that cannot be planned; ``field`` names the argument at fault."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


class PlanRequest(BaseModel):
    """What ``tuner plan`` asks for; ``pp`` / ``vpp`` None mean auto."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    nodes: PositiveInt
    gpus_per_node: PositiveInt
    gpu: str
    gbs: PositiveInt
    mbs: PositiveInt = 1
    seq: PositiveInt
    ep: PositiveInt = 8
    pp: PositiveInt | None = None
    vpp: PositiveInt | None = None
    top: PositiveInt = 5
    profiles_from: str | None = None
    kernels: Literal["triton", "eager"] | None = Field(
        None, description="the kernel path whose profiles to plan from (default: Triton where profiled)")
    scale_time: PositiveFloat | None = None
    flops_per_token: PositiveFloat | None = Field(None, description="model FLOPs per trained token (default: v4.flops)")

    @model_validator(mode="after")
    def _check(self) -> PlanRequest:
        if self.scale_time is not None and self.profiles_from is None:
            raise ValueError("scale_time: only applies with profiles_from")
        return self

    @classmethod
    def parse(cls, **fields: Any) -> PlanRequest:
        """Validate, turning the first problem into a RequestError that names the field."""
        try:
            request = cls(**fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            message = error["msg"].removeprefix("Value error, ")
            if not error["loc"]:  # a rule across fields: its message starts with the field it blames
                field, _, message = message.partition(": ")
                raise RequestError(field, message) from None
            raise RequestError(str(error["loc"][0]), message) from None
        for field in ("gpu", "profiles_from"):
            name = getattr(request, field)
            if name is not None:
                try:
                    gpu_kind(name)
                except UnknownGpu as exc:
                    raise RequestError(field, str(exc)) from None
        try:
            load_preset(request.model)
        except PresetError as exc:
            raise RequestError("model", str(exc)) from None
        return request

    def key(self) -> str:
        """Same plan question, same key: every field but how many plans to show and the FLOPs figure."""
        data = self.model_dump(exclude={"top", "flops_per_token"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Outcome:
    """A planned request: the plans, where their costs came from, staleness, and the stored row."""

    request: PlanRequest
    gpu: GpuKind
    source: GpuKind
    capacity_bytes: float
    capacity_measured: bool
    loaded: LoadedCosts
    calibration: Calibration
    result: SearchResult
    flops_per_token: float
    stale: tuple[str, ...]
    plan_id: int

    @property
    def plans(self) -> tuple[Plan, ...]:
        return self.result.plans

    @property
    def label(self) -> str | None:
        """How the costs were obtained when not from the GPU's own profiles (shown with every output)."""
        if self.source == self.gpu:
            return None
        return (f"planned for {self.gpu.name} from {self.source.name} profiles with times scaled by "
                f"{self.request.scale_time or 1.0:g}")

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the plans leave unpriced that the request needs (shown with every output).

        An EP group inside a node without a measured all-to-all is priced 0 (across nodes the
        request is refused instead: ``IterationModel.from_profiles``).
        """
        r = self.request
        if r.ep == 1 or self.loaded.alltoall_measured:
            return ()
        return (f"the EP all-to-all (ep={r.ep}) is not priced: it was not measured for {r.model} on "
                f"{self.source.device_name!r} at seq {r.seq}, mbs {r.mbs}, ep {r.ep}, so every MoE layer's "
                f"dispatch + combine counts as 0 ms; measure it on one node with `tuner profile alltoall "
                f"--model {r.model} --seq {r.seq} --mbs {r.mbs} --ep {r.ep}`",)

    def tokens_per_s_per_gpu(self, plan: Plan) -> float:
        r = self.request
        return r.gbs * r.seq / (plan.step_ms / 1e3) / (r.nodes * r.gpus_per_node)

    def tflops_per_gpu(self, plan: Plan) -> float:
        return self.tokens_per_s_per_gpu(plan) * self.flops_per_token / 1e12

    def plan_dict(self, plan: Plan) -> dict[str, Any]:
        """A plan as JSON: layout, recompute (ids and Megatron flags), predictions, memory per stage."""
        model, ev = plan.model, plan.evaluation
        return {
            "layout": plan.layout_text, "pp": model.pp, "vpp": model.vpp,
            "dp": model.inputs.parallelism.dp if model.inputs else None, "ep": self.request.ep,
            "microbatches": model.microbatches,
            "recompute_layer_ids": list(plan.recompute_layer_ids),
            "megatron_recompute": megatron_recompute(plan.layout, plan.recompute_layer_ids),
            "step_ms": plan.step_ms, "pipeline_ms": ev.makespan_ms,
            "bubble_fraction": ev.schedule.bubble_fraction,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu(plan), "tflops_per_gpu": self.tflops_per_gpu(plan),
            "stages": [{"rank": r, "in_flight": MemoryModel.in_flight(r, model.pp, model.microbatches, model.vpp),
                        "weights_and_grads_bytes": m.weights_and_grads, "optimizer_bytes": m.optimizer,
                        "activation_bytes": m.activations, "workspace_bytes": m.workspace,
                        "buffer_bytes": m.buffers, "total_bytes": m.total,
                        "headroom_bytes": self.capacity_bytes - m.total}
                       for r, m in enumerate(ev.memory)],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id, "request": self.request.model_dump(), "label": self.label,
            "gpu": self.gpu.name, "profiles_from": self.source.name, "capacity_bytes": self.capacity_bytes,
            "capacity_measured": self.capacity_measured, "flops_per_token": self.flops_per_token,
            "lower_bound_ms": self.result.lower_bound_ms, "gap": self.result.gap,
            "splits_simulated": self.result.leaves,
            "plans": [self.plan_dict(p) for p in self.plans], "stale": list(self.stale),
            "warnings": list(self.warnings),
            "kernel_tables": self.loaded.kernel_tables, "profile_rows": [r.to_dict() for r in self.loaded.rows],
            "calibration": self.calibration.to_dict(),
        }


def default_flops_per_token(model: str, seq: int) -> float:
    """Model FLOPs per trained token from the preset (``v4.flops``; recompute not counted)."""
    from v4.flops import model_flops

    return model_flops(load_preset(model), seq).training


def request_parallelisms(request: PlanRequest) -> list[Parallelism]:
    """The (pp, vpp) candidates of ``request``; RequestError naming the field when there are none."""
    config = load_preset(request.model)
    try:
        return parallelisms(Cluster(request.nodes, request.gpus_per_node), gbs=request.gbs, mbs=request.mbs,
                            ep=request.ep, layers=config.layers + config.mtp_layers, pp=request.pp, vpp=request.vpp)
    except ParallelismError as exc:
        raise RequestError(exc.field, exc.reason) from None


def request_costs(engine: Engine, request: PlanRequest) -> tuple[LoadedCosts, ProfiledCosts, float, bool]:
    """The profiles ``request`` plans from, its costs (scaled by ``scale_time``), the GPU capacity in
    bytes, and whether that capacity was measured on the profiled GPU (else the GPU kind's datasheet)."""
    gpu = gpu_kind(request.gpu)
    source = gpu_kind(request.profiles_from) if request.profiles_from else gpu
    try:
        loaded = load_costs(engine, source.device_name, request.model, request.seq, request.mbs, request.ep,
                            request.kernels)
    except ProfilesMissing as exc:
        advice = ("profile it on that GPU (tuner profile layers ...)" if source != gpu else
                  "profile it (tuner profile layers ...), or plan from another kind's profiles with "
                  "--profiles-from KIND --scale-time F")
        raise ProfilesMissing(f"{exc}; {advice}") from None
    costs = loaded.costs.scaled(request.scale_time) if request.scale_time else loaded.costs
    measured = source == gpu and loaded.gpu_memory_bytes is not None
    return loaded, costs, float(loaded.gpu_memory_bytes if measured else gpu.memory_bytes), measured


def plan_request(engine: Engine, request: PlanRequest, calibration: Calibration | None = None, *,
                 tolerance: float = DEFAULT_TOLERANCE, nodes: int | None = SEARCH_NODES) -> Outcome:
    """Plan ``request`` (see the module doc). Raises RequestError, ProfilesMissing or NoPlanFits.

    ``nodes`` caps the search (None: exhaustive), split evenly over the (pp, vpp) candidates
    with at least 100 each; the outcome's gap says how close to optimal that got.
    """
    calibration = calibration or Calibration()
    gpu = gpu_kind(request.gpu)
    source = gpu_kind(request.profiles_from) if request.profiles_from else gpu
    candidates = request_parallelisms(request)
    loaded, costs, capacity, measured = request_costs(engine, request)
    try:
        models = [IterationModel.from_profiles(PlanInputs(costs, par, capacity), calibration) for par in candidates]
    except ValueError as exc:  # profiles that cannot price this parallelism (e.g. EP across nodes)
        raise RequestError("ep", str(exc)) from None
    per_model = None if nodes is None else max(100, nodes // len(models))
    result = search(models, keep=request.top, tolerance=tolerance, max_nodes=per_model)
    flops = request.flops_per_token or default_flops_per_token(request.model, request.seq)
    stale = staleness(engine, request, loaded)
    outcome = Outcome(request, gpu, source, capacity, measured, loaded, calibration, result, flops, stale, 0)
    return dataclasses.replace(outcome, plan_id=_store(engine, outcome))


def current_tables_key(profile_key: str) -> str | None:
    """What a ``triton:<arch>:<hash>`` profile key reads now, from the arch's current table (None: not Triton)."""
    kernels, _, rest = profile_key.partition(":")
    if kernels != "triton" or not rest:
        return None
    return tables_key(kernel_tables("triton", rest.split(":")[0]))


def staleness(engine: Engine, request: PlanRequest, loaded: LoadedCosts) -> tuple[str, ...]:
    """Why the last stored plan of this request, or the profiles themselves, are out of date (empty: they are not)."""
    notes = []
    now = {row.layer_kind: row for row in loaded.rows}
    with session_scope(engine) as session:
        last = session.scalars(select(StoredPlan).filter_by(request_key=request.key())
                               .order_by(StoredPlan.created_at.desc(), StoredPlan.id.desc()).limit(1)).one_or_none()
        if last is not None:
            changed = sorted(kind for kind, row in now.items()
                             if {"id": row.id, "created_at": row.created_at.isoformat()}
                             not in [{"id": r["id"], "created_at": r["created_at"]}
                                     for r in last.profile_rows if r["layer_kind"] == kind])
            if changed:
                notes.append(f"stored plan {last.id} ({last.created_at:%Y-%m-%d %H:%M}) is stale: newer profiles of "
                             f"{', '.join(changed)}")
            if last.kernel_tables != loaded.kernel_tables:
                notes.append(f"stored plan {last.id} is stale: it used kernel tables {last.kernel_tables}, the "
                             f"profiles now use {loaded.kernel_tables}")
    for key in sorted({row.kernel_tables for row in loaded.rows}):
        current = current_tables_key(key)
        if current is not None and current != key:
            notes.append(f"profiles were measured with kernel tables {key}, the tuned table is now {current}: "
                         "re-profile for plans that reflect the current kernels")
    return tuple(notes)


def _store(engine: Engine, outcome: Outcome) -> int:
    best = outcome.plans[0]
    with session_scope(engine) as session:
        row = StoredPlan(
            request_key=outcome.request.key(), request=outcome.request.model_dump(),
            plans=[outcome.plan_dict(p) for p in outcome.plans], step_ms=best.step_ms,
            tokens_per_s_per_gpu=outcome.tokens_per_s_per_gpu(best), tflops_per_gpu=outcome.tflops_per_gpu(best),
            lower_bound_ms=outcome.result.lower_bound_ms, calibration=outcome.calibration.to_dict(),
            profile_rows=[r.to_dict() for r in outcome.loaded.rows], kernel_tables=outcome.loaded.kernel_tables,
            profiles_from=outcome.source.name if outcome.source != outcome.gpu else None)
        session.add(row)
        session.flush()
        return row.id
