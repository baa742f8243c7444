"""bench/plan_time.py and bench/plan_projections.py on the packaged profiles: the figures they record are the
planner's own (the same plans, the same prices), with their targets and provenance; no time is asserted."""

from __future__ import annotations

import argparse

import pytest

from bench import plan_projections, plan_time
from db import open_database
from tuner.plan.request import PlanRequest, plan_request
from v4.layout import parse_layout


def args(module, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_plan_time_records_every_count_its_plan_and_both_targets() -> None:
    figures = plan_time.run(args(plan_time, "--nodes", "8,16", "--repeat", "1"))
    per = figures["per_node_count"]
    assert set(per) == {"8", "16"} and not per["8"]["fits"] and per["8"]["why"].startswith("nothing fits")
    assert per["16"]["fits"] and per["16"]["lower_bound_ms"] <= per["16"]["step_ms"] and per["16"]["cpu_s"] > 0
    assert figures["smallest_fitting_nodes"] == 16 and figures["profiles_source"].startswith("packaged h100")
    assert [t["status"] in ("met", "missed") for t in figures["targets"]] == [True, True]
    with pytest.raises(ValueError, match="nodes"):
        plan_time.run(args(plan_time, "--nodes", "0"))


def test_projections_price_primus_with_the_planners_model(tmp_path) -> None:
    figures = plan_projections.run(args(plan_projections, "--nodes", "16"))
    row = figures["node_counts"]["16"]
    primus = row["Primus hand plan"]
    assert primus["layout"] == "Et*10|t*12|t*12|t*9mL" and primus["recompute_layer_ids"] == []
    assert len(primus["rank_peak_bytes"]) == 4 and primus["fits"] == (primus["overflow_bytes"] == 0)
    planner = row["planner"]
    parse_layout(planner["layout"], 43, planner["pp"])
    # the planner's own answer to the same request, on an empty database, is the recorded one
    engine = open_database(f"sqlite:///{tmp_path / 'empty.db'}")
    outcome = plan_request(engine, PlanRequest.parse(model="v4-flash", nodes=16, gpus_per_node=8, gpu="h100",
                                                     gbs=256, seq=4096, top=1))
    assert planner["step_ms"] == pytest.approx(outcome.plans[0].step_ms) and planner["layout"] == outcome.plans[0].layout_text
    assert not figures["borrowed"] and not figures["alltoall_priced"] and figures["warnings"]
    assert figures["markdown"].count("\n| 16 |") == 3
    borrowed = plan_projections.run(args(plan_projections, "--nodes", "16", "--gpu", "mi355x", "--profiles-from", "h100"))
    assert borrowed["borrowed"] and borrowed["label"].startswith("BORROWED: planned for mi355x from h100 profiles")
