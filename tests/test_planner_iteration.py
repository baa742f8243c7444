"""The iteration model's terms written out by hand (transfers, the EP all-to-all inside and across nodes, data-parallel tails,
sharded optimizer memory), re-pricing a plan under another calibration, the cluster rules for pp / vpp
auto, and Megatron's recompute flags."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tuner.plan.costs import Calibration, LayerCost, ProfiledCosts, StageExtras
from tuner.plan.iteration import IterationModel, PlanInputs, predict
from v4.layout import even_layout, megatron_recompute, parse_layout
from tuner.plan.parallel import Cluster, Parallelism, ParallelismError, parallelisms
from tuner.plan.schedule import simulate
from tuner.plan.search import search

MiB = 1 << 20
LAYERS = (LayerCost("window/hash", 2.0, 4.0, 300 * MiB, 20 * MiB, 10_000_000, 8_000_000, 2.5),
          LayerCost("csa/hash", 3.0, 6.0, 400 * MiB, 20 * MiB, 12_000_000, 8_000_000),
          LayerCost("hca/learned", 2.5, 5.0, 350 * MiB, 20 * MiB, 11_000_000, 8_000_000),
          LayerCost("csa/learned", 3.0, 6.0, 400 * MiB, 20 * MiB, 12_000_000, 8_000_000),
          LayerCost("mtp", 3.5, 7.0, 450 * MiB, 25 * MiB, 14_000_000, 8_000_000))
EXTRAS = StageExtras(0.5, 1.0, 50 * MiB, 4_000_000, 2.0, 4.0, 200 * MiB, 4_000_000)
COSTS = ProfiledCosts(LAYERS, EXTRAS, (0.4, 0.5, 0.45, 0.5, 0.6), p2p_bytes=64 * MiB, optimizer_ms_per_param=2e-8)


def times(layers) -> list[tuple[float, float, float]]:
    return [(l.forward_ms, l.backward_ms, l.recompute_cost_ms) for l in layers]


def build(nodes: int, gpn: int, pp: int, vpp: int, ep: int, gbs: int = 16, calibration: Calibration | None = None,
          capacity: float = 80e9) -> tuple[IterationModel, Parallelism, Calibration]:
    cal = calibration or Calibration()
    par = Parallelism(Cluster(nodes, gpn), pp, vpp, ep, gbs, 1)
    return IterationModel.from_profiles(PlanInputs(COSTS, par, capacity), cal), par, cal


def test_transfer_alltoall_and_tail_terms() -> None:
    model, par, cal = build(nodes=2, gpn=4, pp=2, vpp=1, ep=2)
    assert (par.dp, par.expert_dp, par.microbatches) == (4, 2, 4)
    p2p = 64 * MiB / (cal.inter_node_gbps * 1e6)  # the pipeline spans both nodes
    assert model.p2p_ms == pytest.approx(p2p) and model.p2p_busy_ms == pytest.approx(0.25 * p2p)
    # ep=2 inside a node: each layer's measured all-to-all once in forward, backward and recompute
    assert [l.forward_ms for l in model.layers] == pytest.approx([2.4, 3.5, 2.95, 3.5, 4.1])
    assert [l.backward_ms for l in model.layers] == pytest.approx([4.4, 6.5, 5.45, 6.5, 7.6])
    assert [l.recompute_cost_ms for l in model.layers] == pytest.approx([2.9, 3.5, 2.95, 3.5, 4.1])
    dense = 0.5 * 6 * 3 / 4 / (cal.intra_node_gbps * 1e6) + 2e-8 / 4  # dp=4 fits a node of 4
    expert = 0.5 * 6 * 1 / 2 / (cal.intra_node_gbps * 1e6) + 2e-8 / 2
    assert model.tail_ms_per_param == pytest.approx((dense, expert))
    mem = model.memory
    assert (mem.dense_shards, mem.expert_shards, mem.activation_factor) == (4, 2, pytest.approx(1.05))
    assert mem.p2p_buffer_bytes == 2 * 64 * MiB and mem.overhead_bytes == cal.reserved_bytes
    assert mem.static_bytes(10, 6) == 10 * 6 + (4 / 4 + 6 / 2) * 12

    one_node, _, _ = build(nodes=1, gpn=8, pp=2, vpp=1, ep=2)
    assert one_node.p2p_ms == pytest.approx(64 * MiB / (cal.intra_node_gbps * 1e6))
    across, _, _ = build(nodes=4, gpn=2, pp=1, vpp=1, ep=8)  # EP of 8 over nodes of 2 GPUs
    # x = 6/7 of the volume at 45 instead of 360 GB/s: 0.4 ms * (1/7 + 6/7 * 8) = 0.4 * 7 = 2.8 ms
    assert cal.intra_node_gbps / cal.inter_node_gbps == 8
    assert [l.forward_ms for l in across.layers] == pytest.approx([4.8, 6.5, 5.65, 6.5, 7.7])
    assert [l.backward_ms for l in across.layers] == pytest.approx([6.8, 9.5, 8.15, 9.5, 11.2])
    assert [l.recompute_cost_ms for l in across.layers] == pytest.approx([5.3, 6.5, 5.65, 6.5, 7.7])
    assert across.p2p_ms == 0 and across.p2p_busy_ms == 0
    no_ep, _, _ = build(nodes=1, gpn=8, pp=1, vpp=1, ep=1)  # no EP peers: no all-to-all, whatever is stored
    assert times(no_ep.layers) == times(LAYERS)


def test_an_unmeasured_alltoall_is_0_inside_a_node_and_refused_across_nodes() -> None:
    costs = ProfiledCosts(LAYERS, EXTRAS, (None,) * 5, 64 * MiB, None)
    inside = Parallelism(Cluster(1, 8), 1, 1, 8, 16, 1)
    assert times(IterationModel.from_profiles(PlanInputs(costs, inside, 80e9), Calibration()).layers) == times(LAYERS)
    par = Parallelism(Cluster(4, 2), 1, 1, 8, 16, 1)
    with pytest.raises(ValueError, match=r"no measured EP all-to-all .* `tuner profile alltoall --ep 8`"):
        IterationModel.from_profiles(PlanInputs(costs, par, 80e9), Calibration())


def test_evaluate_and_predict_under_another_calibration() -> None:
    model, _, cal = build(nodes=1, gpn=8, pp=2, vpp=2, ep=2, gbs=16)
    layout = parse_layout("Et|t|t|tmL", 4, 2, 1)
    ev = model.evaluate(layout, [1, 4])
    busy = [model.busy_ms(s) for s in range(4)]
    a2a = COSTS.alltoall_ms  # ep=2 in a node of 8: each layer's all-to-all in forward, backward and recompute
    fwd = [0.5 + 2.0 + a2a[0] + busy[0], 3.0 + a2a[1] + busy[1], 2.5 + a2a[2] + busy[2],
           3.0 + a2a[3] + 3.5 + a2a[4] + 2.0 + busy[3]]
    bwd = [1.0 + 4.0 + a2a[0] + busy[0], 6.0 + a2a[1] + (3.0 + a2a[1]) + busy[1], 5.0 + a2a[2] + busy[2],
           6.0 + a2a[3] + 7.0 + a2a[4] + 4.0 + (3.5 + a2a[4]) + busy[3]]
    assert ev.forward_ms == pytest.approx(fwd) and ev.backward_ms == pytest.approx(bwd)
    sim = simulate(2, 2, model.microbatches, fwd, bwd, model.p2p_ms, "interleaved")
    params, experts = [4e6 + 10e6 + 11e6, 12e6 + 12e6 + 14e6 + 4e6], [16e6, 24e6]
    tails = [model.tail_ms(p, x) for p, x in zip(params, experts)]
    ends = [max(o.end for o in sim.ops if o.rank == r) for r in range(2)]
    assert ev.step_ms == pytest.approx(max(e + t for e, t in zip(ends, tails)))
    kept = [50 * MiB + 300 * MiB, 20 * MiB, 350 * MiB, 400 * MiB + 25 * MiB + 200 * MiB]  # ids 1 and 4 recomputed
    peaks = [[(3, 2), (4, 1)], [(2, 1), (3, 0)]]  # microbatches held per virtual stage (pp 2, vpp 2, m 4)
    workspace = [0, max(400 - 20, 450 - 25) * MiB]  # rank 1 recomputes ids 1 and 4: the larger re-materialises
    for r in range(2):
        m = ev.memory[r]
        assert m.weights_and_grads == pytest.approx(params[r] * 6)
        assert m.optimizer == pytest.approx(((params[r] - experts[r]) / 4 + experts[r] / 2) * 12)
        live = max(sum(n * k for n, k in zip(vec, kept[r::2])) for vec in peaks[r])
        assert m.activations == pytest.approx(1.05 * (live + workspace[r]))
        assert m.workspace == pytest.approx(1.05 * workspace[r])
        assert m.buffers == 2 * 64 * MiB + cal.reserved_bytes
    plan = search([model], keep=1).plans[0]
    step, _ = predict(plan)
    assert step == plan.step_ms
    slower, _ = predict(plan, Calibration(time_scale=2.0))
    assert slower > 1.9 * step  # compute doubles; transfers and tails do not
    with pytest.raises(ValueError, match="has pp=2 vpp=1"):
        model.evaluate(even_layout(4, 2, 1), [])


def test_the_recompute_workspace_adds_to_the_recomputing_rank_only() -> None:
    """1F1B, pp 2, m 4: rank 0 (E + ids 0-1, 2 in flight) recomputes id 1, rank 1 (ids 2-4 + head, 1 in
    flight) nothing. Rank 0's peak gains its recomputed layer's re-materialised bytes, 400 - 20 MiB, times
    1.05; rank 1's is what it was without the term."""
    model, _, _ = build(nodes=1, gpn=8, pp=2, vpp=1, ep=2, gbs=16)
    layout = parse_layout("Et*2|t*2mL", 4, 2, 1)
    ev = model.evaluate(layout, [1])
    kept = [2 * (50 + 300 + 20) * MiB, 1 * (350 + 400 + 450 + 200) * MiB]  # in flight x (bytes per microbatch)
    assert [m.workspace for m in ev.memory] == pytest.approx([1.05 * 380 * MiB, 0])
    assert [m.activations for m in ev.memory] == pytest.approx([1.05 * (kept[0] + 380 * MiB), 1.05 * kept[1]])
    without = dataclasses.replace(model, memory=dataclasses.replace(model.memory, recompute_workspace=False))
    before = without.evaluate(layout, [1])
    assert [m.workspace for m in before.memory] == [0, 0]
    assert ev.memory[0].total - before.memory[0].total == pytest.approx(1.05 * 380 * MiB)
    assert ev.memory[1].total == before.memory[1].total
    # recomputing id 0 as well: the workspace is the larger of the two (400 - 20 against 300 - 20), not the sum
    both = model.evaluate(layout, [0, 1]).memory[0]
    assert both.workspace == pytest.approx(1.05 * 380 * MiB)
    assert both.total - before.memory[0].total == pytest.approx(1.05 * (380 - 2 * 280) * MiB)


def test_calibration_round_trip_and_validation() -> None:
    cal = Calibration(dp_overlap=0.8, fragmentation=0.1)
    assert Calibration.from_dict(cal.to_dict()) == cal
    for bad, match in [(dict(dp_overlap=1.5), "dp_overlap"), (dict(inter_node_gbps=-1), "inter_node_gbps"),
                       (dict(time_scale=0), "time_scale"), (dict(fragmentation=math.nan), "fragmentation")]:
        with pytest.raises(ValueError, match=match):
            Calibration(**bad)
    with pytest.raises(ValueError, match="unknown calibration fields"):
        Calibration.from_dict({"bandwidth": 1})


def test_pp_and_vpp_auto() -> None:
    cluster = Cluster(4, 8)
    found = {(p.pp, p.vpp) for p in parallelisms(cluster, gbs=256, mbs=1, ep=8, layers=44)}
    assert {pp for pp, _ in found} == {1, 2, 4}  # pp 8 would leave dp 4, which ep 8 does not divide
    assert {v for pp, v in found if pp == 4} == set(range(1, 12))  # 4 x 11 stages hold 44 layers
    assert {v for pp, v in found if pp == 1} == {1}
    par = next(p for p in parallelisms(cluster, gbs=256, mbs=1, ep=8, layers=44, pp=4, vpp=2))
    assert (par.dp, par.expert_dp, par.microbatches) == (8, 1, 32) and par.p2p_crosses_nodes
    assert not par.dp_crosses_nodes and par.ep_off_node_fraction == 0
    odd = parallelisms(Cluster(1, 6), gbs=9, mbs=1, ep=1, layers=8, pp=2)
    assert {p.vpp for p in odd} == {1}  # dp 3: 3 microbatches, not a multiple of pp, so no interleaving
    for kwargs, field in [(dict(pp=3), "pp"), (dict(pp=4, vpp=12), "vpp"), (dict(gbs=100, mbs=3, ep=1), "gbs"),
                          (dict(ep=3), "ep"), (dict(mbs=0), "mbs"), (dict(pp=1, vpp=2), "vpp")]:
        args = dict(gbs=256, mbs=1, ep=8, layers=44) | kwargs
        with pytest.raises(ParallelismError) as err:
            parallelisms(cluster, **args)
        assert err.value.field == field and str(err.value).startswith(f"{field}: ")
    with pytest.raises(ParallelismError, match="gpus-per-node"):
        Cluster(2, 0)


def test_megatron_recompute_flags() -> None:
    layout = parse_layout("Et*3|t*3|t*2mL", 8, 3, 1)
    assert megatron_recompute(layout, []) == {}
    assert megatron_recompute(layout, range(8)) == {"recompute_granularity": "full", "recompute_method": "uniform",
                                                     "recompute_num_layers": 1}
    assert megatron_recompute(layout, [0, 1, 3, 4, 6, 7]) == {
        "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2}
    assert megatron_recompute(layout, [0, 3, 6]) == {
        "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}
    assert megatron_recompute(layout, [0, 3]) is None  # the last stage recomputes nothing
    assert megatron_recompute(layout, [0, 3, 6, 8]) is None  # the MTP layer has no Megatron flag
