"""Layout/recompute planner: exact optimality against brute force on small models, errors, and speed."""

from __future__ import annotations

import functools
import itertools
import math
import random
import time

import pytest

from tuner.planner.costs import LayerCost, MemoryModel, StageExtras
from tuner.planner.search import MiB, NoPlanFits, Plan, _stage_bound, plan
from tuner.planner.schedule import simulate

P2P = 0.1
EXTRAS = StageExtras(embedding_forward_ms=0.5, embedding_backward_ms=1.0, embedding_activation_bytes=10 * MiB,
                     embedding_params=3_000_000, head_forward_ms=1.5, head_backward_ms=3.0,
                     head_activation_bytes=30 * MiB, head_params=3_000_000)
MEMORY = MemoryModel(p2p_buffer_bytes=8 * MiB, overhead_bytes=64 * MiB, dp=2)


def random_layers(rng: random.Random, n: int) -> list[LayerCost]:
    """Heterogeneous decoder layers plus a heavier MTP layer last; bytes in whole MiB so buckets are exact."""
    layers = []
    for i in range(n - 1):
        f = rng.choice([1.0, 1.5, 2.0, 2.5, 3.0])
        layers.append(LayerCost(rng.choice(["csa", "hca", "hash-moe"]), f, f * rng.choice([1.5, 2.0, 2.5]),
                                rng.randint(20, 80) * MiB, rng.randint(2, 10) * MiB,
                                rng.randint(1, 5) * 1_000_000))
    layers.append(LayerCost("mtp", 3.5, 7.0, 90 * MiB, 12 * MiB, 6_000_000))
    return layers


@functools.cache
def peak_in_flight(pp: int, m: int) -> tuple[int, ...]:
    """In-flight counts read off the simulator, not the memory model, so the model is checked too."""
    return tuple(r[0] for r in simulate(pp, 1, m, [1.0] * pp, [1.0] * pp).peak_in_flight)


def splits(n: int, pp: int):
    """Every stage-end tuple: stage 0 may hold no layer, middle stages >= 1, the last holds the MTP layer."""
    for ends in itertools.combinations(range(n), pp - 1):
        yield ends + (n,)


def min_worst_stage_bytes(layers, pp: int, m: int, recompute_all: bool) -> float:
    """Over all splits, the least peak bytes of the fullest stage, with every or no layer recomputed."""
    return min(max(stage_eval(layers, i, pp, m, a, b, frozenset(range(a, b)) if recompute_all else frozenset())[2]
                   for i, (a, b) in enumerate(zip((0,) + ends[:-1], ends)))
               for ends in splits(len(layers), pp))


def stage_eval(layers, stage: int, pp: int, m: int, a: int, b: int, chosen: frozenset[int]) -> tuple[float, float, float]:
    """(forward, backward, peak bytes) of one stage, written out from the model's definition."""
    first, last = stage == 0, stage == pp - 1
    f = sum(l.forward_ms for l in layers[a:b]) + first * EXTRAS.embedding_forward_ms + last * EXTRAS.head_forward_ms
    bw = (sum(l.backward_ms for l in layers[a:b]) + sum(layers[j].forward_ms for j in chosen)
          + first * EXTRAS.embedding_backward_ms + last * EXTRAS.head_backward_ms)
    params = (sum(l.param_count for l in layers[a:b]) + first * EXTRAS.embedding_params
              + last * EXTRAS.head_params)
    act = (sum(layers[j].recompute_kept_bytes if j in chosen else layers[j].activation_bytes for j in range(a, b))
           + first * EXTRAS.embedding_activation_bytes + last * EXTRAS.head_activation_bytes)
    static = params * (2 + 4) + params * 12 / MEMORY.dp
    return f, bw, static + peak_in_flight(pp, m)[stage] * act + MEMORY.p2p_buffer_bytes + MEMORY.overhead_bytes


def brute_force(layers, capacity: float, pp: int, m: int) -> float:
    """Best makespan over every split and every recompute subset of every stage (inf: none fits)."""
    n = len(layers)
    sim = functools.lru_cache(maxsize=None)(
        lambda f, b: simulate(pp, 1, m, list(f), list(b), P2P).makespan)
    best = math.inf
    for ends in splits(n, pp):
        starts = (0,) + ends[:-1]
        options = []
        for i, (a, b) in enumerate(zip(starts, ends)):
            fits = {}
            for r in range(b - a + 1):
                for chosen in itertools.combinations(range(a, b), r):
                    f, bw, mem = stage_eval(layers, i, pp, m, a, b, frozenset(chosen))
                    if mem <= capacity:
                        fits[(f, bw)] = True
            options.append(list(fits))
        for combo in itertools.product(*options):
            best = min(best, sim(tuple(c[0] for c in combo), tuple(c[1] for c in combo)))
    return best


def check_plan(p: Plan, layers, capacity: float, pp: int, m: int) -> None:
    """The plan's layout, recompute, times and memory agree with an independent evaluation and fit."""
    assert p.layout.pp == pp and p.layout.stages[0].symbols[0] == "E" and p.layout.stages[-1].symbols[-2:] == ("m", "L")
    ids = [s.layer_ids for s in p.layout.stages]
    assert [i for s in ids for i in s] == list(range(len(layers)))
    fwd, bwd = [], []
    for i, s in enumerate(ids):
        a, b = (s[0], s[-1] + 1) if s else (0, 0)
        f, bw, mem = stage_eval(layers, i, pp, m, a, b, frozenset(p.recompute_layer_ids) & set(s))
        assert mem <= capacity
        assert mem == pytest.approx(p.stage_bytes[i]) and p.headroom_bytes[i] == pytest.approx(capacity - mem)
        fwd.append(f)
        bwd.append(bw)
    assert simulate(pp, 1, m, fwd, bwd, P2P).makespan == pytest.approx(p.makespan_ms, abs=1e-9)


def binding_case(seed: int):
    """A random model whose memory limit rules out the unconstrained optimum yet still admits a plan."""
    rng = random.Random(seed)
    while True:
        pp = rng.choice([2, 3])
        n = rng.randint(6, 10 if pp == 2 else 8)
        m = rng.randint(2, 6)
        layers = random_layers(rng, n)
        free = brute_force(layers, math.inf, pp, m)
        full = min_worst_stage_bytes(layers, pp, m, recompute_all=True)
        roomy = min_worst_stage_bytes(layers, pp, m, recompute_all=False)
        capacity = full + rng.uniform(0.2, 0.9) * (roomy - full)
        best = brute_force(layers, capacity, pp, m)
        if math.isfinite(best) and best > free + 1e-9:
            return layers, capacity, pp, m, best


@pytest.mark.parametrize("seed", range(8))
def test_plan_matches_brute_force(seed: int) -> None:
    layers, capacity, pp, m, best = binding_case(seed)
    plans = plan(layers, EXTRAS, MEMORY, capacity, pp, m, P2P)
    assert abs(plans[0].makespan_ms - best) <= 1e-9
    assert [p.makespan_ms for p in plans] == sorted(p.makespan_ms for p in plans)
    for p in plans:
        check_plan(p, layers, capacity, pp, m)


@pytest.mark.parametrize("seed", range(8))
def test_recompute_only_where_memory_forces_it(seed: int) -> None:
    layers, capacity, pp, m, _ = binding_case(seed)
    assert plan(layers, EXTRAS, MEMORY, math.inf, pp, m, P2P)[0].recompute_layer_ids == ()
    p = plan(layers, EXTRAS, MEMORY, capacity, pp, m, P2P)[0]
    for stage in p.layout.stages:
        chosen = set(p.recompute_layer_ids) & set(stage.layer_ids)
        i = p.layout.stages.index(stage)
        a, b = (stage.layer_ids[0], stage.layer_ids[-1] + 1) if stage.layer_ids else (0, 0)
        for j in chosen:  # dropping any recomputed layer must overflow the stage
            assert stage_eval(layers, i, pp, m, a, b, frozenset(chosen - {j}))[2] > capacity


def test_in_flight_matches_simulator() -> None:
    for pp, m in [(2, 1), (3, 2), (4, 8), (4, 3)]:
        assert tuple(MemoryModel.in_flight(i, pp, m) for i in range(pp)) == peak_in_flight(pp, m)


def test_bound_never_exceeds_simulated_makespan() -> None:
    rng = random.Random(7)
    for _ in range(300):
        pp, m = rng.randint(2, 5), rng.randint(1, 8)
        f = [rng.uniform(0, 5) for _ in range(pp)]
        b = [rng.uniform(0, 10) for _ in range(pp)]
        p2p = rng.uniform(0, 1)
        makespan = simulate(pp, 1, m, f, b, p2p).makespan
        for i in range(pp):
            chain = sum(f[j] + b[j] + 2 * p2p for j in range(i))
            assert _stage_bound(chain, f[i] + b[i], m) <= makespan + 1e-9


def test_nothing_fits_names_the_closest_stage() -> None:
    rng = random.Random(3)
    pp, m, layers = 3, 4, random_layers(rng, 8)
    # the closest any split gets: minimise over splits the worst stage overflow with full recompute
    worst = min(
        max((stage_eval(layers, i, pp, m, a, b, frozenset(range(a, b)))[2], i)
            for i, (a, b) in enumerate(zip((0,) + ends[:-1], ends)))
        for ends in splits(len(layers), pp))
    capacity = worst[0] - 5 * MiB
    with pytest.raises(NoPlanFits) as err:
        plan(layers, EXTRAS, MEMORY, capacity, pp, m, P2P)
    assert err.value.stage == worst[1] and err.value.overflow_bytes == pytest.approx(5 * MiB)
    assert f"stage {worst[1]}" in str(err.value) and "5.0 MiB" in str(err.value)
    assert "more pipeline stages" in str(err.value)
    assert plan(layers, EXTRAS, MEMORY, worst[0], pp, m, P2P)  # 5 MiB more and it fits


def test_v4_flash_sized_case_is_fast() -> None:
    rng = random.Random(11)
    layers = [LayerCost("csa" if i % 2 else "hca", rng.uniform(9.5, 10.5), rng.uniform(19, 21),
                        rng.randint(1900, 2100) * MiB, 64 * MiB, 300_000_000) for i in range(43)]
    layers.append(LayerCost("mtp", 12.0, 24.0, 2500 * MiB, 80 * MiB, 350_000_000))
    extras = StageExtras(2.0, 4.0, 500 * MiB, 700_000_000, 25.0, 50.0, 6000 * MiB, 700_000_000)
    memory = MemoryModel(p2p_buffer_bytes=256 * MiB, overhead_bytes=4 << 30, dp=32)
    capacity = 60 << 30  # binds: stage 0 alone would hold ~4 x 22 GiB of activations
    start = time.perf_counter()
    plans = plan(layers, extras, memory, capacity, 4, 32, 0.5)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"planning took {elapsed:.1f} s"
    best = plans[0]
    assert best.layout.num_layers == 43 and best.layout.mtp_layers == 1
    assert min(best.headroom_bytes) >= 0 and best.recompute_layer_ids


def test_pruning_keeps_the_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """Branch and bound must return what plain enumeration of every split returns, on a bigger case."""
    rng = random.Random(5)
    layers = random_layers(rng, 16)
    capacity = 0.5 * (min_worst_stage_bytes(layers, 4, 8, True) + min_worst_stage_bytes(layers, 4, 8, False))
    pruned = plan(layers, EXTRAS, MEMORY, capacity, 4, 8, P2P, keep=6)
    monkeypatch.setattr("tuner.planner.search._stage_bound", lambda chain, stage_time, m: 0.0)
    exhaustive = plan(layers, EXTRAS, MEMORY, capacity, 4, 8, P2P, keep=6)
    assert pruned[0].recompute_layer_ids
    assert [p.makespan_ms for p in pruned] == pytest.approx([p.makespan_ms for p in exhaustive], abs=1e-9)
