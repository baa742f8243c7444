"""The exhaustive plan space of the plan-validation benches, and its predicted-vs-measured summary.

``space MODEL PP``: one ``layout<TAB>recompute`` line per plan: the even split and every split
one layer away from it (one decoder layer moved between neighbouring stages), each with no
recompute, full recompute of every layer, and full recompute of the first stage's decoder layers;
plans that already have a finished run at PP in ``TUNER_DB_URL`` (the validation's candidates) are
left out, so that a device session runs each plan once.

``summary``: for every stored training run of MODEL at PP (``TUNER_DB_URL``; the validation's
interleaved candidates included), its step and memory per rank predicted under the newest
validation's calibrations (before and after the refit) next to what it measured, the median
errors over all runs and over those the refit did not see; the planner's pick (newest
validation) ranked among all measured runs.
Prints a table and writes JSON to the given path.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from sqlalchemy import select

from db import open_database, session_scope
from db.planning import StoredPlan
from db.training import TrainRun
from db.validation import PlanValidation
from tuner.plan.costs import Calibration
from tuner.plan.iteration import Plan, predict
from v4.layout import even_layout, format_layout, parse_layout
from tuner.plan.request import PlanRequest, plan_request
from tuner.plan.validate import PICK, measured, model_at_vpp
from v4.config import load_preset
from v4.recompute import RecomputePlan


def space(model: str, pp: int) -> list[tuple[str, str]]:
    """The (layout, recompute) pairs described in the module doc."""
    layers = load_preset(model).layers
    even = [len([i for i in s.layer_ids if i < layers]) for s in even_layout(layers, pp).stages]
    counts = [even]
    for s in range(pp - 1):
        for delta in (1, -1):
            moved = list(even)
            moved[s] += delta
            moved[s + 1] -= delta
            if min(moved) >= 1:
                counts.append(moved)
    out = []
    for split in counts:
        stages = [("E" if s == 0 else "") + f"t*{n}" + ("mL" if s == pp - 1 else "") for s, n in enumerate(split)]
        layout = format_layout(parse_layout("|".join(stages), layers, pp))
        for recompute in ("none", f"0-{layers}", f"0-{split[0] - 1}"):
            out.append((layout, recompute))
    return out


def already_run(model: str, pp: int) -> set[tuple[str, tuple[int, ...]]]:
    """(layout, recomputed layer ids) of the finished runs (ok or out of memory) of MODEL at PP."""
    layers = load_preset(model).layers
    with session_scope(open_database()) as session:
        runs = session.scalars(select(TrainRun).filter_by(preset=model, pp=pp)).all()
        return {(format_layout(parse_layout(r.layout, layers, pp)), _recomputed(r.recompute))
                for r in runs if r.layout is not None and r.vpp == 1 and r.status in ("ok", "oom")}


def _recomputed(recompute: str) -> tuple[int, ...]:
    return tuple(sorted(RecomputePlan.parse(recompute).full_layers))


def _median_abs(errors: list[float]) -> float | None:
    return statistics.median(abs(e) for e in errors) if errors else None


def _errors(rows: list[dict], key: str) -> dict[str, float | None]:
    """Median |predicted/measured - 1| of step and per-rank memory, over every ok run and over the runs
    the refit did not see (the space's), for the predictions under ``key`` (predicted or refit)."""
    out: dict[str, float | None] = {}
    for scope, chosen in (("all", rows), ("outside_refit", [r for r in rows if r["candidate"] is None])):
        ok = [r for r in chosen if r["status"] == "ok"]
        out[f"step_{scope}"] = _median_abs([r[f"{key}_ms"] / r["measured_ms"] - 1 for r in ok])
        out[f"memory_{scope}"] = _median_abs([p / m - 1 for r in ok
                                              for p, m in zip(r[f"{key}_bytes"], r["measured_bytes"])])
    return out


def summary(path: str) -> None:
    engine = open_database()
    with session_scope(engine) as session:
        validation = session.scalars(select(PlanValidation).order_by(PlanValidation.id.desc()).limit(1)).one()
        request = PlanRequest.parse(**session.get(StoredPlan, validation.plan_id).request)
        before = Calibration.from_dict(validation.calibration_before)
        after = Calibration.from_dict(validation.calibration_after)
        pick = next(c for c in validation.candidates if PICK in c["roles"])
        runs = session.scalars(select(TrainRun).filter_by(preset=request.model, pp=request.pp)
                               .order_by(TrainRun.id)).all()
    outcome = plan_request(engine, request, before)
    models: dict[int, Any] = {}  # per vpp, built once
    config = load_preset(request.model)
    rows: list[dict[str, Any]] = []
    for run in runs:
        if run.layout is None or (run.dp or 1) * request.pp != request.gpus_per_node:
            continue
        layout = parse_layout(run.layout, config.layers, request.pp)
        if layout.vpp not in models:
            models[layout.vpp] = model_at_vpp(outcome.plans[0], layout.vpp)
        model = models[layout.vpp]
        ids = _recomputed(run.recompute)
        plan = Plan(layout, ids, model, model.evaluate(layout, ids))
        m = measured(run)
        refit_ms, refit_bytes = predict(plan, after)
        rows.append({"run_id": run.id, "layout": run.layout, "vpp": layout.vpp, "recompute": run.recompute,
                     "status": m.status, "candidate": run.plan_candidate, "predicted_ms": plan.step_ms,
                     "refit_ms": refit_ms, "measured_ms": m.step_ms, "predicted_bytes": list(plan.rank_bytes),
                     "refit_bytes": list(refit_bytes), "measured_bytes": list(m.stage_bytes or ())})
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["measured_ms"])
    pick_ms = pick["measured_step_ms"]
    result = {"validation_id": validation.id, "plan_id": validation.plan_id, "runs": rows,
              "pick": {"layout": pick["layout"], "recompute_layer_ids": pick["recompute_layer_ids"],
                       "measured_ms": pick_ms},
              "measured_best": ok[0] if ok else None,
              "pick_rank": (1 + sum(r["measured_ms"] < pick_ms for r in ok)) if ok and pick_ms else None,
              "pick_vs_best": pick_ms / ok[0]["measured_ms"] - 1 if ok and pick_ms else None,
              "median_abs_error": _errors(rows, "predicted"), "median_abs_error_refit": _errors(rows, "refit")}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'layout':<28} {'recompute':<10} {'candidate':<28} {'status':<6} {'pred ms':>9} {'refit ms':>9} "
          f"{'meas ms':>9}  GiB per rank: predicted/refit/measured")
    for r in rows:
        meas = f"{r['measured_ms']:9.1f}" if r["measured_ms"] else f"{'-':>9}"
        got = r["measured_bytes"] or [float("nan")] * len(r["predicted_bytes"])
        mem = " ".join(f"{p / 2**30:.1f}/{q / 2**30:.1f}/{m / 2**30:.1f}"
                       for p, q, m, in zip(r["predicted_bytes"], r["refit_bytes"], got))
        print(f"{r['layout']:<28} {r['recompute']:<10} {r['candidate'] or '-':<28} {r['status']:<6} "
              f"{r['predicted_ms']:9.1f} {r['refit_ms']:9.1f} {meas}  {mem}")
    for label, key in (("predicted", "median_abs_error"), ("refit", "median_abs_error_refit")):
        e = result[key]
        print(f"median |error| {label:<9}: step {e['step_all']:.1%} (outside the refit {e['step_outside_refit']:.1%}), "
              f"memory per rank {e['memory_all']:.1%} (outside the refit {e['memory_outside_refit']:.1%})")
    if result["pick_rank"]:
        print(f"planner's pick {pick['layout']} recompute {pick['recompute_layer_ids']}: rank {result['pick_rank']} "
              f"of {len(ok)} measured, {result['pick_vs_best']:+.1%} vs the measured best {ok[0]['layout']} "
              f"recompute {ok[0]['recompute']}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "space":
        done = already_run(sys.argv[2], int(sys.argv[3]))
        for layout, recompute in space(sys.argv[2], int(sys.argv[3])):
            if (layout, _recomputed(recompute)) not in done:
                print(f"{layout}\t{recompute}")
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit("usage: plan_validate_space.py space MODEL PP | summary OUT.json")
