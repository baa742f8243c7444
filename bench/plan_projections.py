"""Re-projection: the planner's plan for V4-Flash on 4, 8 and 16 nodes beside Primus's hand plan Et*10|t*12|t*12|t*9mL, recompute 0.

From the packaged profiles on an empty database (what a fresh install plans from), per node
count: the planner's chosen plan (or its no-fit verdict), its best plan at Primus's parallelism
(pp 4, vpp 1), and Primus's shipped plan priced by the same iteration model at pp 4, vpp 1 (its
step, tokens/s/GPU and peak memory per rank, or how far it overflows). gbs 256, mbs 1, seq 4096,
ep 8, 8 GPUs per node, the default calibration. ``--gpu mi355x --profiles-from h200`` projects
another kind from borrowed profiles (marked so). The EP all-to-all is priced only when the
profiles hold a measured one; the record says whether they do. ``figures["markdown"]`` is the
table for the README's planner section.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

GiB = 1 << 30
PRIMUS_LAYOUT, PRIMUS_PP = "Et*10|t*12|t*12|t*9mL", 4  # measured by Primus on 4 x 8 MI355X, recompute 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default="h100", help="GPU kind planned for")
    parser.add_argument("--profiles-from", default=None, help="plan from this GPU kind's packaged profiles")
    parser.add_argument("--nodes", default="4,8,16", help="node counts, as tuner plan --nodes takes them")
    parser.add_argument("--model", default="v4-flash", help="model preset (Primus's plan is V4-Flash's)")


def _plan_figures(outcome: Any, plan: Any) -> dict[str, Any]:
    d = outcome.plan_dict(plan)
    return {"layout": d["layout"], "pp": d["pp"], "vpp": d["vpp"], "recompute_layer_ids": d["recompute_layer_ids"],
            "step_ms": d["step_ms"], "tokens_per_s_per_gpu": d["tokens_per_s_per_gpu"],
            "tflops_per_gpu": d["tflops_per_gpu"], "rank_peak_bytes": [s["total_bytes"] for s in d["stages"]],
            "capacity_bytes": outcome.capacity_bytes, "fits": True}


def _primus(at_pp4: Any) -> dict[str, Any]:
    """Primus's layout without recompute, priced by the planner's model of ``at_pp4`` (resolved at pp 4, vpp 1)."""
    from tuner.plan.iteration import Plan
    from v4.layout import parse_layout

    (model,) = at_pp4.models()
    layout = parse_layout(PRIMUS_LAYOUT, len(model.layers) - 1, PRIMUS_PP)
    plan = Plan(layout, (), model, model.evaluate(layout, ()))
    r = at_pp4.request
    peaks = list(plan.rank_bytes)
    tokens = r.gbs * r.seq / (plan.step_ms / 1e3) / (r.nodes * r.gpus_per_node)
    return {"layout": PRIMUS_LAYOUT, "pp": PRIMUS_PP, "vpp": 1, "recompute_layer_ids": [], "step_ms": plan.step_ms,
            "tokens_per_s_per_gpu": tokens, "tflops_per_gpu": tokens * at_pp4.flops_per_token / 1e12,
            "rank_peak_bytes": peaks, "capacity_bytes": model.capacity_bytes,
            "fits": max(peaks) <= model.capacity_bytes, "overflow_bytes": max(0.0, max(peaks) - model.capacity_bytes)}


def _row(nodes: int, name: str, p: dict[str, Any]) -> str:
    if "why" in p:
        return f"| {nodes} | {name} | {p['why']} | | | | |"
    from tuner.plan.report import compact_layout
    from v4.layout import format_ranges

    peak = max(p["rank_peak_bytes"]) / GiB
    fit = "yes" if p["fits"] else f"no, +{p['overflow_bytes'] / GiB:.1f} GiB"
    layout = compact_layout(p["layout"]).replace("|", "\\|")
    return (f"| {nodes} | {name} | `{layout}` ({p['pp']}x{p['vpp']}), recompute {format_ranges(p['recompute_layer_ids'])} "
            f"| {p['step_ms']:,.0f} | {p['tokens_per_s_per_gpu']:,.0f} | {peak:.1f} / {p['capacity_bytes'] / GiB:.1f} "
            f"| {fit} |")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from db import open_database
    from tuner.cli.plan import node_counts
    from tuner.plan.profiles import ProfilesMissing
    from tuner.plan.request import PlanRequest, RequestError, no_fit_reason, plan_request, resolve
    from tuner.plan.search import NoPlanFits

    try:
        counts = node_counts(args.nodes)
        base = dict(model=args.model, gpus_per_node=8, gpu=args.gpu, gbs=256, mbs=1, seq=4096, ep=8, top=1,
                    profiles_from=args.profiles_from)
        rows, markdown = {}, []
        with tempfile.TemporaryDirectory(prefix="plan-projections-") as folder:
            engine = open_database(f"sqlite:///{Path(folder) / 'empty.db'}")
            # resolved once (preset, profiles, FLOPs), re-targeted per node count as a node sweep does
            auto = resolve(engine, PlanRequest.parse(nodes=counts[0], **base), sweep=True)
            pp4 = resolve(engine, PlanRequest.parse(nodes=counts[0], pp=PRIMUS_PP, vpp=1, **base), sweep=True)
            for n in counts:
                resolved, at_pp4 = auto.for_nodes(n), pp4.for_nodes(n)
                row: dict[str, Any] = {}
                for name, request in (("planner", resolved), ("planner at pp 4, vpp 1", at_pp4)):
                    try:
                        outcome = plan_request(engine, request)
                        row[name] = {**_plan_figures(outcome, outcome.plans[0]), "gap": outcome.result.gap}
                    except NoPlanFits as exc:
                        row[name] = {"why": no_fit_reason(exc)}
                row["Primus hand plan"] = _primus(at_pp4)
                rows[str(n)] = row
                markdown += [_row(n, name, p) for name, p in row.items()]
    except (RequestError, ProfilesMissing) as exc:
        raise ValueError(str(exc)) from None
    header = ["| nodes | plan | layout, recompute | step ms | tokens/s/GPU | peak / capacity GiB | fits |",
              "|---|---|---|---|---|---|---|"]
    return {"request": {**base, "nodes": counts}, "profiles_source": resolved.loaded.source,
            "borrowed": resolved.borrowed, "label": resolved.label, "alltoall_priced": resolved.loaded.alltoall_measured,
            "warnings": list(resolved.warnings), "calibration": resolved.calibration.to_dict(), "node_counts": rows,
            "markdown": "\n".join(header + markdown)}
