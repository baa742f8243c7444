"""``bench/plan_projections.py``: planned from the Triton profile rows, a layout priced by the
script's own model equals the planner's price of the same plan (own and another kind's profiles,
several (pp, vpp), with recompute), and Primus's block recompute becomes the right global ids."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.plan_projections import PRIMUS, pipeline_model, price, summary
from db import open_database
from tuner.plan.costs import Calibration
from tuner.plan.profiles import store_profiles
from tuner.plan.request import PlanRequest, default_flops_per_token, plan_request
from tuner.train.profile_layers import LayerCost
from v4.config import load_preset

GB = 10**9
KINDS = ("window/hash", "csa/hash", "hca/learned", "csa/learned", "mtp", "embedding", "head")
CALIBRATION = Calibration(time_scale=1.3, fragmentation=0.1, inter_node_gbps=30.0)


def profiles(rng: random.Random) -> list[LayerCost]:
    """Random per-layer costs; activations large enough against 100 GB that the planner must recompute."""
    out = []
    for kind in KINDS:
        extra = kind in ("embedding", "head")
        forward = rng.uniform(1.0, 9.0)
        experts = 0 if extra else rng.randrange(10**8, 3 * 10**8)
        out.append(LayerCost(layer_kind=kind, forward_ms=forward, backward_ms=forward * rng.uniform(1.5, 2.5),
                             recompute_backward_ms=forward * rng.uniform(2.5, 3.5),
                             activation_bytes=rng.randrange(1, 3) * GB if extra else rng.randrange(15, 35) * GB,
                             recompute_kept_bytes=rng.randrange(10**7, 10**8), params=experts + rng.randrange(10**8),
                             expert_params=experts, optimizer_ms_per_param=1e-8, p2p_bytes=rng.randrange(10**7, 10**8)))
    return out


def store(url: str, rng: random.Random, tables: str) -> None:
    store_profiles(open_database(url), profiles(rng), gpu_kind="NVIDIA H200", gpu_memory_bytes=100 * GB,
                   model="v4-flash", seq=4096, mbs=1, ep=8, kernel_tables=tables)


@pytest.fixture
def engine(tmp_path: Path):
    """A profiles DB with Triton rows and newer eager rows (as measured on the H200)."""
    rng = random.Random(7)
    url = f"sqlite:///{tmp_path / 'profiles.db'}"
    store(url, rng, "triton:sm_90:abc")
    store(url, rng, "eager")
    return open_database(url)


@pytest.mark.parametrize("gpu, profiles_from", [("h200", None), ("mi355x", "h200")])
def test_script_price_equals_planner_price(engine, gpu: str, profiles_from: str | None) -> None:
    request = PlanRequest.parse(model="v4-flash", nodes=8, gpus_per_node=8, gpu=gpu, gbs=64, mbs=1, seq=4096, ep=8,
                                pp=4, top=4, profiles_from=profiles_from, kernels="triton")
    outcome = plan_request(engine, request, CALIBRATION, nodes=400)
    flops = default_flops_per_token("v4-flash", 4096)
    assert any(p.recompute_layer_ids for p in outcome.plans)
    assert len({p.model.vpp for p in outcome.plans}) > 1 or outcome.plans[0].model.vpp > 1
    for plan in outcome.plans:
        model, loaded = pipeline_model(engine, request, CALIBRATION, plan.model.pp, plan.model.vpp)
        assert model.capacity_bytes == outcome.capacity_bytes and loaded.kernel_tables == "triton:sm_90:abc"
        priced = price(model, plan.layout_text, plan.recompute_layer_ids)
        assert priced.step_ms == pytest.approx(plan.step_ms, rel=1e-12)
        assert priced.rank_bytes == pytest.approx(plan.rank_bytes, rel=1e-12)
        figures, planner = summary(priced, request, flops), outcome.plan_dict(plan)
        assert figures["tflops_per_gpu"] == pytest.approx(planner["tflops_per_gpu"], rel=1e-12)
        assert figures["fits"] and figures["rank_bytes"] == pytest.approx([s["total_bytes"] for s in planner["stages"]])


def test_primus_block_recompute_ids() -> None:
    config = load_preset("v4-flash")
    reference, layout_only, _, shipped = PRIMUS
    assert sorted(reference.recompute_ids(config)) == [0, 1, 2, 10, 11, 12, 21, 22, 23, 32, 33, 34]
    assert sorted(layout_only.recompute_ids(config)) == [0, 1, 2, 10, 11, 12, 22, 23, 24, 34, 35, 36]
    assert shipped.recompute_ids(config) == frozenset()
