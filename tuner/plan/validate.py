"""Close the planner's loop: run its best plans and two baselines as real training runs, compare, refit.

``validate(engine, request, top, ...)``, in order, and why:

1. plan ``request`` (``plan_request``: stored in ``tuner_plans``) under the starting calibration:
   the one given, else the newest one refitted on this GPU kind, else the defaults (on the CPU
   with no runtime reserve and no p2p buffers: what the CPU measures holds neither);
2. the candidates: the planner's ``top`` plans, then two baselines at the chosen plan's ``pp``
   with one virtual stage: Megatron's even split with uniform full recompute (every layer, the
   MTP layer included), and the even split without recompute when it is predicted to fit. A
   baseline that is also a planner plan runs once, with both roles;
3. each candidate is one short training run (``tuner.train.queue`` + ``tuner.train.serve.execute``
   over ``workers.train_runner.run_training``) of the request's preset on
   ``nodes x gpus_per_node`` ranks, stored as a ``TrainRun`` row with ``plan_id`` and
   ``plan_candidate``; an OOM run stays an OOM run (a mis-prediction when it was predicted to fit);
4. measured against predicted: the step is the run's median over the iterations after the
   warm-up; the memory of pipeline rank ``r`` is, on a GPU, its peak allocated bytes, on the
   CPU its static bytes plus its peak of bytes saved for backward (``v4.pipeline.StageMemory``);
5. the refit (least squares over the runs that finished; see :func:`fit_calibration`), stored in
   ``tuner_plan_validations`` with every candidate's figures, and the candidates re-ranked by
   their predicted step under the refitted calibration.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, select, update

from db import session_scope
from db.training import TrainRun
from db.validation import PlanValidation
from tuner.plan.costs import Calibration
from tuner.plan.hardware import gpu_kind
from tuner.plan.iteration import IterationModel, Plan, predict
from v4.layout import even_layout
from tuner.plan.request import Outcome, PlanRequest, RequestError, plan_request
from v4.recompute import RecomputePlan

PICK = "pick"
FULL_RECOMPUTE = "even split, full recompute"
NO_RECOMPUTE = "even split, no recompute"
CPU_CALIBRATION = Calibration(reserved_bytes=0.0, p2p_buffers=0.0)
LEASE_S = 600.0  # a validation run is claimed by this process only; the lease just has to outlive a heartbeat gap


@dataclass(frozen=True)
class Candidate:
    """A plan to run and why: ``pick``, ``runner-up N`` and / or a baseline."""

    roles: tuple[str, ...]
    plan: Plan

    @property
    def name(self) -> str:
        return " = ".join(self.roles)

    @property
    def predicted_fits(self) -> bool:
        return all(h >= 0 for h in self.plan.headroom_bytes)

    @property
    def recompute_text(self) -> str:
        return RecomputePlan(frozenset(self.plan.recompute_layer_ids)).text


@dataclass(frozen=True)
class Measured:
    """What a candidate's training run measured; figures are None unless ``status`` is ok."""

    run_id: int
    status: str
    step_ms: float | None
    stage_bytes: tuple[float, ...] | None
    oom_stage: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Fit:
    """The refitted terms (see :func:`fit_calibration`) and how many points each came from."""

    time_factor: float
    activation_factor: float
    overhead_bytes: float
    time_points: int
    memory_points: int

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "method": (
            "time: k minimising sum((k*predicted/measured - 1)^2), time_scale *= k; memory per rank: "
            "measured - static - p2p buffers = a*activations + c by least squares with a >= 1, c >= 0; "
            "fragmentation = a - 1, reserved_bytes = c")}


def model_at_vpp(plan: Plan, vpp: int) -> IterationModel:
    """The model of ``plan``'s pp with ``vpp`` virtual stages, under the same calibration: prices
    plans of another schedule (the baselines' 1F1B, a measured interleaved run) from the same profiles."""
    model = plan.model
    if model.vpp == vpp:
        return model
    if model.inputs is None or model.calibration is None:
        raise ValueError("the plan's model was not built from profiles; cannot price other schedules")
    parallelism = dataclasses.replace(model.inputs.parallelism, vpp=vpp)
    return IterationModel.from_profiles(dataclasses.replace(model.inputs, parallelism=parallelism), model.calibration)


def candidates(outcome: Outcome, top: int) -> list[Candidate]:
    """The planner's ``top`` plans, then the baselines (see the module doc); one candidate per distinct plan."""
    plans = {}
    roles: dict[tuple[str, tuple[int, ...]], list[str]] = {}

    def add(role: str, plan: Plan) -> None:
        key = (plan.layout_text, tuple(sorted(plan.recompute_layer_ids)))
        plans.setdefault(key, plan)
        roles.setdefault(key, []).append(role)

    for i, plan in enumerate(outcome.plans[:top]):
        add(PICK if i == 0 else f"runner-up {i}", plan)
    model = model_at_vpp(outcome.plans[0], 1)
    layers = len(model.layers)
    layout = even_layout(layers - 1, model.pp, 1, 1)
    for role, ids in ((FULL_RECOMPUTE, tuple(range(layers))), (NO_RECOMPUTE, ())):
        plan = Plan(layout, ids, model, model.evaluate(layout, ids))
        if role == FULL_RECOMPUTE or Candidate((role,), plan).predicted_fits:
            add(role, plan)
    return [Candidate(tuple(roles[key]), plan) for key, plan in plans.items()]


def measured(row: TrainRun) -> Measured:
    """A stored run's step (median after the warm-up, ms) and memory per pipeline rank (see the module doc)."""
    if row.status != "ok":
        return Measured(row.id, row.status, None, None, row.oom_stage, row.error)
    ranks = sorted(row.stage_memory, key=lambda m: m["rank"])
    stage_bytes = tuple(float(m["peak_allocated_bytes"]) if m.get("peak_allocated_bytes") is not None
                        else float(m["static_bytes"] + m["saved_activation_peak_bytes"]) for m in ranks)
    return Measured(row.id, row.status, row.step_median_s * 1e3, stage_bytes)


def run_candidate(engine: Engine, outcome: Outcome, candidate: Candidate, device: str, *, iters: int, warmup: int,
                  kernels: str, on_phase: Callable[[str], None] = lambda _: None) -> Measured:
    """Run ``candidate`` as a stored training run linked to the plan; what it measured."""
    # the training queue and runner pull in torch's pipelining and Ray: `tuner plan` (which reads
    # this module's calibration) must not pay for them
    from tuner.sweep.serve import owner_name
    from tuner.train import queue as train_queue
    from tuner.train.serve import execute

    r, plan = outcome.request, candidate.plan
    fields = dict(preset=r.model, layout=plan.layout_text, pp=plan.model.pp, recompute=candidate.recompute_text,
                  gbs=r.gbs, mbs=r.mbs, seq=r.seq, iters=iters, warmup_iters=warmup, kernels=kernels)
    request = train_queue.parse_request(fields, device, r.nodes * r.gpus_per_node)  # type: ignore[arg-type]
    run_id = train_queue.enqueue(engine, request)
    with session_scope(engine) as session:
        session.execute(update(TrainRun).where(TrainRun.id == run_id)
                        .values(plan_id=outcome.plan_id, plan_candidate=candidate.name[:64]))
    owner = owner_name()
    if not train_queue.try_claim(engine, run_id, owner, LEASE_S):
        raise RuntimeError(f"training run {run_id} was taken by a server before it could start")
    execute(engine, run_id, owner, on_phase=lambda phase: on_phase(f"{candidate.name}: {phase}"))
    return measured(train_queue.get_run(engine, run_id))


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(a, c)`` minimising ``sum((a x + c - y)^2)`` subject to ``a >= 1``, ``c >= 0``.

    The problem is convex: the free optimum when it is feasible, else the better of the two
    boundary optima (``a = 1`` or ``c = 0``).
    """
    if len(x) >= 2 and np.ptp(x) > 0:
        a, c = np.polyfit(x, y, 1)
        if a >= 1 and c >= 0:
            return float(a), float(c)
    xx = float(x @ x)
    options = [(1.0, max(0.0, float(np.mean(y - x)))), (max(1.0, float(x @ y) / xx) if xx > 0 else 1.0, 0.0)]
    return min(options, key=lambda ac: float(np.sum((ac[0] * x + ac[1] - y) ** 2)))


def fit_calibration(calibration: Calibration,
                    runs: Sequence[tuple[Candidate, Measured]]) -> tuple[Calibration, Fit]:
    """Refit ``calibration`` on the runs that finished (their plans priced under ``calibration``).

    * Time: one factor ``k`` minimising ``sum((k * predicted / measured - 1)^2)`` (relative
      errors, so a slow plan does not outweigh a fast one), ``time_scale *= k``. The factor
      scales the profiled compute; transfer and optimizer tails are not scaled, so re-predicted
      steps move by a little less than ``k``.
    * Memory, per pipeline rank of every run: ``measured - static - p2p buffers = a *
      activations + c`` (activations before fragmentation, the recompute workspace included: the
      model scales both by the same factor), least squares with ``a >= 1`` and ``c >= 0``;
      ``fragmentation = a - 1`` and ``reserved_bytes = c``.

    A term without points keeps its value.
    """
    done = [(c, m) for c, m in runs if m.status == "ok"]
    if not done:
        return calibration, Fit(1.0, 1 + calibration.fragmentation, calibration.reserved_bytes, 0, 0)
    ratios = np.array([c.plan.step_ms / m.step_ms for c, m in done])
    k = float(ratios.sum() / (ratios @ ratios))
    x, y = [], []
    for c, m in done:
        for breakdown, bytes_ in zip(c.plan.evaluation.memory, m.stage_bytes):
            x.append(breakdown.activations / (1 + calibration.fragmentation))
            y.append(bytes_ - breakdown.weights_and_grads - breakdown.optimizer
                     - (breakdown.buffers - calibration.reserved_bytes))
    a, c = _fit_line(np.array(x), np.array(y))
    after = dataclasses.replace(calibration, time_scale=calibration.time_scale * k, fragmentation=a - 1,
                                reserved_bytes=c)
    return after, Fit(k, a, c, len(done), len(x))


@dataclass(frozen=True)
class Validation:
    """A validated plan: every candidate's predictions (before and after the refit) and measurements."""

    validation_id: int
    outcome: Outcome
    device: str
    runs: tuple[tuple[Candidate, Measured], ...]
    before: Calibration
    after: Calibration
    fit: Fit

    def to_dict(self) -> dict[str, Any]:
        """Everything the report shows; every error and comparison computed here from the stored figures."""
        rows = [_row(c, m, self.after) for c, m in self.runs]
        ok = [r for r in rows if r["status"] == "ok"]
        best = min(ok, key=lambda r: r["measured_step_ms"]) if ok else None
        pick = next(r for r in rows if PICK in r["roles"])
        baseline = next((r for role in (NO_RECOMPUTE, FULL_RECOMPUTE) for r in ok if role in r["roles"]), None)
        pick_ok = pick["status"] == "ok"
        refit_order = sorted((r for r in rows if r["refit_fits"]), key=lambda r: r["refit_step_ms"])
        memory_errors = [abs(e) for r in ok for e in r["memory_error"]]
        return {
            "validation_id": self.validation_id, "plan_id": self.outcome.plan_id,
            "request": self.outcome.request.model_dump(), "gpu_kind": self.outcome.gpu.device_name,
            "device": self.device, "capacity_bytes": self.outcome.capacity_bytes, "candidates": rows,
            "median_abs_time_error": statistics.median(abs(r["time_error"]) for r in ok) if ok else None,
            "median_abs_memory_error": statistics.median(memory_errors) if memory_errors else None,
            "median_abs_time_error_refit": (statistics.median(abs(r["refit_time_error"]) for r in ok)
                                            if ok else None),
            "measured_best": best["name"] if best else None,
            "pick_vs_best": pick["measured_step_ms"] / best["measured_step_ms"] - 1 if pick_ok and best else None,
            "baseline": baseline["name"] if baseline else None,
            "pick_speedup_vs_baseline": (baseline["measured_step_ms"] / pick["measured_step_ms"] - 1
                                         if pick_ok and baseline else None),
            "mispredicted_fits": [r["name"] for r in rows if r["status"] == "oom" and r["predicted_fits"]],
            "refit_ranking": [r["name"] for r in refit_order],
            "calibration_before": self.before.to_dict(), "calibration_after": self.after.to_dict(),
            "fit": self.fit.to_dict(),
        }


def _row(candidate: Candidate, run: Measured, after: Calibration) -> dict[str, Any]:
    plan = candidate.plan
    refit_ms, refit_bytes = predict(plan, after)
    row: dict[str, Any] = {
        "name": candidate.name, "roles": list(candidate.roles), "layout": plan.layout_text,
        "pp": plan.model.pp, "vpp": plan.model.vpp, "recompute_layer_ids": list(plan.recompute_layer_ids),
        "predicted_fits": candidate.predicted_fits, "predicted_step_ms": plan.step_ms,
        "predicted_stage_bytes": list(plan.rank_bytes), "refit_step_ms": refit_ms,
        "refit_stage_bytes": list(refit_bytes), "refit_fits": all(b <= plan.model.capacity_bytes for b in refit_bytes),
        "train_run_id": run.run_id, "status": run.status, "oom_stage": run.oom_stage, "error": run.error,
        "measured_step_ms": run.step_ms, "measured_stage_bytes": list(run.stage_bytes or ()),
        "time_error": None, "refit_time_error": None, "memory_error": [], "refit_memory_error": []}
    if run.status == "ok":
        row["time_error"] = plan.step_ms / run.step_ms - 1
        row["refit_time_error"] = refit_ms / run.step_ms - 1
        row["memory_error"] = [p / m - 1 for p, m in zip(plan.rank_bytes, run.stage_bytes)]
        row["refit_memory_error"] = [p / m - 1 for p, m in zip(refit_bytes, run.stage_bytes)]
    return row


def starting_calibration(engine: Engine, device_name: str) -> Calibration:
    """The newest calibration refitted on this GPU kind, else the defaults (the CPU's: see the module doc)."""
    with session_scope(engine) as session:
        last = session.scalars(select(PlanValidation.calibration_after).filter_by(gpu_kind=device_name)
                               .order_by(PlanValidation.created_at.desc(), PlanValidation.id.desc()).limit(1)).first()
    if last is not None:
        return Calibration.from_dict(last)
    return CPU_CALIBRATION if device_name == "cpu" else Calibration()


def validate(engine: Engine, request: PlanRequest, top: int = 3, *, iters: int = 8, warmup: int = 2,
             device: str = "cpu", kernels: str = "eager", calibration: Calibration | None = None,
             on_phase: Callable[[str], None] = lambda _: None) -> Validation:
    """Plan ``request``, run the candidates, refit and store (see the module doc); needs a connected Ray.

    ``device`` is ``cpu`` or ``cuda`` and must match the request's GPU kind (``cpu`` plans from
    CPU profiles). Raises what ``plan_request`` raises, and RequestError naming a bad argument.
    """
    if device not in ("cpu", "cuda"):
        raise RequestError("device", f"must be cpu or cuda, got {device!r}")
    if (gpu_kind(request.gpu).name == "cpu") != (device == "cpu"):
        raise RequestError("device", f"{device} runs cannot validate plans for GPU kind {request.gpu}")
    if top < 1:
        raise RequestError("top", f"must be >= 1, got {top}")
    if not 0 <= warmup < iters:
        raise RequestError("warmup", f"must be >= 0 and below iters={iters}, got {warmup}")
    if request.nodes != 1:
        raise RequestError("nodes", "validation runs on one node")
    before = calibration or starting_calibration(engine, gpu_kind(request.gpu).device_name)
    outcome = plan_request(engine, request.model_copy(update={"top": max(top, request.top)}), before)
    runs = []
    for candidate in candidates(outcome, top):
        on_phase(f"{candidate.name}: {candidate.plan.layout_text}, recompute {candidate.recompute_text}")
        runs.append((candidate, run_candidate(engine, outcome, candidate, device, iters=iters, warmup=warmup,
                                              kernels=kernels, on_phase=on_phase)))
    after, fit = fit_calibration(before, runs)
    validation = Validation(0, outcome, device, tuple(runs), before, after, fit)
    with session_scope(engine) as session:
        row = PlanValidation(plan_id=outcome.plan_id, gpu_kind=outcome.gpu.device_name, device=device, iters=iters,
                             warmup_iters=warmup, calibration_before=before.to_dict(),
                             calibration_after=after.to_dict(), fit=fit.to_dict(),
                             candidates=validation.to_dict()["candidates"])
        session.add(row)
        session.flush()
        return dataclasses.replace(validation, validation_id=row.id)
