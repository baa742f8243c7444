"""Pipeline schedule simulator: closed forms where they hold, a brute-force DAG longest path otherwise."""

from __future__ import annotations

import functools
import random

import pytest

from tuner.plan.schedule import DeadlockError, Op, megatron_schedule, simulate, simulate_ops


def megatron_order(pp: int, vpp: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per-rank (kind, microbatch, stage) lists written out independently of the module."""
    orders = []
    for r in range(pp):
        fwd: list[tuple[str, int, int]] = []
        bwd: list[tuple[str, int, int]] = []
        for g in range(0, m, pp):  # groups of pp microbatches walk the chunks, backward in reverse
            mbs = range(g, min(g + pp, m))
            for v in range(vpp):
                fwd += [("F", mb, v * pp + r) for mb in mbs]
                bwd += [("B", mb, (vpp - 1 - v) * pp + r) for mb in mbs]
        if vpp == 1:
            warm = min(pp - r - 1, m)
        else:
            warm = min(2 * (pp - r - 1) + (vpp - 1) * pp, m * vpp)
        order = fwd[:warm]
        for i in range(len(fwd) - warm):
            order += [fwd[warm + i], bwd[i]]
        order += bwd[len(fwd) - warm:]
        orders.append(order)
    return orders


def longest_path(pp: int, vpp: int, m: int, f: list[float], b: list[float], p2p: float) -> float:
    """Finish time of the last op over the DAG of data edges plus same-rank order edges."""
    n = pp * vpp
    preds: dict[tuple[str, int, int], list[tuple[tuple[str, int, int], float]]] = {}
    for order in megatron_order(pp, vpp, m):
        for i, (kind, mb, s) in enumerate(order):
            p = [(order[i - 1], 0.0)] if i else []
            if kind == "F" and s > 0:
                p.append((("F", mb, s - 1), p2p if pp > 1 else 0.0))
            if kind == "B":
                p.append((("F", mb, s), 0.0))
                if s < n - 1:
                    p.append((("B", mb, s + 1), p2p if pp > 1 else 0.0))
            preds[(kind, mb, s)] = p

    @functools.cache
    def finish(node: tuple[str, int, int]) -> float:
        kind, _, s = node
        ready = max((finish(q) + lag for q, lag in preds[node]), default=0.0)
        return ready + (f[s] if kind == "F" else b[s])

    return max(finish(node) for node in preds)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
def test_1f1b_uniform_makespan(pp: int, m: int) -> None:
    r = simulate(pp, 1, m, [1.0] * pp, [2.0] * pp)
    assert r.makespan == pytest.approx((m + pp - 1) * 3.0)
    assert r.busy == pytest.approx([3.0 * m] * pp)
    assert r.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("vpp", [2, 3, 4])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_interleaved_uniform_matches_megatron_bubble(pp: int, vpp: int, groups: int) -> None:
    # Each rank holds vpp chunks of cost f/vpp, b/vpp: work m*(f+b), bubble (pp-1)*(f+b)/vpp.
    f, b, m = 1.0, 2.0, groups * pp
    r = simulate(pp, vpp, m, [f / vpp] * (pp * vpp), [b / vpp] * (pp * vpp), schedule="interleaved")
    assert r.makespan == pytest.approx((pp - 1) * (f + b) / vpp + m * (f + b))
    # interleaving must beat plain 1F1B whenever there is a bubble to shrink
    if pp > 1:
        assert r.makespan < simulate(pp, 1, m, [f] * pp, [b] * pp).makespan


@pytest.mark.parametrize("seed", range(40))
def test_heterogeneous_matches_longest_path(seed: int) -> None:
    rng = random.Random(seed)
    pp = rng.randint(2, 4)
    if seed % 2:
        vpp, m, schedule = 1, rng.randint(1, 6), "1f1b"
    else:
        vpp = rng.randint(2, 3)
        m = pp * rng.randint(1, 6 // pp)
        schedule = "interleaved"
    n = pp * vpp
    f = [rng.uniform(0.1, 3.0) for _ in range(n)]
    b = [rng.uniform(0.1, 5.0) for _ in range(n)]
    p2p = rng.choice([0.0, rng.uniform(0.0, 1.0)])
    r = simulate(pp, vpp, m, f, b, p2p=p2p, schedule=schedule)  # type: ignore[arg-type]
    assert r.makespan == pytest.approx(longest_path(pp, vpp, m, f, b, p2p))
    # every rank ran exactly Megatron's order
    for rank, order in enumerate(megatron_order(pp, vpp, m)):
        ran = [(o.kind, o.microbatch, o.stage) for o in r.ops if o.rank == rank]
        assert ran == order


def test_gantt_records_are_consistent() -> None:
    f, b = [1.0, 0.5, 2.0, 1.5, 0.7, 1.1], [2.0, 1.0, 3.5, 2.5, 1.6, 2.2]
    r = simulate(3, 2, 6, f, b, p2p=0.2, schedule="interleaved")
    assert len(r.ops) == 2 * 6 * 6
    for rank in range(3):
        bars = [o for o in r.ops if o.rank == rank]
        assert all(o.stage % 3 == rank for o in bars)
        assert all(x.end <= y.start + 1e-12 for x, y in zip(bars, bars[1:]))
        assert sum(o.end - o.start for o in bars) == pytest.approx(r.busy[rank])
        assert all(o.end - o.start == pytest.approx((f if o.kind == "F" else b)[o.stage]) for o in bars)
    assert max(o.end for o in r.ops) == r.makespan
    assert r.bubble_fraction == pytest.approx(1 - sum(r.busy) / (3 * r.makespan))


@pytest.mark.parametrize("pp", [1, 2, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7])
def test_1f1b_in_flight_peak(pp: int, m: int) -> None:
    r = simulate(pp, 1, m, [1.0] * pp, [2.0] * pp)
    assert r.peak_in_flight == tuple((min(pp - rank, m),) for rank in range(pp))
    assert r.peak_in_flight_rank == tuple(min(pp - rank, m) for rank in range(pp))


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 2), (2, 2, 8), (4, 2, 8), (4, 3, 4), (3, 2, 9)])
def test_interleaved_in_flight_peak(pp: int, vpp: int, m: int) -> None:
    r = simulate(pp, vpp, m, [1.0] * (pp * vpp), [2.0] * (pp * vpp), schedule="interleaved")
    for rank in range(pp):
        warm = min(2 * (pp - rank - 1) + (vpp - 1) * pp, m * vpp)
        assert r.peak_in_flight_rank[rank] == min(warm + 1, m * vpp)
        assert sum(r.peak_in_flight[rank]) >= r.peak_in_flight_rank[rank]
        assert all(1 <= p <= m for p in r.peak_in_flight[rank])


def test_1f1b_heterogeneous_by_hand() -> None:
    # rank 0: F0 0-1, F1 1-2, B0 6-8 (waits for B0 on rank 1), B1 11-13
    # rank 1: F0 1-3, B0 3-6, F1 6-8, B1 8-11
    r = simulate(2, 1, 2, [1.0, 2.0], [2.0, 3.0])
    bars = {(o.kind, o.microbatch, o.stage): (o.start, o.end) for o in r.ops}
    assert bars == {("F", 0, 0): (0, 1), ("F", 1, 0): (1, 2), ("B", 0, 0): (6, 8), ("B", 1, 0): (11, 13),
                    ("F", 0, 1): (1, 3), ("B", 0, 1): (3, 6), ("F", 1, 1): (6, 8), ("B", 1, 1): (8, 11)}
    assert r.makespan == 13


def test_interleaved_heterogeneous_by_hand() -> None:
    # pp=2, vpp=2, m=2, p2p 0.5; stage s on rank s % 2. Rank 0 warms up with all four forwards:
    # F(0,0) 0-1, F(1,0) 1-2, F(0,2) 4-7 (after F(0,1) + 0.5), F(1,2) 7-10, B(0,2) 13-15, B(1,2) 18-20,
    # B(0,0) 21-23, B(1,0) 24-26. Rank 1 warms up with two:
    # F(0,1) 1.5-3.5, F(1,1) 3.5-5.5, F(0,3) 7.5-8.5, B(0,3) 8.5-12.5, F(1,3) 12.5-13.5, B(1,3) 13.5-17.5,
    # B(0,1) 17.5-20.5, B(1,1) 20.5-23.5.
    r = simulate(2, 2, 2, [1.0, 2.0, 3.0, 1.0], [2.0, 3.0, 2.0, 4.0], p2p=0.5, schedule="interleaved")
    bars = {(o.kind, o.microbatch, o.stage): (o.start, o.end) for o in r.ops}
    assert bars == {
        ("F", 0, 0): (0, 1), ("F", 1, 0): (1, 2), ("F", 0, 2): (4, 7), ("F", 1, 2): (7, 10),
        ("B", 0, 2): (13, 15), ("B", 1, 2): (18, 20), ("B", 0, 0): (21, 23), ("B", 1, 0): (24, 26),
        ("F", 0, 1): (1.5, 3.5), ("F", 1, 1): (3.5, 5.5), ("F", 0, 3): (7.5, 8.5), ("B", 0, 3): (8.5, 12.5),
        ("F", 1, 3): (12.5, 13.5), ("B", 1, 3): (13.5, 17.5), ("B", 0, 1): (17.5, 20.5), ("B", 1, 1): (20.5, 23.5)}
    assert r.makespan == 26 and r.busy == (16, 20)
    assert r.bubble_fraction == pytest.approx(1 - 36 / 52)


def test_compiled_schedule_is_shared_and_agrees() -> None:
    """The planner's fast path times Megatron's orders exactly as the simulator does, built once per shape."""
    rng = random.Random(3)
    for pp, vpp, m in [(3, 1, 5), (2, 3, 4), (4, 2, 8)]:
        compiled = megatron_schedule(pp, vpp, m)
        assert megatron_schedule(pp, vpp, m) is compiled
        f = [rng.uniform(0.1, 3) for _ in range(pp * vpp)]
        b = [rng.uniform(0.1, 5) for _ in range(pp * vpp)]
        r = simulate(pp, vpp, m, f, b, 0.3, "1f1b" if vpp == 1 else "interleaved")
        ends = [max(o.end for o in r.ops if o.rank == rank) for rank in range(pp)]
        assert compiled.rank_ends(f, b, 0.3) == pytest.approx(ends)


def test_p2p_adds_delay_across_ranks() -> None:
    # F0(0-1) -> +0.5 -> F1(1.5-2.5), B1(2.5-3.5) -> +0.5 -> B0(4-5)
    assert simulate(2, 1, 1, [1.0, 1.0], [1.0, 1.0], p2p=0.5).makespan == pytest.approx(5.0)
    base = simulate(4, 1, 8, [1.0] * 4, [2.0] * 4).makespan
    slow = simulate(4, 1, 8, [1.0] * 4, [2.0] * 4, p2p=0.3).makespan
    assert slow >= base + 2 * 3 * 0.3 - 1e-9  # the first forward and last backward cross 3 links each


def test_p2p_free_on_one_rank() -> None:
    # pp=1: every chunk shares the rank, so no transfer is ever paid
    a = simulate(1, 3, 2, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0], p2p=0.0, schedule="interleaved")
    c = simulate(1, 3, 2, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0], p2p=10.0, schedule="interleaved")
    assert a.makespan == c.makespan == pytest.approx(2 * 9.0)


def test_deadlock_raises() -> None:
    # rank 0 wants B(0, 0) before F(0, 0), which that backward itself needs
    lists = [[Op("B", 0, 0), Op("F", 0, 0)], [Op("F", 0, 1), Op("B", 0, 1)]]
    with pytest.raises(DeadlockError, match="rank 0"):
        simulate_ops(lists, 1, 1, [1.0, 1.0], [1.0, 1.0])


def test_cross_rank_deadlock_raises() -> None:
    # rank 1 waits for mb 1 first while rank 0 needs B(0, 1) from rank 1 before it forwards mb 1
    lists = [[Op("F", 0, 0), Op("B", 0, 0), Op("F", 1, 0), Op("B", 1, 0)],
             [Op("F", 1, 1), Op("F", 0, 1), Op("B", 0, 1), Op("B", 1, 1)]]
    with pytest.raises(DeadlockError, match="rank 1"):
        simulate_ops(lists, 1, 2, [1.0, 1.0], [1.0, 1.0])


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(pp=4, vpp=2, microbatches=6, schedule="interleaved"), "microbatches"),
    (dict(pp=2, vpp=1, microbatches=4, forward=[1.0, -1.0]), "forward"),
    (dict(pp=2, vpp=1, microbatches=4, backward=[1.0, float("nan")]), "backward"),
    (dict(pp=2, vpp=1, microbatches=4, forward=[1.0, 1.0, 1.0]), "forward"),
    (dict(pp=2, vpp=1, microbatches=4, backward=[1.0]), "backward"),
    (dict(pp=2, vpp=1, microbatches=4, p2p=-0.1), "p2p"),
    (dict(pp=0, vpp=1, microbatches=4), "pp"),
    (dict(pp=2, vpp=1, microbatches=0), "microbatches"),
    (dict(pp=2, vpp=2, microbatches=4, schedule="1f1b"), "vpp"),
    (dict(pp=2, vpp=1, microbatches=4, schedule="interleaved"), "vpp"),
    (dict(pp=2, vpp=1, microbatches=4, schedule="gpipe"), "schedule"),
])
def test_bad_input_names_argument(kwargs: dict, name: str) -> None:
    n = max(kwargs["pp"], 1) * kwargs["vpp"]
    args = dict(forward=[1.0] * n, backward=[2.0] * n) | kwargs
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        simulate(**args)


def test_custom_op_lists_must_cover_every_op() -> None:
    with pytest.raises(ValueError, match="op_lists"):
        simulate_ops([[Op("F", 0, 0), Op("B", 0, 0)], [Op("F", 0, 1)]], 1, 1, [1.0, 1.0], [1.0, 1.0])
