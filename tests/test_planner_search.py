"""Layout/recompute planner: optimality against brute force on small models (1F1B and interleaved),
bound validity on every partial split, in-flight memory counts, the no-fit diagnosis, and speed."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random

import pytest

from tests.test_schedule import megatron_order
from tuner.plan import search as search_module
from tuner.plan.costs import LayerCost, MemoryModel, StageExtras
from tuner.plan.iteration import IterationModel, Plan, predict
from tuner.plan.schedule import in_flight_peaks, simulate
from tuner.plan.search import MiB, NoPlanFits, _level_curve, search

EXTRAS = StageExtras(embedding_forward_ms=0.5, embedding_backward_ms=1.0, embedding_activation_bytes=10 * MiB,
                     embedding_params=3_000_000, head_forward_ms=1.5, head_backward_ms=3.0,
                     head_activation_bytes=30 * MiB, head_params=3_000_000)
MEMORY = MemoryModel(p2p_buffer_bytes=8 * MiB, overhead_bytes=64 * MiB, dense_shards=2, expert_shards=1)
NO_WORKSPACE = dataclasses.replace(MEMORY, recompute_workspace=False)  # the model before the recompute workspace
TAILS = (1e-7, 2e-7)  # ms per dense / expert parameter after the last backward


def random_layers(rng: random.Random, n: int, whole_mib: bool = True) -> list[LayerCost]:
    """Heterogeneous decoder layers plus a heavier MTP layer last; bytes in whole MiB, or any byte count."""
    layers = []
    for _ in range(n - 1):
        f = rng.choice([1.0, 1.5, 2.0, 2.5, 3.0])
        params = rng.randint(1, 5) * 1_000_000
        act, kept = ((rng.randint(20, 80) * MiB, rng.randint(2, 10) * MiB) if whole_mib else
                     (rng.randint(20 * MiB, 80 * MiB), rng.randint(2 * MiB, 10 * MiB)))
        layers.append(LayerCost(rng.choice(["csa", "hca", "window"]), f, f * rng.choice([1.5, 2.0, 2.5]),
                                act, kept, params,
                                expert_param_count=params * rng.randint(0, 3) // 4,
                                recompute_ms=rng.choice([None, f * 1.5])))
    layers.append(LayerCost("mtp", 3.5, 7.0, 90 * MiB, 12 * MiB, 6_000_000, 3_000_000))
    return layers


def make_model(layers, capacity: float, pp: int, vpp: int, m: int, memory: MemoryModel = MEMORY) -> IterationModel:
    return IterationModel(tuple(layers), EXTRAS, memory, capacity, pp, vpp, m, p2p_ms=0.1, p2p_busy_ms=0.05,
                          tail_ms_per_param=TAILS)


@functools.cache
def live_vectors(pp: int, vpp: int, m: int) -> tuple[frozenset[tuple[int, ...]], ...]:
    """Per rank every vector of microbatches held per virtual stage, read off the test's own op order."""
    out = []
    for order in megatron_order(pp, vpp, m):
        live, seen = [0] * vpp, set()
        for kind, _, stage in order:
            live[stage // pp] += 1 if kind == "F" else -1
            seen.add(tuple(live))
        out.append(frozenset(seen))
    return tuple(out)


def splits(n: int, chunks: int):
    """Every chunk-end tuple: chunk 0 may hold no layer, middle chunks >= 1, the last holds the MTP layer."""
    for ends in itertools.combinations(range(n), chunks - 1):
        yield ends + (n,)


def stage_sums(model: IterationModel, ends: tuple[int, ...], chosen: frozenset[int]):
    """Per stage forward, backward (with recompute) and kept bytes; per rank params and expert params."""
    L, e, pp, C = model.layers, model.extras, model.pp, model.stages
    fwd, bwd, kept = [], [], []
    params, experts = [0] * pp, [0] * pp
    for c, (a, b) in enumerate(zip((0,) + ends[:-1], ends)):
        first, last = c == 0, c == C - 1
        busy = model.p2p_busy_ms * ((c > 0) + (c < C - 1)) if pp > 1 else 0.0
        fwd.append(sum(l.forward_ms for l in L[a:b]) + first * e.embedding_forward_ms + last * e.head_forward_ms + busy)
        bwd.append(sum(l.backward_ms for l in L[a:b]) + first * e.embedding_backward_ms + last * e.head_backward_ms
                   + busy + sum(L[j].recompute_cost_ms for j in range(a, b) if j in chosen))
        kept.append(sum(L[j].recompute_kept_bytes if j in chosen else L[j].activation_bytes for j in range(a, b))
                    + first * e.embedding_activation_bytes + last * e.head_activation_bytes)
        params[c % pp] += sum(l.param_count for l in L[a:b]) + first * e.embedding_params + last * e.head_params
        experts[c % pp] += sum(l.expert_param_count for l in L[a:b])
    return fwd, bwd, kept, params, experts


def evaluate(model: IterationModel, ends: tuple[int, ...], chosen: frozenset[int]) -> tuple[float, tuple[float, ...]]:
    """(step, bytes per rank) of a split and recompute set, written out from the model's definition."""
    fwd, bwd, _, params, experts = stage_sums(model, ends, chosen)
    pp = model.pp
    result = simulate(pp, model.vpp, model.microbatches, fwd, bwd, model.p2p_ms,
                      "1f1b" if model.vpp == 1 else "interleaved")
    ends_by_rank = [max(o.end for o in result.ops if o.rank == r) for r in range(pp)]
    step = max(end + (params[r] - experts[r]) * TAILS[0] + experts[r] * TAILS[1] for r, end in enumerate(ends_by_rank))
    return step, evaluate_bytes(model, ends, chosen)


def brute_force(model: IterationModel) -> tuple[float, float, dict[tuple[int, ...], float]]:
    """(true optimum over every split and recompute set, optimum under least-total recompute per rank,
    per split its true optimum); inf where nothing fits."""
    n, pp, C = len(model.layers), model.pp, model.stages
    best_any = best_policy = math.inf
    per_split: dict[tuple[int, ...], float] = {}
    for ends in splits(n, C):
        starts = (0,) + ends[:-1]
        options = []  # per rank: {(added time per virtual stage): recompute set} that fit
        for r in range(pp):
            ids = [j for c in range(r, C, pp) for j in range(starts[c], ends[c])]
            fits = {}
            for size in range(len(ids) + 1):
                for chosen in itertools.combinations(ids, size):
                    if evaluate_rank_bytes(model, ends, frozenset(chosen), r) <= model.capacity_bytes:
                        key = tuple(sum(model.layers[j].recompute_cost_ms for j in chosen
                                        if starts[c] <= j < ends[c]) for c in range(r, C, pp))
                        fits.setdefault(key, frozenset(chosen))
            options.append(fits)
        if not all(options):
            continue
        split_best = min(evaluate(model, ends, frozenset().union(*combo))[0]
                         for combo in itertools.product(*(o.values() for o in options)))
        per_split[ends] = split_best
        best_any = min(best_any, split_best)
        policy = frozenset().union(*(o[min(o, key=lambda t: (sum(t), t))] for o in options))
        best_policy = min(best_policy, evaluate(model, ends, policy)[0])
    return best_any, best_policy, per_split


def evaluate_rank_bytes(model: IterationModel, ends, chosen, rank: int) -> float:
    return evaluate_bytes(model, ends, chosen)[rank]


@functools.lru_cache(maxsize=None)
def _bytes_cached(model: IterationModel, ends: tuple[int, ...], chosen: frozenset[int]) -> tuple[float, ...]:
    _, _, kept, params, experts = stage_sums(model, ends, chosen)
    mem, pp, out = model.memory, model.pp, []
    for r in range(pp):
        static = params[r] * 6 + ((params[r] - experts[r]) / mem.dense_shards + experts[r] / mem.expert_shards) * 12
        act = max(sum(n * k for n, k in zip(vec, kept[r::pp])) for vec in live_vectors(pp, model.vpp, model.microbatches)[r])
        # the recompute workspace: the most one recomputed layer of the rank re-materialises
        starts = (0,) + tuple(ends[:-1])
        mine = [j for c in range(r, model.stages, pp) for j in range(starts[c], ends[c]) if j in chosen]
        workspace = max((model.layers[j].activation_bytes - model.layers[j].recompute_kept_bytes for j in mine),
                        default=0) if mem.recompute_workspace else 0
        out.append(static + mem.activation_factor * (act + workspace) + mem.p2p_buffer_bytes + mem.overhead_bytes)
    return tuple(out)


def evaluate_bytes(model: IterationModel, ends, chosen) -> tuple[float, ...]:
    """Peak bytes per rank of a split and recompute set, from the model's definition and the test's own op order."""
    return _bytes_cached(model, tuple(ends), frozenset(chosen))


def worst_rank_bytes(model: IterationModel, recompute_all: bool) -> float:
    """Over all splits, the least peak bytes of the fullest rank with every or no layer recomputed."""
    ids = frozenset(range(len(model.layers))) if recompute_all else frozenset()
    return min(max(evaluate_bytes(model, ends, ids)) for ends in splits(len(model.layers), model.stages))


def binding_case(seed: int, vpp: int, memory: MemoryModel = MEMORY, whole_mib: bool = True):
    """A random model whose memory limit rules out the unconstrained optimum yet still admits a plan."""
    rng = random.Random(seed)
    while True:
        pp = rng.choice([2, 3]) if vpp == 1 else 2
        n = rng.randint(6, 9) if vpp == 1 else rng.randint(2 * vpp + 1, 7)
        m = rng.randint(2, 6) if vpp == 1 else 2 * rng.randint(1, 3)
        layers = random_layers(rng, n, whole_mib)
        roomy_model = make_model(layers, math.inf, pp, vpp, m, memory)
        full = worst_rank_bytes(roomy_model, recompute_all=True)
        roomy = worst_rank_bytes(roomy_model, recompute_all=False)
        model = make_model(layers, full + rng.uniform(0.2, 0.9) * (roomy - full), pp, vpp, m, memory)
        free, _, _ = brute_force(roomy_model)
        best, policy, per_split = brute_force(model)
        if math.isfinite(best) and best > free + 1e-9:
            return model, best, policy, per_split


def check_plan(p: Plan, model: IterationModel) -> None:
    """The plan's layout, recompute, step and memory agree with the independent evaluation, and it fits."""
    ids = [i for s in p.layout.stages for i in s.layer_ids]
    assert ids == list(range(len(model.layers)))
    assert p.layout.stages[0].symbols[0] == "E" and p.layout.stages[-1].symbols[-2:] == ("m", "L")
    ends = tuple(itertools.accumulate(len(s.layer_ids) for s in p.layout.stages))
    step, rank_bytes = evaluate(model, ends, frozenset(p.recompute_layer_ids))
    assert p.step_ms == pytest.approx(step, abs=1e-9)
    assert p.rank_bytes == pytest.approx(rank_bytes)
    assert max(rank_bytes) <= model.capacity_bytes
    assert predict(p) == (pytest.approx(step, abs=1e-9), pytest.approx(tuple(rank_bytes)))


@pytest.mark.parametrize("memory", [MEMORY, NO_WORKSPACE], ids=["workspace", "no-workspace"])
@pytest.mark.parametrize("seed", range(6))
def test_1f1b_matches_brute_force(seed: int, memory: MemoryModel) -> None:
    model, best, policy, _ = binding_case(seed, vpp=1, memory=memory)
    assert policy == pytest.approx(best, abs=1e-9)  # with one stage per rank the least total is optimal
    result = search([model], keep=3)
    assert result.plans[0].step_ms == pytest.approx(best, abs=1e-9)
    assert result.lower_bound_ms == pytest.approx(best, abs=1e-9) and result.gap == pytest.approx(0, abs=1e-12)
    assert [p.step_ms for p in result.plans] == sorted(p.step_ms for p in result.plans)
    for p in result.plans:
        check_plan(p, model)


@pytest.mark.parametrize("memory", [MEMORY, NO_WORKSPACE], ids=["workspace", "no-workspace"])
@pytest.mark.parametrize("seed", range(6))
def test_interleaved_matches_brute_force(seed: int, memory: MemoryModel) -> None:
    model, best, policy, _ = binding_case(100 + seed, vpp=2, memory=memory)
    result = search([model], keep=3)
    assert result.plans[0].step_ms == pytest.approx(policy, abs=1e-9)  # exact under least-total recompute
    assert result.lower_bound_ms <= best + 1e-9 <= result.plans[0].step_ms + 2e-9  # the proven bound holds
    for p in result.plans:
        check_plan(p, model)


@pytest.mark.parametrize("vpp", [1, 2])
@pytest.mark.parametrize("seed", range(10))
def test_bytes_not_whole_mib_match_an_exhaustive_search(seed: int, vpp: int) -> None:
    """Any byte counts, and the limit within a MiB of what the optimum needs: the search is exact on 1F1B and
    its bound holds on interleaved (the old 1 MiB rounding missed such plans and still claimed gap 0)."""
    model, best, policy, _ = binding_case(300 + seed, vpp=vpp, whole_mib=False)
    assert any(b % MiB for l in model.layers for b in (l.activation_bytes, l.recompute_kept_bytes))
    result = search([model], keep=1)
    if vpp == 1:
        assert result.plans[0].step_ms == pytest.approx(best, abs=1e-9) and result.gap == pytest.approx(0, abs=1e-12)
    else:
        assert result.plans[0].step_ms == pytest.approx(policy, abs=1e-9)
        assert result.lower_bound_ms <= best + 1e-9
    check_plan(result.plans[0], model)
    ends = tuple(itertools.accumulate(len(s.layer_ids) for s in result.plans[0].layout.stages))
    needed = max(evaluate_bytes(model, ends, frozenset(result.plans[0].recompute_layer_ids)))
    tight = dataclasses.replace(model, capacity_bytes=needed + random.Random(seed).randint(1, MiB - 1))
    tight_best, tight_policy, _ = brute_force(tight)
    again = search([tight], keep=1)
    assert again.plans[0].step_ms == pytest.approx(tight_best if vpp == 1 else tight_policy, abs=1e-9)
    assert again.lower_bound_ms <= tight_best + 1e-9
    check_plan(again.plans[0], tight)


@pytest.mark.parametrize(("seed", "vpp"), [(0, 1), (1, 1), (100, 2), (101, 2), (102, 2), (200, 3), (201, 3), (202, 3)])
def test_bound_never_exceeds_any_completion(seed: int, vpp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bound the search computes is <= the true optimum of every split extending that prefix."""
    model, _, _, per_split = binding_case(seed, vpp)
    calls = []
    original = search_module._Prepared.bound

    def recording(self, k, pos, threshold):
        value = original(self, k, pos, math.inf)
        calls.append((tuple(self.b[:k]), value))
        return value

    monkeypatch.setattr(search_module._Prepared, "bound", recording)
    search([model], keep=10**6)  # keep everything: nothing is pruned, every prefix is bounded
    assert calls
    for prefix, value in calls:
        completions = [t for ends, t in per_split.items() if ends[:len(prefix)] == prefix]
        if completions:
            assert value <= min(completions) + 1e-9, (prefix, value, min(completions))


def rank_min_recompute(model: IterationModel, ends: tuple[int, ...], rank: int) -> float:
    """Least total recompute time of ``rank`` that fits, by enumerating its subsets (inf: none fits)."""
    starts = (0,) + ends[:-1]
    ids = [j for c in range(rank, model.stages, model.pp) for j in range(starts[c], ends[c])]
    return min((sum(model.layers[j].recompute_cost_ms for j in chosen)
                for size in range(len(ids) + 1) for chosen in itertools.combinations(ids, size)
                if evaluate_rank_bytes(model, ends, frozenset(chosen), rank) <= model.capacity_bytes),
               default=math.inf)


@pytest.mark.parametrize(("seed", "pp", "vpp"), [(0, 2, 2), (1, 2, 2), (2, 2, 3), (3, 3, 2), (4, 2, 3)])
def test_future_recompute_bound_is_valid(seed: int, pp: int, vpp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's placed least total plus the bound on what its future layers force never exceeds the least
    recompute it really needs, in any completion; on tight memory, where the bound is active."""
    rng = random.Random(seed)
    layers = random_layers(rng, 2 * vpp + 2 if pp == 3 else 2 * vpp + 3)
    m = 2 * pp
    probe = make_model(layers, math.inf, pp, vpp, m)
    model = make_model(layers, worst_rank_bytes(probe, True) * 1.05, pp, vpp, m)
    calls = []
    original = search_module._Prepared._future

    def recording(self, r, k):
        pieces = original(self, r, k)
        calls.append((r, k, tuple(self.b[:k]), self.total[r], pieces))
        return pieces

    monkeypatch.setattr(search_module._Prepared, "_future", recording)
    search([model], keep=10**6)
    work = [0.0] + list(itertools.accumulate(l.forward_ms + l.backward_ms for l in layers))
    active = 0
    for r, k, prefix, total, pieces in calls:
        for ends in splits(len(layers), model.stages):
            if ends[:k] != prefix:
                continue
            starts = (0,) + ends[:-1]
            x = sum(work[ends[c]] - work[starts[c]] for c in range(k, model.stages) if c % pp == r)
            excess = search_module._excess_at(pieces, x)
            active += excess > 0
            assert total + excess <= rank_min_recompute(model, ends, r) + 1e-9, (r, prefix, ends)
    assert active  # the case exercises the bound


def test_recompute_only_where_memory_forces_it() -> None:
    for seed in range(4):
        model, *_ = binding_case(seed, vpp=1)
        roomy = make_model(model.layers, math.inf, model.pp, 1, model.microbatches)
        assert search([roomy], keep=1).plans[0].recompute_layer_ids == ()
        p = search([model], keep=1).plans[0]
        ends = tuple(itertools.accumulate(len(s.layer_ids) for s in p.layout.stages))
        for j in p.recompute_layer_ids:  # dropping any recomputed layer must overflow its rank
            rank = next(i for i, s in enumerate(p.layout.stages) if j in s.layer_ids) % model.pp
            assert evaluate_bytes(model, ends, frozenset(p.recompute_layer_ids) - {j})[rank] > model.capacity_bytes


@pytest.mark.parametrize(("pp", "vpp", "m"), [(1, 1, 3), (2, 1, 1), (3, 1, 2), (4, 1, 8), (4, 1, 3), (2, 2, 2),
                                              (2, 2, 6), (4, 2, 8), (3, 3, 6), (4, 3, 4), (2, 5, 4)])
def test_in_flight_counts(pp: int, vpp: int, m: int) -> None:
    """Megatron's count is the most microbatches a rank holds; the peak vectors are the maximal live vectors."""
    peaks = in_flight_peaks(pp, vpp, m)
    for r, seen in enumerate(live_vectors(pp, vpp, m)):
        maximal = {a for a in seen if not any(b != a and all(x >= y for x, y in zip(b, a)) for b in seen)}
        assert set(peaks[r]) == maximal
        assert max(sum(v) for v in seen) == MemoryModel.in_flight(r, pp, m, vpp)
    # uniform stages: the memory model's peak is Megatron's count times one stage's bytes
    for r in range(pp):
        assert MEMORY.activation_bytes(peaks[r], [7.0] * vpp) == 7.0 * MemoryModel.in_flight(r, pp, m, vpp)


def test_nothing_fits_names_the_closest_stage() -> None:
    rng = random.Random(3)
    model = make_model(random_layers(rng, 8), math.inf, 3, 1, 4)
    ids = frozenset(range(8))
    # the closest any split gets: minimise over splits the fullest rank with full recompute
    worst, stage = min((max((b, r) for r, b in enumerate(evaluate_bytes(model, ends, ids))))
                       for ends in splits(8, 3))
    tight = make_model(model.layers, worst - 5 * MiB, 3, 1, 4)
    with pytest.raises(NoPlanFits) as err:
        search([tight])
    assert err.value.rank == stage and err.value.overflow_bytes == pytest.approx(5 * MiB)
    assert f"stage {stage}" in str(err.value) and "5.0 MiB" in str(err.value) and "smaller micro-batch" in str(err.value)
    assert search([make_model(model.layers, worst, 3, 1, 4)]).plans  # 5 MiB more and it fits
    starved = make_model(model.layers, 100 * MiB, 3, 1, 4)  # not even the weights fit
    with pytest.raises(NoPlanFits, match="more nodes"):
        search([starved])


def test_best_of_several_models_and_tolerance() -> None:
    """Searching pp/vpp candidates together returns the best of their separate searches; a tolerance
    stays within its promise."""
    rng = random.Random(21)
    layers = random_layers(rng, 9)
    models = [make_model(layers, math.inf, pp, vpp, 4) for pp, vpp in [(1, 1), (2, 1), (2, 2), (4, 1)]]
    alone = min(search([m], keep=1).plans[0].step_ms for m in models)
    together = search(models, keep=4)
    assert together.plans[0].step_ms == pytest.approx(alone, abs=1e-9)
    loose = search(models, keep=1, tolerance=0.05)
    assert loose.plans[0].step_ms <= alone * 1.05 + 1e-9 and loose.gap <= 0.05 + 1e-12
    assert loose.lower_bound_ms <= alone + 1e-9


def flash_sized(capacity_gib: float) -> list[IterationModel]:
    """A V4-Flash-sized model (43 layers + MTP) at 4 ranks, 1F1B and interleaved."""
    rng = random.Random(11)
    layers = [LayerCost("csa/learned" if i % 2 else "hca/learned", rng.uniform(9.5, 10.5), rng.uniform(19, 21),
                        rng.randint(1900, 2100) * MiB, 64 * MiB, 300_000_000, 260_000_000) for i in range(43)]
    layers.append(LayerCost("mtp", 12.0, 24.0, 2500 * MiB, 80 * MiB, 350_000_000, 260_000_000))
    extras = StageExtras(2.0, 4.0, 500 * MiB, 700_000_000, 25.0, 50.0, 6000 * MiB, 700_000_000)
    memory = MemoryModel(p2p_buffer_bytes=256 * MiB, overhead_bytes=4 << 30, dense_shards=8, expert_shards=1)
    return [IterationModel(tuple(layers), extras, memory, capacity_gib * (1 << 30), 4, vpp, 32, 0.5, 0.1, (1e-8, 1e-8))
            for vpp in (1, 2, 3)]


def test_v4_flash_sized_case_is_bounded() -> None:
    models = flash_sized(70)  # binds: stage 0 alone would hold ~4 x 22 GiB of activations
    result = search(models, keep=5, tolerance=0.002, max_nodes=600)
    best = result.plans[0]
    assert best.layout.num_layers == 43 and best.layout.mtp_layers == 1
    assert min(best.headroom_bytes) >= 0 and best.recompute_layer_ids
    assert 0 <= result.gap < 0.25 and result.lower_bound_ms <= best.step_ms
    one_f_one_b = search(models[:1], keep=1)  # exact, and no better than the joint search
    assert one_f_one_b.gap == 0 and one_f_one_b.plans[0].step_ms >= best.step_ms - 1e-9


def test_pruning_keeps_the_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """Branch and bound returns what plain enumeration of every split returns, on a bigger case."""
    rng = random.Random(5)
    layers = random_layers(rng, 14)
    probe = make_model(layers, math.inf, 4, 1, 8)
    capacity = 0.5 * (worst_rank_bytes(probe, True) + worst_rank_bytes(probe, False))
    model = make_model(layers, capacity, 4, 1, 8)
    pruned = search([model], keep=6)
    monkeypatch.setattr(search_module._Prepared, "bound", lambda self, k, pos, threshold: 0.0)
    exhaustive = search([model], keep=6)
    assert pruned.plans[0].recompute_layer_ids
    assert [p.step_ms for p in pruned.plans] == pytest.approx([p.step_ms for p in exhaustive.plans], abs=1e-9)


def test_level_curve_has_no_flat_piece_at_breakpoints_a_rounding_step_apart() -> None:
    # the chained level's breakpoint (chained - own) / tail = 0.3 / 0.1 lands one ulp away from the excess's 3.0
    x = (0.4 - 0.1) / 0.1
    assert x != 3.0 and abs(x - 3.0) < 1e-12
    curve = _level_curve(own=0.1, chained=0.4, tail_per_ms=0.1, m=2, excess=[(0.0, 0.0, 0.0), (3.0, 0.0, 0.5)])
    assert all(slope > 0 for _, _, slope in curve)  # the water filling divides by every slope
    assert [round(p[0], 9) for p in curve] == [0.0, 3.0]
