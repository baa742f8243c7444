"""Planner projections for V4-Flash from measured per-layer profiles, beside Primus's hand-tuned plans.

Usage::

    TUNER_DB_URL=sqlite:///PROFILES.db python bench/plan_projections.py OUT_DIR

For each scenario of :data:`SCENARIOS` (gbs 256, mbs 1, seq 4096, ep 8, 8 GPUs per node):

1. the planner's chosen plan and runners-up (``plan_request``), or, when nothing fits, its own
   ``NoPlanFits`` message (which stage overflows by how much); also its best plan restricted to
   Primus's parallelism (pp 4, vpp 1);
2. Primus's four V4-Flash plans (:data:`PRIMUS`, measured on 4 MI355X nodes at PP 4) priced by
   the same iteration model at pp 4, vpp 1: step, TFLOP/s/GPU, memory per rank, fit or overflow.

Only the Triton profile rows are used (``kernels="triton"``: the kernels the product ships). The
planner stores its plans in the database, so run the script on a copy of the profiles database.
The calibration is the one ``tuner plan`` would use (the newest refitted on the GPU kind, else
the defaults).

Writes ``OUT_DIR/projections.json`` (everything), per scenario the planner's HTML report and the
chosen plan's Gantt and memory SVGs (``<scenario>.html``, ``-gantt.svg``, ``-memory.svg``) and
the memory SVG of Primus's shipped plan (``-primus-shipped-memory.svg``), and prints a markdown
table (memory in GB = 1e9 bytes, as Primus quotes it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from db import open_database, session_scope
from db.planning import LayerProfile
from tuner.plan.costs import Calibration
from tuner.plan.hardware import gpu_kind
from tuner.plan.iteration import IterationModel, Plan, PlanInputs
from v4.layout import format_ranges, megatron_recompute, parse_layout
from tuner.plan.profiles import LoadedCosts
from tuner.plan.report import gantt_svg, memory_svg, write_report
from tuner.plan.request import (PlanRequest, default_flops_per_token, plan_request, request_costs,
                                   request_parallelisms)
from tuner.plan.search import NoPlanFits
from tuner.plan.validate import starting_calibration
from v4.config import ModelConfig, layer_kind, load_preset
from v4.flops import layer_flops
from v4.recompute import RecomputePlan

GB = 10**9
KERNELS = "triton"
MODEL, GBS, MBS, SEQ, EP, GPUS_PER_NODE = "v4-flash", 256, 1, 4096, 8, 8
PRIMUS_PP, PRIMUS_NODES, PRIMUS_GPU = 4, 4, "mi355x"


@dataclass(frozen=True)
class Scenario:
    """A cluster to plan for; ``profiles_from`` names the GPU kind whose profiles stand in (times unscaled)."""

    name: str
    gpu: str
    nodes: int
    profiles_from: str | None = None

    def request(self, **fields: Any) -> PlanRequest:
        return PlanRequest.parse(model=MODEL, nodes=self.nodes, gpus_per_node=GPUS_PER_NODE, gpu=self.gpu, gbs=GBS,
                                 mbs=MBS, seq=SEQ, ep=EP, top=5, profiles_from=self.profiles_from, kernels=KERNELS,
                                 **fields)


@dataclass(frozen=True)
class PrimusPlan:
    """One row of Primus's layout/recompute table: recompute = first ``recompute_first`` layers of every stage."""

    name: str
    layout: str
    recompute_first: int
    tflops: float
    peak_gb: float

    def recompute_ids(self, config: ModelConfig) -> frozenset[int]:
        """Megatron's ``--recompute-method block --recompute-num-layers N``: the first N decoder layers of
        every stage as global ids (the embedding is no layer; the MTP layer is never included)."""
        if not self.recompute_first:
            return frozenset()
        layout = parse_layout(self.layout, config.layers, PRIMUS_PP, config.mtp_layers)
        return RecomputePlan.from_megatron("full", "block", self.recompute_first, PRIMUS_PP, layout).full_layers


SCENARIOS = (Scenario("h200-4n", "h200", 4), Scenario("h200-8n", "h200", 8),
             Scenario("mi355x-4n", "mi355x", 4, "h200"), Scenario("mi355x-8n", "mi355x", 8, "h200"))
PRIMUS = (PrimusPlan("reference", "Et*10|t*11|t*11|t*11mL", 3, 1167.2, 217.2),
          PrimusPlan("layout only", "Et*10|t*12|t*12|t*9mL", 3, 1273.4, 225.9),
          PrimusPlan("recompute only", "Et*10|t*11|t*11|t*11mL", 0, 1255.7, 260.9),
          PrimusPlan("both (shipped)", "Et*10|t*12|t*12|t*9mL", 0, 1378.8, 260.9))
SHIPPED = PRIMUS[-1]


def pipeline_model(engine: Engine, request: PlanRequest, calibration: Calibration, pp: int,
                   vpp: int = 1) -> tuple[IterationModel, LoadedCosts]:
    """The iteration model ``plan_request`` builds for ``request`` at (pp, vpp): same costs, capacity, calibration.

    Needed where the planner returns no model at that (pp, vpp) (nothing fits, or it chose another pp).
    """
    (par,) = request_parallelisms(request.model_copy(update={"pp": pp, "vpp": vpp}))
    loaded, costs, capacity, _ = request_costs(engine, request)
    return IterationModel.from_profiles(PlanInputs(costs, par, capacity), calibration), loaded


def price(model: IterationModel, layout_text: str, recompute_layer_ids: Iterable[int] = ()) -> Plan:
    """``layout_text`` recomputing ``recompute_layer_ids`` (global ids: decoder layers from 0, the MTP layer
    last), priced by ``model``."""
    layout = parse_layout(layout_text, len(model.layers) - 1, model.pp)
    ids = tuple(sorted(recompute_layer_ids))
    return Plan(layout, ids, model, model.evaluate(layout, ids))


def summary(plan: Plan, request: PlanRequest, flops_per_token: float) -> dict[str, Any]:
    """The figures of one plan the projection tables show (the formulas of ``Outcome``)."""
    model, par = plan.model, plan.model.inputs.parallelism
    tokens = request.gbs * request.seq / (plan.step_ms / 1e3) / par.cluster.gpus
    ranks = list(plan.rank_bytes)
    return {
        "layout": plan.layout_text, "pp": model.pp, "vpp": model.vpp, "dp": par.dp, "microbatches": model.microbatches,
        "recompute_layer_ids": list(plan.recompute_layer_ids),
        "megatron_recompute": megatron_recompute(plan.layout, plan.recompute_layer_ids),
        "step_ms": plan.step_ms, "bubble_fraction": plan.evaluation.schedule.bubble_fraction,
        "tokens_per_s_per_gpu": tokens, "tflops_per_gpu": tokens * flops_per_token / 1e12,
        "rank_bytes": ranks, "static_bytes": [m.weights_and_grads + m.optimizer for m in plan.evaluation.memory],
        "activation_bytes": [m.activations for m in plan.evaluation.memory],
        "buffer_bytes": [m.buffers for m in plan.evaluation.memory],
        "capacity_bytes": model.capacity_bytes, "fits": max(ranks) <= model.capacity_bytes,
        "worst_rank": ranks.index(max(ranks)), "overflow_bytes": max(0.0, max(ranks) - model.capacity_bytes)}


def no_fit(exc: NoPlanFits) -> dict[str, Any]:
    """The planner's own no-fit verdict: its message and the stage that overflows by how much."""
    return {"message": str(exc), "pp": exc.pp, "vpp": exc.vpp, "rank": exc.rank, "overflow_bytes": exc.overflow_bytes,
            "static_bytes": exc.static_bytes, "activation_bytes": exc.activation_bytes,
            "capacity_bytes": exc.capacity_bytes}


def run_scenario(engine: Engine, calibration: Calibration, scenario: Scenario,
                 out: Path) -> tuple[dict[str, Any], LoadedCosts]:
    """Plan, plan at Primus's (pp, vpp), price Primus's plans, write the report images; returns the JSON part."""
    request = scenario.request()
    flops = default_flops_per_token(MODEL, SEQ)
    result: dict[str, Any] = {"scenario": scenario.name, "request": request.model_dump()}
    try:
        outcome = plan_request(engine, request, calibration)
    except NoPlanFits as exc:
        result["planner"] = {"no_fit": no_fit(exc)}
    else:
        result["planner"] = outcome.to_dict()
        result["planner_summaries"] = [summary(p, request, flops) for p in outcome.plans]
        write_report(out / f"{scenario.name}.html", outcome)
        (out / f"{scenario.name}-gantt.svg").write_text(gantt_svg(outcome.plans[0]))
        (out / f"{scenario.name}-memory.svg").write_text(memory_svg(outcome.plans[0], outcome.capacity_bytes))
    at_request = scenario.request(pp=PRIMUS_PP, vpp=1)
    try:
        at_primus = plan_request(engine, at_request, calibration)
    except NoPlanFits as exc:
        result["planner_at_primus_parallelism"] = {"no_fit": no_fit(exc)}
    else:
        result["planner_at_primus_parallelism"] = summary(at_primus.plans[0], at_request, flops)
    model, loaded = pipeline_model(engine, request, calibration, PRIMUS_PP)
    primus = {}
    for p in PRIMUS:
        plan = price(model, p.layout, p.recompute_ids(load_preset(MODEL)))
        primus[p.name] = {"measured_on": f"{PRIMUS_NODES}x{GPUS_PER_NODE} {PRIMUS_GPU}", "measured_tflops": p.tflops,
                          "measured_peak_gb": p.peak_gb, "recompute_first_per_stage": p.recompute_first,
                          **summary(plan, request, flops)}
        if p is SHIPPED:
            (out / f"{scenario.name}-primus-shipped-memory.svg").write_text(memory_svg(plan, model.capacity_bytes))
    result["primus"] = primus
    result["capacity_bytes"], result["kernel_tables"] = model.capacity_bytes, loaded.kernel_tables
    return result, loaded


def provenance(source: Engine, loaded: LoadedCosts) -> list[dict[str, Any]]:
    """The profile rows the projection used (as stored in the profiles database)."""
    ids = {r.id for r in loaded.rows}
    with session_scope(source) as session:
        rows = session.scalars(select(LayerProfile).where(LayerProfile.id.in_(ids)).order_by(LayerProfile.id)).all()
        return [{"id": r.id, "layer_kind": r.layer_kind, "gpu_kind": r.gpu_kind, "kernel_tables": r.kernel_tables,
                 "toolchain": r.toolchain, "created_at": r.created_at.isoformat(),
                 "gpu_memory_bytes": r.gpu_memory_bytes, "forward_ms": r.forward_ms, "backward_ms": r.backward_ms,
                 "activation_bytes": r.activation_bytes, "recompute_kept_bytes": r.recompute_kept_bytes,
                 "params": r.params} for r in rows]


def primus_implied(rows: list[dict[str, Any]], primus: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What Primus's measured figures imply per layer, beside what the H200 proxy measured.

    ``primus``: Primus's plans priced on Primus's own cluster (4 MI355X nodes), for the static bytes.

    * time: a layer's forward FLOPs over one microbatch (``v4.flops``) at the shipped plan's
      1378.8 model TFLOP/s/GPU, against the measured forward ms;
    * activations, two ways. (a) Stage 0 of the shipped plan (embedding + 10 decoder layers, 4
      microbatches in flight under 1F1B at PP 4) peaks at 260.9 GB: minus stage 0's static
      bytes and fixed reserve + p2p buffers from the planner's memory model, over 10 x 4
      layer-microbatches. (b) Independent of the static model: "reference" and "recompute only"
      differ only in recomputing layers 0-2 on stage 0 (3 layers x 4 in flight); if stage 0 is
      the peak in both, 260.9 - 217.2 GB = 12 x (activations - bytes kept when recomputed), the
      kept bytes taken from the measured rows.
    """
    config = load_preset(MODEL)
    measured = {r["layer_kind"]: r for r in rows}
    per_kind: dict[str, dict[str, float]] = {}
    for layer_id in config.layer_ids:
        kind = layer_kind(config, layer_id)
        if kind in per_kind:
            continue
        flop = layer_flops(config, layer_id, SEQ).forward * SEQ * MBS
        row = measured[kind]
        per_kind[kind] = {"forward_gflop_per_microbatch": flop / 1e9,
                          "forward_ms_at_primus_rate": flop / (SHIPPED.tflops * 1e12) * 1e3,
                          "measured_forward_ms": row["forward_ms"],
                          "measured_forward_tflops": flop / (row["forward_ms"] / 1e3) / 1e12,
                          "measured_activation_gb": row["activation_bytes"] / GB,
                          "measured_recompute_kept_gb": row["recompute_kept_bytes"] / GB}
    shipped, reference, no_recompute = (primus[n] for n in (SHIPPED.name, PRIMUS[0].name, PRIMUS[2].name))
    stage0 = parse_layout(SHIPPED.layout, config.layers, PRIMUS_PP).stages[0].layer_ids
    layers0, in_flight = len(stage0), PRIMUS_PP  # 1F1B: stage 0 holds pp microbatches
    static0, fixed0 = shipped["static_bytes"][0], shipped["buffer_bytes"][0]
    recomputed0 = sorted(PRIMUS[0].recompute_ids(config) & set(stage0))
    kept = sum(measured[layer_kind(config, i)]["recompute_kept_bytes"] for i in recomputed0) / len(recomputed0)
    delta = (no_recompute["measured_peak_gb"] - reference["measured_peak_gb"]) * GB
    per_layer = delta / (len(recomputed0) * in_flight) + kept
    return {
        "per_layer_kind": per_kind,
        "stage0_layers": layers0, "stage0_in_flight": in_flight,
        "stage0_static_bytes_model": static0, "stage0_fixed_bytes_model": fixed0,
        "stage0_predicted_peak_bytes_shipped": shipped["rank_bytes"][0],
        "implied_activation_bytes_per_layer_microbatch": {
            "from_peak_minus_static": (SHIPPED.peak_gb * GB - static0) / (layers0 * in_flight),
            "from_peak_minus_static_and_fixed": (SHIPPED.peak_gb * GB - static0 - fixed0) / (layers0 * in_flight),
            "from_recompute_delta": per_layer},
        "stage0_other_bytes_implied_by_recompute_delta": SHIPPED.peak_gb * GB - layers0 * in_flight * per_layer,
        "shipped_step_ms_predicted": shipped["step_ms"],
        "shipped_step_ms_implied_by_primus_tflops": GBS * SEQ * default_flops_per_token(MODEL, SEQ)
        / (PRIMUS_NODES * GPUS_PER_NODE * SHIPPED.tflops * 1e12) * 1e3,
    }


def _gb(value: float) -> str:
    return f"{value / GB:.1f}"


def _row(scenario: str, name: str, s: dict[str, Any], measured: str = "") -> str:
    fit = "yes" if s["fits"] else f"no (+{_gb(s['overflow_bytes'])} GB)"
    peak = f"{_gb(max(s['rank_bytes']))} (r{s['worst_rank']}) / {_gb(s['capacity_bytes'])}"
    layout = s["layout"].replace("|", "\\|")  # a bare '|' would end the table cell, even inside backticks
    return (f"| {scenario} | {name} | `{layout}` | {s['pp']}x{s['vpp']} (dp {s['dp']}, m {s['microbatches']}) | "
            f"{format_ranges(s['recompute_layer_ids'])} | {s['step_ms'] / 1e3:.2f} | {s['tokens_per_s_per_gpu']:.0f} | "
            f"{s['tflops_per_gpu']:.1f} | {peak} | {fit} | {measured} |")


def markdown(scenarios: list[dict[str, Any]]) -> str:
    """One table over the scenarios: the planner's plans (or its no-fit message), its best at pp 4 vpp 1, Primus's."""
    lines = ["| scenario | plan | layout | pp x vpp | recompute ids | step s | tokens/s/GPU | TFLOP/s/GPU | "
             "peak GB (rank) / capacity | fits | Primus measured (4x8 MI355X) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for sc in scenarios:
        name, planner = sc["scenario"], sc["planner"]
        if "no_fit" in planner:
            lines.append(f"| {name} | planner | nothing fits: {planner['no_fit']['message']} ||||||||||")
        else:
            gap = planner["gap"]
            for i, s in enumerate(sc["planner_summaries"]):
                label = f"planner chosen (gap {gap:.1%})" if i == 0 else f"planner #{i + 1}"
                lines.append(_row(name, label, s))
        best = sc["planner_at_primus_parallelism"]
        if "no_fit" in best:
            lines.append(f"| {name} | planner @ pp 4 vpp 1 | nothing fits: {best['no_fit']['message']} ||||||||||")
        else:
            lines.append(_row(name, "planner @ pp 4 vpp 1", best))
        for plan_name, s in sc["primus"].items():
            measured = f"{s['measured_tflops']} TFLOP/s, {s['measured_peak_gb']} GB"
            lines.append(_row(name, f"Primus {plan_name}", s, measured))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    url = os.environ.get("TUNER_DB_URL")
    if len(argv) != 1 or not url:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    source = open_database(url)
    scenarios, loaded = [], None
    for scenario in SCENARIOS:
        calibration = starting_calibration(source, gpu_kind(scenario.gpu).device_name)
        result, loaded = run_scenario(source, calibration, scenario, out)
        result["calibration"] = calibration.to_dict()
        scenarios.append(result)
    rows = provenance(source, loaded)
    on_primus_cluster = next(s["primus"] for s in scenarios if (s["request"]["gpu"], s["request"]["nodes"])
                             == (PRIMUS_GPU, PRIMUS_NODES))
    data = {"kernels": KERNELS, "profiles": rows, "scenarios": scenarios,
            "primus_implied": primus_implied(rows, on_primus_cluster)}
    (out / "projections.json").write_text(json.dumps(data, indent=1))
    print(markdown(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
