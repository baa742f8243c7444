"""Planner accuracy: the planner's predicted step time and memory per rank against real training runs, and where its pick ranks among them.

Reads a database that ``tuner plan validate`` and ``tuner train`` runs wrote (on the GPUs the plan
is for): the newest plan validation (or ``--validation``), and every stored run of its model at its
pipeline depth on the same GPU count, the validation's candidates and any other plan run beside
them. Each run is predicted by today's planner from the stored profiles under the validation's
calibrations, before and after its refit. Figures: the median |predicted / measured - 1| of step
and memory per rank, over all runs and over those the refit did not see; the pick's measured rank.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which database and validation."""
    parser.add_argument("--db", default=None, help="database URL (default: TUNER_DB_URL or the user database)")
    parser.add_argument("--validation", type=int, default=None, help="plan validation id (default: the newest)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Predicted against measured for every stored run of the validation's request."""
    from sqlalchemy import select

    from db import open_database, session_scope
    from db.planning import StoredPlan
    from db.training import TrainRun
    from db.validation import PlanValidation
    from tuner.plan.costs import Calibration
    from tuner.plan.iteration import Plan, predict
    from tuner.plan.request import PlanRequest, plan_request
    from tuner.plan.validate import PICK, measured, model_at_vpp
    from v4.config import load_preset
    from v4.layout import parse_layout
    from v4.recompute import RecomputePlan

    engine = open_database(args.db)
    with session_scope(engine) as session:
        query = select(PlanValidation).order_by(PlanValidation.id.desc()).limit(1)
        if args.validation is not None:
            query = select(PlanValidation).filter_by(id=args.validation)
        validation = session.scalars(query).one_or_none()
        if validation is None:
            raise ValueError("--validation: no plan validation in this database (run `tuner plan validate` first)"
                             if args.validation is None else f"--validation: no plan validation {args.validation}")
        request = PlanRequest.parse(**session.get(StoredPlan, validation.plan_id).request)
        before = Calibration.from_dict(validation.calibration_before)
        after = Calibration.from_dict(validation.calibration_after)
        pick = next(c for c in validation.candidates if PICK in c["roles"])
        runs = session.scalars(select(TrainRun).filter_by(preset=request.model, pp=request.pp)
                               .order_by(TrainRun.id)).all()
        validation_id, plan_id = validation.id, validation.plan_id
    outcome = plan_request(engine, request, before)
    layers = load_preset(request.model).layers
    models: dict[int, Any] = {}
    rows = []
    for stored in runs:
        if stored.layout is None or (stored.dp or 1) * request.pp != request.gpus_per_node:
            continue
        layout = parse_layout(stored.layout, layers, request.pp)
        model = models.setdefault(layout.vpp, model_at_vpp(outcome.plans[0], layout.vpp))
        ids = tuple(sorted(RecomputePlan.parse(stored.recompute).full_layers))
        plan = Plan(layout, ids, model, model.evaluate(layout, ids))
        m = measured(stored)
        refit_ms, refit_bytes = predict(plan, after)
        rows.append({"run": stored.id, "layout": stored.layout, "recompute": stored.recompute, "status": m.status,
                     "candidate": stored.plan_candidate, "predicted ms": plan.step_ms, "refit ms": refit_ms,
                     "measured ms": m.step_ms, "predicted bytes": list(plan.rank_bytes),
                     "refit bytes": list(refit_bytes), "measured bytes": list(m.stage_bytes or ())})
    return {"validation": validation_id, "plan": plan_id, "model": request.model, "pp": request.pp,
            **accuracy(rows, pick.get("measured_step_ms")), "runs": {str(r.pop("run")): r for r in rows}}


def _median_abs(errors: list[float]) -> float | None:
    return round(statistics.median(abs(e) for e in errors), 4) if errors else None


def accuracy(rows: list[dict[str, Any]], pick_ms: float | None) -> dict[str, Any]:
    """Median |error| of step and memory per rank (before and after the refit; over all ok runs and over
    those outside the refit, i.e. not a validation candidate) and the pick's rank among the measured."""
    errors: dict[str, dict[str, float | None]] = {}
    for key in ("predicted", "refit"):
        for scope, chosen in (("all runs", rows), ("outside the refit", [r for r in rows if r["candidate"] is None])):
            ok = [r for r in chosen if r["status"] == "ok"]
            errors[f"{key}, {scope}"] = {
                "runs": len(ok),
                "step": _median_abs([r[f"{key} ms"] / r["measured ms"] - 1 for r in ok]),
                "memory per rank": _median_abs([p / m - 1 for r in ok
                                                for p, m in zip(r[f"{key} bytes"], r["measured bytes"])])}
    measured = sorted(r["measured ms"] for r in rows if r["status"] == "ok")
    rank = 1 + sum(ms < pick_ms for ms in measured) if measured and pick_ms else None
    return {"median |error|": errors, "pick rank": rank, "measured runs": len(measured),
            "pick vs measured best": round(pick_ms / measured[0] - 1, 4) if rank else None}
