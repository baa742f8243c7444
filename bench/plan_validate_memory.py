"""Where the planner's memory error at PP = 2 comes from, from the committed H200 results.

Per pipeline rank of every PP = 2 run: static bytes, peak bytes saved for backward, and the rest
of the peak allocated ("other": workspace, p2p buffers, transients) as measured, beside the
planner's prediction. Also the sum of the per-layer profiles' activation bytes against the
saved bytes of the whole model trained on one GPU: a check of the activation accounting alone.

``workspace``: the 11 runs' peak per rank re-predicted from the committed files alone (the layer
profiles, the validation's request, capacity and calibrations, the runs' layouts, recompute and
measured peaks) without and with the recompute workspace term (``MemoryModel.workspace_bytes``),
under the validation's starting calibration and after its refit; the refit is redone with the
term in place on the validation's own five runs (``validate.fit_calibration``). The predictions
without the term must reproduce the committed ``summary-pp2-gpus2.json`` to the byte, or it stops.

Usage: python bench/plan_validate_memory.py [workspace]   (reads bench/results/2026-11-30-h200-*; prints markdown)
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from db import open_database
from tuner.plan.costs import Calibration
from tuner.plan.iteration import IterationModel, Plan, PlanInputs
from v4.layout import parse_layout
from tuner.plan.profiles import model_layer_kinds, store_profiles
from tuner.plan.request import PlanRequest, request_costs, request_parallelisms
from tuner.plan.validate import Candidate, Measured, fit_calibration
from v4.config import load_preset
from v4.recompute import RecomputePlan

GiB = 1 << 30
RESULTS = Path(__file__).parent / "results"
VALIDATE = RESULTS / "2026-11-30-h200-plan-validate"


def main() -> None:
    runs = json.loads((VALIDATE / "train-runs.json").read_text())
    predicted = {r["run_id"]: r for r in json.loads((VALIDATE / "summary-pp2-gpus2.json").read_text())["runs"]}
    print("| run | layout | recompute | rank | static GiB | saved GiB | other GiB | peak GiB | predicted GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in (r for r in runs if r["status"] == "ok"):
        for memory, guess in zip(run["stage_memory"], predicted[run["id"]]["predicted_bytes"]):
            other = memory["peak_allocated_bytes"] - memory["static_bytes"] - memory["saved_activation_peak_bytes"]
            layout = run["layout"].replace("|", "\\|")
            print(f"| {run['id']} | `{layout}` | {run['recompute']} | {memory['rank']} | "
                  f"{memory['static_bytes'] / GiB:.1f} | {memory['saved_activation_peak_bytes'] / GiB:.1f} | "
                  f"{other / GiB:.1f} | {memory['peak_allocated_bytes'] / GiB:.1f} | {guess / GiB:.1f} |")
    profiles = {p["layer_kind"]: p for p in json.loads((VALIDATE / "proxy-8l-layer-profiles.json").read_text())}
    kinds = model_layer_kinds(load_preset("proxy-8l")) + ["embedding", "head"]
    summed = sum(profiles[k]["activation_bytes"] for k in kinds)
    whole = next(r for r in json.loads((RESULTS / "2026-11-30-h200-training" / "train-runs.json").read_text())
                 if r["status"] == "ok" and r["kernels"] == "triton" and r["recompute"] == "none")
    saved = whole["stage_memory"][0]["saved_activation_peak_bytes"]
    print(f"\nproxy-8l, one microbatch: the layer profiles sum to {summed / GiB:.2f} GiB saved for backward; "
          f"the whole model on one GPU saved {saved / GiB:.2f} GiB at its peak ({summed / saved - 1:+.1%}).")


def _models(request: PlanRequest, calibration: Calibration, vpp: int, engine) -> tuple[IterationModel, IterationModel]:
    """The validation's model at ``vpp`` under ``calibration``: (with the recompute workspace, without)."""
    (par,) = request_parallelisms(request.model_copy(update={"vpp": vpp}))
    _, costs, capacity, _ = request_costs(engine, request)
    model = IterationModel.from_profiles(PlanInputs(costs, par, capacity), calibration)
    return model, dataclasses.replace(model, memory=dataclasses.replace(model.memory, recompute_workspace=False))


def _median(errors: list[float]) -> str:
    return f"{statistics.median(abs(e) for e in errors):.1%}"


def workspace() -> None:
    """The re-prediction described in the module doc, as markdown."""
    validation = json.loads((VALIDATE / "validate-pp2-gpus2.json").read_text())
    committed = {r["run_id"]: r for r in json.loads((VALIDATE / "summary-pp2-gpus2.json").read_text())["runs"]}
    runs = [r for r in json.loads((VALIDATE / "train-runs.json").read_text()) if r["status"] == "ok"]
    request = PlanRequest.parse(**validation["request"])
    before = Calibration.from_dict(validation["calibration_before"])
    after = Calibration.from_dict(validation["calibration_after"])
    with tempfile.TemporaryDirectory() as tmp:
        engine = open_database(f"sqlite:///{tmp}/profiles.db")
        rows = json.loads((VALIDATE / "proxy-8l-layer-profiles.json").read_text())
        first = rows[0]
        store_profiles(engine, [SimpleNamespace(**r) for r in rows], gpu_kind=first["gpu_kind"],
                       gpu_memory_bytes=first["gpu_memory_bytes"], model=first["model"], seq=first["seq"],
                       mbs=first["mbs"], ep=first["ep"], kernel_tables=first["kernel_tables"])
        layers = load_preset(request.model).layers

        def plans(calibration: Calibration) -> dict[int, tuple[Plan, Plan]]:
            """Per run id: its plan priced (with the term, without)."""
            models: dict[int, tuple[IterationModel, IterationModel]] = {}
            out = {}
            for run in runs:
                layout = parse_layout(run["layout"], layers, request.pp)
                if layout.vpp not in models:
                    models[layout.vpp] = _models(request, calibration, layout.vpp, engine)
                ids = tuple(sorted(RecomputePlan.parse(run["recompute"]).full_layers))
                out[run["id"]] = tuple(Plan(layout, ids, m, m.evaluate(layout, ids)) for m in models[layout.vpp])
            return out

        priced_before, priced_after = plans(before), plans(after)
        for run in runs:  # without the term, the committed predictions exactly
            for priced, key in ((priced_before, "predicted_bytes"), (priced_after, "refit_bytes")):
                got, want = priced[run["id"]][1].rank_bytes, committed[run["id"]][key]
                if any(abs(g - w) > 1 for g, w in zip(got, want)):
                    sys.exit(f"run {run['id']}: re-predicted {key} {got} differ from the committed {want}")
        measured = {run["id"]: Measured(run["id"], "ok", run["step_median_s"] * 1e3, tuple(
            float(m["peak_allocated_bytes"]) for m in sorted(run["stage_memory"], key=lambda m: m["rank"])))
            for run in runs}
        seen = [run["id"] for run in runs if committed[run["id"]]["candidate"] is not None]
        refit, fit = fit_calibration(before, [(Candidate((committed[i]["candidate"],), priced_before[i][0]),
                                               measured[i]) for i in seen])
        priced_refit = plans(refit)
    columns = {"predicted, no term (committed)": (priced_before, 1),
               "predicted, with the term": (priced_before, 0),
               "after the 2026-11-30 refit, no term (committed)": (priced_after, 1),
               "after the 2026-11-30 refit, with the term": (priced_after, 0),
               "after the refit with the term": (priced_refit, 0)}
    print("| run | recompute | rank | measured GiB | " + " | ".join(f"{c} GiB" for c in columns) + " |")
    print("|---|---|---|---|" + "---|" * len(columns))
    for run in runs:
        for r, got in enumerate(measured[run["id"]].stage_bytes):
            cells = [f"{priced[run['id']][k].rank_bytes[r] / GiB:.1f}" for priced, k in columns.values()]
            print(f"| {run['id']} | {run['recompute']} | {r} | {got / GiB:.1f} | " + " | ".join(cells) + " |")
    scopes = {"the validation's 5 runs": seen, "all 11": [run["id"] for run in runs],
              "the 6 the refit never saw": [run["id"] for run in runs if run["id"] not in seen]}
    print("\nmedian |predicted / measured - 1| of the peak per rank:\n")
    print("| calibration | " + " | ".join(scopes) + " |")
    print("|---|" + "---|" * len(scopes))
    for name, (priced, k) in columns.items():
        cells = [_median([p / m - 1 for i in ids for p, m in zip(priced[i][k].rank_bytes, measured[i].stage_bytes)])
                 for ids in scopes.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nrefit with the term on runs {seen}: fragmentation {refit.fragmentation:.3f} "
          f"(was {after.fragmentation:.3f}), reserved_bytes {refit.reserved_bytes / GiB:.2f} GiB "
          f"(was {after.reserved_bytes / GiB:.2f}), time_scale {refit.time_scale:.4f} (was {after.time_scale:.4f}); "
          f"{fit.memory_points} memory points")


if __name__ == "__main__":
    if sys.argv[1:] == ["workspace"]:
        workspace()
    elif not sys.argv[1:]:
        main()
    else:
        sys.exit(__doc__)
