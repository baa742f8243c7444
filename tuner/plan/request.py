"""One ``tuner plan`` request end to end: validate, load profiles, search every (pp, vpp), compare with
the last stored plan of the same request, store the new one.

The steps, in order:

1. the request is validated (:class:`PlanRequest`; errors name the field);
2. the costs come from the profiles of the GPU kind planned for (the database's, else the packaged
   ones), or of ``profiles_from`` with every time scaled by ``scale_time`` (then every output marks
   the plan borrowed);
3. every (pp, vpp) the cluster allows (``parallel.parallelisms``) becomes an iteration model, and
   one search over all of them returns the best plans and a proven lower bound;
   Steps 1-3 happen once per request in :func:`resolve`, into the :class:`Resolved` object that
   the search, the report and the staleness check read (a node sweep resolves once and re-derives
   only the candidates per node count);
4. the newest stored plan of the same request is stale when the profile rows or kernel tables it
   was computed from are no longer the newest, or when the target's tuned table has changed since
   the profiles were measured;
5. the plan is stored in ``tuner_plans``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator
from sqlalchemy import Engine, select

from db import session_scope
from db.planning import StoredPlan
from tuner.plan.costs import Calibration, MemoryModel, ProfiledCosts
from tuner.plan.hardware import GpuKind, UnknownGpu, gpu_kind
from tuner.plan.iteration import IterationModel, Plan, PlanInputs
from tuner.plan.parallel import Cluster, Parallelism, ParallelismError, parallelisms
from tuner.plan.profiles import LoadedCosts, ProfilesMissing, load_costs
from tuner.plan.search import NoPlanFits, SearchResult, search
from v4.config import ModelConfig, PresetError, load_preset
from v4.layout import megatron_recompute

GiB = 1 << 30
DEFAULT_TOLERANCE = 0.002  # prune what cannot beat the best plans by more than 0.2 %
SEARCH_NODES = 4_000  # partial splits expanded per request, shared by its (pp, vpp)
MIN_NODES = 100  # per (pp, vpp), however many there are


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
        return request

    def key(self) -> str:
        """Same plan question, same key: every field but how many plans to show and the FLOPs figure."""
        data = self.model_dump(exclude={"top", "flops_per_token"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Resolved:
    """A request resolved once: the model preset, the GPU kinds, the (pp, vpp) candidates, the costs
    with their source, the capacity and the calibration. The search, the report, the stored plan
    and the staleness check all read this one object; nothing downstream loads a preset or a
    profile again.

    ``candidates`` is empty, with ``unplannable`` saying why, when the cluster cannot run the
    request at all (a node sweep shows that as its row instead of stopping).
    """

    request: PlanRequest
    config: ModelConfig
    gpu: GpuKind
    source: GpuKind
    candidates: tuple[Parallelism, ...]
    unplannable: RequestError | None
    loaded: LoadedCosts
    costs: ProfiledCosts
    capacity_bytes: float
    capacity_measured: bool
    flops_per_token: float
    calibration: Calibration

    @property
    def borrowed(self) -> bool:
        """Whether the costs are another GPU kind's profiles (``--profiles-from``)."""
        return self.source != self.gpu

    @property
    def label(self) -> str | None:
        """How the costs were obtained when not from the GPU's own profiles (shown with every output)."""
        if not self.borrowed:
            return None
        return (f"BORROWED: planned for {self.gpu.name} from {self.source.name} profiles with times scaled by "
                f"{self.request.scale_time or 1.0:g} and the {self.gpu.name} datasheet memory")

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

    def for_nodes(self, nodes: int) -> Resolved:
        """The same request on ``nodes`` nodes: only the candidates change (the costs are reused)."""
        request = self.request.model_copy(update={"nodes": nodes})
        candidates, problem = _candidates(request, self.config)
        return dataclasses.replace(self, request=request, candidates=candidates, unplannable=problem)

    def models(self) -> list[IterationModel]:
        """One iteration model per candidate (pp, vpp). Raises the request's RequestError when there is none."""
        if self.unplannable is not None:
            raise self.unplannable
        try:
            return [IterationModel.from_profiles(PlanInputs(self.costs, par, self.capacity_bytes), self.calibration)
                    for par in self.candidates]
        except ValueError as exc:  # profiles that cannot price this parallelism (e.g. EP across nodes)
            raise RequestError("ep", str(exc)) from None


@functools.lru_cache(maxsize=32)
def training_flops(config: ModelConfig, seq: int) -> float:
    """Model FLOPs per trained token (``v4.flops``; recompute not counted)."""
    from v4.flops import model_flops  # imports torch, so only when a request does not give the figure

    return model_flops(config, seq).training


def _candidates(request: PlanRequest, config: ModelConfig) -> tuple[tuple[Parallelism, ...], RequestError | None]:
    try:
        return tuple(parallelisms(Cluster(request.nodes, request.gpus_per_node), gbs=request.gbs, mbs=request.mbs,
                                  ep=request.ep, layers=config.layers + config.mtp_layers, pp=request.pp,
                                  vpp=request.vpp)), None
    except ParallelismError as exc:
        return (), RequestError(exc.field, exc.reason)


def resolve(engine: Engine, request: PlanRequest, calibration: Calibration | None = None, *,
            sweep: bool = False) -> Resolved:
    """Load the preset and the profiles of ``request`` once (see :class:`Resolved`).

    The profiles are the database's rows for the GPU kind planned for (or ``profiles_from``), else
    the packaged ones of that kind. Raises RequestError for an unknown model or, unless ``sweep``
    (other node counts may work), for a cluster that cannot run the request; ProfilesMissing, with
    what to do, when neither the database nor the package has the profiles.
    """
    try:
        config = load_preset(request.model)
    except PresetError as exc:
        raise RequestError("model", str(exc)) from None
    candidates, problem = _candidates(request, config)
    if problem is not None and not sweep:
        raise problem
    gpu = gpu_kind(request.gpu)
    source = gpu_kind(request.profiles_from) if request.profiles_from else gpu
    try:
        loaded = load_costs(engine, source.device_name, request.model, request.seq, request.mbs, request.ep,
                            request.kernels, config=config, packaged=source.name)
    except ProfilesMissing as exc:
        measure = (f"measure them on a {source.name} with `tuner profile layers --model {request.model} --seq "
                   f"{request.seq} --mbs {request.mbs} --ep {request.ep} --kernels triton`")
        advice = measure if source != gpu else (
            f"{measure}, or plan from another GPU kind's profiles with --profiles-from KIND [--scale-time F] "
            f"(the output is then marked borrowed)")
        raise ProfilesMissing(f"{gpu.name}: {exc}; {advice}") from None
    costs = loaded.costs.scaled(request.scale_time) if request.scale_time else loaded.costs
    measured = source == gpu and loaded.gpu_memory_bytes is not None
    capacity = float(loaded.gpu_memory_bytes if measured else gpu.memory_bytes)
    flops = request.flops_per_token or training_flops(config, request.seq)
    return Resolved(request, config, gpu, source, candidates, problem, loaded, costs, capacity, measured, flops,
                    calibration or Calibration())


@dataclass(frozen=True)
class Outcome:
    """A planned request: the resolved request, the plans, staleness, the stored row and the CPU time it took."""

    resolved: Resolved
    result: SearchResult
    stale: tuple[str, ...]
    plan_id: int
    cpu_s: float = 0.0

    # what the report, the CLI and the validation read, all from the one resolved request
    request = property(lambda self: self.resolved.request)
    gpu = property(lambda self: self.resolved.gpu)
    source = property(lambda self: self.resolved.source)
    capacity_bytes = property(lambda self: self.resolved.capacity_bytes)
    capacity_measured = property(lambda self: self.resolved.capacity_measured)
    loaded = property(lambda self: self.resolved.loaded)
    calibration = property(lambda self: self.resolved.calibration)
    flops_per_token = property(lambda self: self.resolved.flops_per_token)
    label = property(lambda self: self.resolved.label)
    warnings = property(lambda self: self.resolved.warnings)

    @property
    def plans(self) -> tuple[Plan, ...]:
        return self.result.plans

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
            "borrowed": self.resolved.borrowed,
            "gpu": self.gpu.name, "profiles_from": self.source.name, "profiles_source": self.loaded.source,
            "capacity_bytes": self.capacity_bytes,
            "capacity_measured": self.capacity_measured, "flops_per_token": self.flops_per_token,
            "lower_bound_ms": self.result.lower_bound_ms, "gap": self.result.gap,
            "splits_simulated": self.result.leaves, "planning_cpu_s": self.cpu_s,
            "plans": [self.plan_dict(p) for p in self.plans], "stale": list(self.stale),
            "warnings": list(self.warnings),
            "kernel_tables": self.loaded.kernel_tables, "profile_rows": [r.to_dict() for r in self.loaded.rows],
            "calibration": self.calibration.to_dict(),
        }


def plan_request(engine: Engine, request: PlanRequest | Resolved, calibration: Calibration | None = None, *,
                 tolerance: float = DEFAULT_TOLERANCE, nodes: int | None = SEARCH_NODES) -> Outcome:
    """Plan ``request`` (see the module doc). Raises RequestError, ProfilesMissing or NoPlanFits.

    ``request`` may be already resolved (a node sweep resolves once); ``calibration`` applies to
    an unresolved one. ``nodes`` caps the search (None: exhaustive), split evenly over the
    (pp, vpp) candidates with at least 100 each; the outcome's gap says how close to optimal
    that got. ``cpu_s`` of the outcome is the CPU time of resolving and searching.
    """
    start = time.process_time()
    resolved = request if isinstance(request, Resolved) else resolve(engine, request, calibration)
    models = resolved.models()
    per_model = None if nodes is None else max(MIN_NODES, nodes // len(models))
    result = search(models, keep=resolved.request.top, tolerance=tolerance, max_nodes=per_model)
    cpu_s = time.process_time() - start
    outcome = Outcome(resolved, result, staleness(engine, resolved), 0, cpu_s)
    return dataclasses.replace(outcome, plan_id=_store(engine, outcome))


def no_fit_reason(exc: NoPlanFits) -> str:
    """A NoPlanFits in one line: where it came closest, by how much it missed, and whether weights alone do."""
    what = "weights + optimizer alone" if exc.static_bytes > exc.capacity_bytes else "with every layer recomputed"
    return (f"nothing fits: at best pp {exc.pp} x vpp {exc.vpp} rank {exc.rank} is {exc.overflow_bytes / GiB:.1f} "
            f"GiB over, {what}")


def plan_node_counts(engine: Engine, request: PlanRequest, counts: Sequence[int],
                     calibration: Calibration | None = None) -> dict[str, Any]:
    """Plan ``request`` on every node count of ``counts``, resolving it once (its ``nodes`` is ignored).

    Returns ``rows`` (per count: ``fits`` with the best plan, its gap, peak bytes and CPU time,
    or why nothing fits), ``smallest_fitting`` (None when none fits), ``cpu_s`` (the whole sweep,
    resolving included) and ``resolved``. Raises what :func:`resolve` raises.
    """
    start = time.process_time()
    resolved = resolve(engine, request, calibration, sweep=True)
    rows: list[dict[str, Any]] = []
    for n in counts:
        began = time.process_time()
        try:
            outcome = plan_request(engine, resolved.for_nodes(n))
        except RequestError as exc:
            rows.append({"nodes": n, "fits": False, "why": f"--{exc.field.replace('_', '-')}: {exc.reason}",
                         "cpu_s": time.process_time() - began})
            continue
        except NoPlanFits as exc:
            rows.append({"nodes": n, "fits": False, "why": no_fit_reason(exc), "cpu_s": time.process_time() - began})
            continue
        best = outcome.plan_dict(outcome.plans[0])
        rows.append({"nodes": n, "fits": True, "plan": best, "gap": outcome.result.gap,
                     "lower_bound_ms": outcome.result.lower_bound_ms, "cpu_s": outcome.cpu_s,
                     "plan_id": outcome.plan_id, "peak_bytes": max(s["total_bytes"] for s in best["stages"])})
    fitting = [row["nodes"] for row in rows if row["fits"]]
    return {"resolved": resolved, "rows": rows, "smallest_fitting": min(fitting, default=None),
            "cpu_s": time.process_time() - start}


def current_tables_key(profile_key: str) -> str | None:
    """What a ``triton:<arch>:<hash>`` profile key reads now, from the arch's current table (None: not Triton)."""
    kernels, _, rest = profile_key.partition(":")
    if kernels != "triton" or not rest:
        return None
    from kernels.provenance import kernel_tables, tables_key  # imports torch (kernels.arch)

    return tables_key(kernel_tables("triton", rest.split(":")[0]))


def staleness(engine: Engine, resolved: Resolved) -> tuple[str, ...]:
    """Why the last stored plan of this request, or the profiles themselves, are out of date (empty: they are not)."""
    request, loaded = resolved.request, resolved.loaded
    notes = []
    now = {row.layer_kind: row for row in loaded.rows}
    with session_scope(engine) as session:
        last = session.scalars(select(StoredPlan).filter_by(request_key=request.key())
                               .order_by(StoredPlan.created_at.desc(), StoredPlan.id.desc()).limit(1)).one_or_none()
        if last is not None:
            used = {(r["layer_kind"], r["id"], r["created_at"]) for r in last.profile_rows}
            changed = sorted(kind for kind, row in now.items()
                             if (kind, row.id, row.created_at.isoformat()) not in used)
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
