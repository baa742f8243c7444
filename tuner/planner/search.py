"""Joint search over 1F1B pipeline splits and per-stage recompute, under a per-GPU memory limit.

Why it is exact: the simulator runs each rank's ops in a fixed order and starts every op when
its rank and its dependencies are done, so the makespan is a longest path through a DAG whose
node weights are the op times. It can only grow when a stage's backward grows. So for a fixed
split the best recompute choice is, independently per stage, the set with the least added time
that fits the stage's memory, and only the split needs searching.

Per stage the set comes from a 0/1 knapsack over that stage's layers (cost: the layer's forward
time, recomputed in backward; weight: bytes held per in-flight microbatch). Bytes are counted
in buckets of ``byte_granularity`` (1 MiB by default), each layer rounded *up*, so a returned
plan always truly fits; when every byte count is a multiple of the granularity the knapsack
is exact. Splits are then enumerated depth-first with branch and bound, see :func:`_stage_bound`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.planner.costs import LayerCost, MemoryModel, StageExtras
from tuner.planner.layout import PipelineLayout, format_layout, parse_layout
from tuner.planner.schedule import simulate

MiB = 1 << 20


class NoPlanFits(RuntimeError):
    """No split fits even with every layer recomputed; ``stage`` and ``overflow_bytes`` say how close it got."""

    def __init__(self, message: str, stage: int, overflow_bytes: float):
        super().__init__(message)
        self.stage = stage
        self.overflow_bytes = overflow_bytes


@dataclass(frozen=True)
class Plan:
    """One candidate: layout, the global layer ids to recompute, predicted step time and memory per stage."""

    layout: PipelineLayout
    recompute_layer_ids: tuple[int, ...]
    makespan_ms: float
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    stage_bytes: tuple[float, ...]
    headroom_bytes: tuple[float, ...]

    @property
    def layout_text(self) -> str:
        """The ``--pipeline-model-parallel-layout`` string."""
        return format_layout(self.layout)


class _Problem:
    """Prefix sums and memoised per-stage knapsack tables shared by the split search."""

    def __init__(self, layers: Sequence[LayerCost], extras: StageExtras, memory: MemoryModel,
                 capacity: float, pp: int, microbatches: int, granularity: int):
        self.layers, self.extras, self.memory = list(layers), extras, memory
        self.capacity, self.pp, self.m, self.gran = capacity, pp, microbatches, granularity
        self.n = len(layers)
        self.fwd = np.concatenate([[0.0], np.cumsum([l.forward_ms for l in layers])])
        self.bwd = np.concatenate([[0.0], np.cumsum([l.backward_ms for l in layers])])
        self.params = [0] + list(np.cumsum([l.param_count for l in layers], dtype=np.int64).tolist())
        self.keep_w = [math.ceil(l.activation_bytes / granularity) for l in layers]
        self.rec_w = [math.ceil(l.recompute_kept_bytes / granularity) for l in layers]
        self.total_keep = sum(self.keep_w)
        self.tables: dict[tuple[int, int, bool, bool], np.ndarray] = {}

    def flags(self, stage: int) -> tuple[bool, bool]:
        """Whether the stage is the first (embedding) and the last (MTP, head, loss)."""
        return stage == 0, stage == self.pp - 1

    def stage_params(self, a: int, b: int, stage: int) -> int:
        first, last = self.flags(stage)
        return (self.params[b] - self.params[a] + first * self.extras.embedding_params
                + last * self.extras.head_params)

    def extra_act(self, stage: int) -> int:
        first, last = self.flags(stage)
        return first * self.extras.embedding_activation_bytes + last * self.extras.head_activation_bytes

    def budget_buckets(self, a: int, b: int, stage: int) -> int:
        """Buckets of layer activation per microbatch that stage ``stage`` holding [a, b) can afford (< 0: none)."""
        k = MemoryModel.in_flight(stage, self.pp, self.m)
        free = self.capacity - self.memory.stage_bytes(self.stage_params(a, b, stage), k, self.extra_act(stage))
        if free < 0:
            return -1
        allowed = free / k / self.gran  # may be inf; no stage ever needs more than every layer kept
        return self.total_keep if allowed >= self.total_keep else math.floor(allowed)

    def base_times(self, a: int, b: int, stage: int) -> tuple[float, float]:
        """Forward and backward of the stage without recompute."""
        first, last = self.flags(stage)
        e = self.extras
        f = self.fwd[b] - self.fwd[a] + first * e.embedding_forward_ms + last * e.head_forward_ms
        bw = self.bwd[b] - self.bwd[a] + first * e.embedding_backward_ms + last * e.head_backward_ms
        return float(f), float(bw)

    def recompute_ms(self, a: int, stage: int) -> np.ndarray:
        """``out[b]``: least recompute time letting stage ``stage`` hold [a, b) (inf: nothing fits).

        One knapsack over growing prefixes a, a+1, ... reuses the table for every end ``b``:
        ``dp[u]`` is the least recompute time with exactly ``u`` buckets kept per microbatch.
        """
        first, last = self.flags(stage)
        ends = [self.n] if last else range(a, self.n)
        key = (a, MemoryModel.in_flight(stage, self.pp, self.m), first, last)
        if key in self.tables:
            return self.tables[key]
        out = np.full(self.n + 1, math.inf)
        budgets = {b: self.budget_buckets(a, b, stage) for b in ends}
        cap = min(max(budgets.values()), sum(self.keep_w[a:]))
        if cap >= 0:
            dp = np.full(cap + 1, math.inf)
            dp[0] = 0.0
            for b in range(a, self.n + 1):
                if b in budgets and budgets[b] >= 0:
                    out[b] = dp[:min(budgets[b], cap) + 1].min()
                if b == self.n:
                    break
                dp = self._add_layer(dp, b)
        self.tables[key] = out
        return out

    def _add_layer(self, dp: np.ndarray, j: int) -> np.ndarray:
        """Knapsack step for layer ``j``: keep its activations, or recompute it for its forward time."""
        new = np.full_like(dp, math.inf)
        keep, rec = self.keep_w[j], self.rec_w[j]
        if keep < len(dp):
            new[keep:] = dp[:len(dp) - keep]
        if rec < len(dp):
            np.minimum(new[rec:], dp[:len(dp) - rec] + self.layers[j].forward_ms, out=new[rec:])
        return new

    def recompute_set(self, a: int, b: int, stage: int) -> tuple[int, ...]:
        """The layers of [a, b) the knapsack recomputes (rerun with every table kept to trace back)."""
        budget = min(self.budget_buckets(a, b, stage), sum(self.keep_w[a:b]))
        tables = [np.concatenate([[0.0], np.full(budget, math.inf)])]
        for j in range(a, b):
            tables.append(self._add_layer(tables[-1], j))
        u = int(np.argmin(tables[-1]))
        chosen = []
        for j in range(b - 1, a - 1, -1):
            prev, keep = tables[j - a], self.keep_w[j]
            if keep <= u and prev[u - keep] == tables[j - a + 1][u]:
                u -= keep  # prefer keeping: recompute only where memory forces it
            else:
                chosen.append(j)
                u -= self.rec_w[j]
        return tuple(sorted(chosen))


def _stage_bound(chain_before: float, stage_time: float, microbatches: int) -> float:
    """Lower bound on the 1F1B makespan from one stage i (vpp = 1).

    Rank i's first op F(0, i) waits for F(0, j) on every j < i plus a p2p hop each, so it starts
    at >= sum_{j<i}(f_j + p2p). The rank then runs all its m forwards and m backwards one after
    another, so its last op B(m-1, i) ends >= m (f_i + b_i) later. After it, B(m-1, j) still has to
    run on every j < i in turn, each after a p2p hop: >= sum_{j<i}(b_j + p2p) more. Hence
    makespan >= sum_{j<i}(f_j + b_j + 2 p2p) + m (f_i + b_i) =: ``chain_before + m * stage_time``.
    (Stages after i are left out on purpose: with a heavy stage 0 the later stages hide under its
    busy time, so the symmetric "+ sum over all j != i" is not a valid bound.)
    """
    return chain_before + microbatches * stage_time


def plan(layers: Sequence[LayerCost], extras: StageExtras, memory: MemoryModel, capacity_bytes: float,
         pp: int, microbatches: int, p2p_ms: float, *, keep: int = 3,
         byte_granularity: int = MiB) -> list[Plan]:
    """Up to ``keep`` plans, fastest simulated 1F1B step first, that fit ``capacity_bytes`` on every stage.

    ``layers`` are the decoder layers in order followed by the MTP layer (the last entry); the
    first stage also holds the embedding (and may hold no decoder layer), the last the MTP
    layer, head and loss, and every other stage at least one layer. Ties go to less recompute.
    Raises NoPlanFits when no split fits even with every layer recomputed.
    """
    if pp < 1 or microbatches < 1 or keep < 1 or byte_granularity < 1:
        raise ValueError("need pp, microbatches, keep, byte_granularity >= 1")
    if len(layers) < 2:
        raise ValueError("need at least one decoder layer and the MTP layer")
    if len(layers) - 1 < pp - 2:
        raise ValueError(f"{len(layers)} layers cannot fill {pp} stages")
    prob = _Problem(layers, extras, memory, capacity_bytes, pp, microbatches, byte_granularity)
    n, m = prob.n, microbatches
    head_time = extras.head_forward_ms + extras.head_backward_ms
    best: list[tuple[float, float, int, tuple[int, ...]]] = []  # max-heap via negation
    counter = 0

    def threshold() -> float:
        return -best[0][0] if len(best) == keep else math.inf

    def visit(stage: int, a: int, ends: tuple[int, ...], times: list[tuple[float, float]],
              recompute: float, chain: float, bound: float) -> None:
        nonlocal counter
        last = stage == pp - 1
        if last:
            candidates = [n]
        else:
            lo = a if stage == 0 else a + 1  # the first stage may hold only the embedding
            hi = n - (pp - 1 - stage)  # leave a layer for each later stage, the MTP layer last
            remaining_work = float(prob.fwd[n] + prob.bwd[n] - prob.fwd[a] - prob.bwd[a]) + head_time
            target = prob.fwd[a] + prob.bwd[a] + remaining_work / (pp - stage)
            candidates = sorted(range(lo, hi + 1),
                                key=lambda b: abs(prob.fwd[b] + prob.bwd[b] - target))
        table = prob.recompute_ms(a, stage)
        for b in candidates:
            if not math.isfinite(table[b]):
                continue
            f, bw = prob.base_times(a, b, stage)
            bw += float(table[b])
            s = f + bw
            node_bound = max(bound, _stage_bound(chain, s, m))
            next_chain = chain + s + 2 * p2p_ms
            if not last:
                rest = float(prob.fwd[n] + prob.bwd[n] - prob.fwd[b] - prob.bwd[b]) + head_time
                node_bound = max(node_bound, _stage_bound(next_chain, rest / (pp - 1 - stage), m))
            if node_bound > threshold():
                continue
            new_times = times + [(f, bw)]
            if last:
                result = simulate(pp, 1, m, [t[0] for t in new_times], [t[1] for t in new_times], p2p_ms)
                entry = (-result.makespan, -(recompute + float(table[b])), counter, ends + (b,))
                counter += 1
                if len(best) < keep:
                    heapq.heappush(best, entry)
                elif (entry[0], entry[1]) > (best[0][0], best[0][1]):
                    heapq.heapreplace(best, entry)
            else:
                visit(stage + 1, b, ends + (b,), new_times, recompute + float(table[b]), next_chain, node_bound)

    visit(0, 0, (), [], 0.0, 0.0, 0.0)
    if not best:
        _raise_no_fit(prob)
    return [_build(prob, ends, -neg_ms, p2p_ms) for neg_ms, _, _, ends in sorted(best, reverse=True)]


def _build(prob: _Problem, ends: tuple[int, ...], makespan: float, p2p_ms: float) -> Plan:
    """Turn stage ends into a Plan, tracing back each stage's recompute set."""
    pp, starts = prob.pp, (0,) + ends[:-1]
    parts, recompute, fwd, bwd, mem = [], [], [], [], []
    for i, (a, b) in enumerate(zip(starts, ends)):
        chosen = prob.recompute_set(a, b, i)
        recompute += chosen
        decoder = min(b, prob.n - 1) - a
        parts.append(("E" if i == 0 else "") + (f"t*{decoder}" if decoder else "")
                     + ("mL" if i == pp - 1 else ""))
        f, bw = prob.base_times(a, b, i)
        fwd.append(f)
        bwd.append(bw + sum(prob.layers[j].forward_ms for j in chosen))
        act = prob.extra_act(i) + sum(prob.layers[j].recompute_kept_bytes if j in chosen
                                      else prob.layers[j].activation_bytes for j in range(a, b))
        mem.append(prob.memory.stage_bytes(prob.stage_params(a, b, i), MemoryModel.in_flight(i, pp, prob.m), act))
    layout = parse_layout("|".join(parts), prob.n - 1, pp, 1)
    return Plan(layout, tuple(recompute), makespan, tuple(fwd), tuple(bwd), tuple(mem),
                tuple(prob.capacity - x for x in mem))


def _raise_no_fit(prob: _Problem) -> None:
    """Find the split whose worst stage overflows least with every layer recomputed, and report it."""
    pp, n = prob.pp, prob.n

    def overflow(a: int, b: int, i: int) -> float:
        act = prob.extra_act(i) + sum(l.recompute_kept_bytes for l in prob.layers[a:b])
        k = MemoryModel.in_flight(i, pp, prob.m)
        return prob.memory.stage_bytes(prob.stage_params(a, b, i), k, act) - prob.capacity

    # best[(i, a)] = (worst overflow of stages i.. when stage i starts at a, that stage, its overflow)
    best: dict[tuple[int, int], tuple[float, int, float]] = {}
    for i in range(pp - 1, -1, -1):
        for a in range(n):
            if i == pp - 1:
                over = overflow(a, n, i)
                best[(i, a)] = (over, i, over)
                continue
            options = []
            for b in range(a if i == 0 else a + 1, n - (pp - 1 - i) + 1):
                over, rest = overflow(a, b, i), best[(i + 1, b)]
                options.append((over, i, over) if over >= rest[0] else rest)
            best[(i, a)] = min(options, default=(math.inf, i, math.inf))
    _, stage, over = best[(0, 0)]
    raise NoPlanFits(
        f"no layout fits {prob.capacity:.0f} bytes per GPU: at best stage {stage} still overflows by "
        f"{over:.0f} bytes ({over / MiB:.1f} MiB) with every layer recomputed; use more pipeline stages, "
        "recompute that keeps fewer bytes, or a smaller micro-batch", stage, over)
