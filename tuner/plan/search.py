"""Joint search over pipeline splits and per-layer recompute, under a per-GPU memory limit.

A plan cuts the layers (decoder layers, then the MTP layer) into ``pp * vpp`` contiguous
chunks, chunk ``c`` on rank ``c % pp`` as its virtual stage ``c // pp``, and picks the layers
to recompute. :func:`search` returns the fastest plans over one or several
:class:`IterationModel` (one per (pp, vpp)) and a proven lower bound on the step of every plan.

Recompute, rank by rank. The simulator runs each rank's ops in a fixed order and starts every
op when its rank and its dependencies are done, so the step is a longest path through a DAG
whose node weights are the op times: it only grows when a stage's backward grows, and a
rank's recompute changes only that rank's backward times and memory. Each rank recomputes the
set with the least *total* added time that fits its memory (the time it pays ``m`` times in
the steady state), ties to less added time on earlier virtual stages. With one virtual stage
per rank (1F1B) that is exactly optimal, so the search is exact. With several, another set of
equal or larger total could shorten the warm-up chain: the search then also bounds every split
from below with the per-stage least times and the least total, and reports the smallest such
bound it could not rule out as :attr:`SearchResult.lower_bound_ms` (``gap`` = how far from
optimal the best plan can be; 0 when the per-stage least times fit together).

Per virtual stage the recompute choices form a Pareto frontier of (bytes kept per microbatch,
added ms), built by a knapsack over the stage's layers that keeps only frontier points. A
rank's choice is a small branch and bound over its stages' frontiers under every in-flight
vector of the schedule. Bytes are counted exactly (``byte_granularity`` 1, the default): the
frontier, the feasibility test and every bound see the bytes the memory model prices. (With a
coarser granularity each layer is rounded *up*: a returned plan still fits, but a plan that fits
by less than the rounding is missed and the bound may be above the true optimum, so the search
no longer proves optimality; only tests of the rounding use it.)

The recompute workspace (``MemoryModel.workspace_bytes``: the largest ``activation_bytes -
recompute_kept_bytes`` over the layers a rank recomputes) is a max, not a sum, so it does not
fit the knapsack. The rank's choice is therefore solved once per workspace level ``w`` (0 and
each distinct re-materialised size of the rank's layers): only layers re-materialising at most
``w`` may be recomputed and ``w`` is charged against the rank's memory. A choice solved at ``w``
truly holds at most ``w`` of workspace, so it fits the model; the best choice re-materialises
exactly some level, where it is feasible, so the least total over the levels is the exact
optimum, and the least per level of each proven bound is a proven bound. The bounds that look
ahead (``_future``, ``room_for_rest``, the split bound) leave the workspace out: it only adds
memory, so they stay lower bounds, if looser ones.

Two bounds cut whole subtrees before any recompute is chosen: each rank's *wall* (``_room_ms``:
with every layer recomputed, the static bytes and the least activation bytes per ms of new work
cap how much layer work it can still take, so a model whose weights cannot fit is pruned at its
root), and under 1F1B the *chain* (``_chained_bound``): stage r's last backward waits for the
work of every stage before it, so the stages not placed yet count in the bound too.

Splits are enumerated depth-first, chunk by chunk, each chunk's end tried nearest the even
share of the remaining work first, with branch and bound on :meth:`_Prepared.bound`.
``max_nodes`` caps the partial splits expanded per model; what is left unexplored then only lowers
``lower_bound_ms``, so the result still says how far from optimal its best plan can be.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.plan.costs import LayerCost, MemoryModel
from tuner.plan.iteration import IterationModel, Plan
from v4.layout import parse_layout
from tuner.plan.schedule import CompiledSchedule, in_flight_peaks, megatron_schedule

MiB = 1 << 20
GiB = 1 << 30
_SOLVE_STEPS = 64  # branch steps of one rank's recompute choice


class NoPlanFits(RuntimeError):
    """No split fits even with every layer recomputed; says where it got closest and what would help."""

    def __init__(self, *, pp: int, vpp: int, rank: int, overflow_bytes: float, static_bytes: float,
                 activation_bytes: float, capacity_bytes: float):
        if static_bytes > capacity_bytes:
            advice = ("weights, grads and optimizer state alone do not fit: use more nodes (more data-parallel "
                      "ranks shard the optimizer state) or more pipeline stages (fewer layers per GPU)")
        else:
            advice = ("use a smaller micro-batch (activations scale with --mbs), more pipeline stages or nodes, "
                      "or recompute that keeps fewer bytes per layer")
        super().__init__(
            f"no plan fits {capacity_bytes / GiB:.1f} GiB per GPU: at best (pp={pp}, vpp={vpp}) stage {rank} "
            f"still overflows by {overflow_bytes / GiB:.2f} GiB ({overflow_bytes / MiB:.1f} MiB) with every layer "
            f"recomputed ({static_bytes / GiB:.1f} GiB weights+grads+optimizer, {activation_bytes / GiB:.1f} GiB "
            f"activations); {advice}")
        self.pp, self.vpp, self.rank = pp, vpp, rank
        self.overflow_bytes, self.static_bytes, self.activation_bytes = overflow_bytes, static_bytes, activation_bytes
        self.capacity_bytes = capacity_bytes


@dataclass(frozen=True)
class SearchResult:
    """The best plans, fastest first, and a proven lower bound on every plan of the searched space."""

    plans: tuple[Plan, ...]
    lower_bound_ms: float
    leaves: int

    @property
    def gap(self) -> float:
        """How much faster than the best plan any plan could still be, as a fraction (0: proven optimal)."""
        best = self.plans[0].step_ms
        return max(0.0, 1 - self.lower_bound_ms / best) if best > 0 else 0.0


@dataclass(frozen=True)
class _Choice:
    """A rank's recompute choice: the workspace level it was solved at, the frontier index and the
    added ms per virtual stage."""

    level: float
    indices: tuple[int, ...]
    times: tuple[float, ...]


class _Frontiers:
    """Per chunk ``[a, b)``: Pareto lists of (kept buckets, added ms), memoised by ``a`` with ``b`` growing.

    ``K`` ascends and ``D`` strictly descends; ``S`` traces each point back (``parent * 2 + recomputed``).
    """

    def __init__(self, layers: Sequence[LayerCost], granularity: int, limit: float = math.inf):
        """Only layers re-materialising at most ``limit`` bytes when recomputed may be recomputed."""
        self.keep = [math.ceil(l.activation_bytes / granularity) for l in layers]
        self.rec = [math.ceil(l.recompute_kept_bytes / granularity) for l in layers]
        self.cost = [l.recompute_cost_ms for l in layers]
        self.allowed = [l.freed_bytes <= limit for l in layers]
        self._lists: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def get(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        lists = self._lists.setdefault(a, [(np.zeros(1, np.int64), np.zeros(1), np.zeros(1, np.int64))])
        while len(lists) <= b - a:
            j = a + len(lists) - 1
            K, D, _ = lists[-1]
            src = np.arange(len(K)) * 2
            if not self.allowed[j]:  # kept in full: the same frontier shifted
                lists.append((K + self.keep[j], D, src))
                continue
            K2 = np.concatenate([K + self.keep[j], K + self.rec[j]])
            D2 = np.concatenate([D, D + self.cost[j]])
            S2 = np.concatenate([src, src + 1])
            order = np.lexsort((S2 & 1, D2, K2))  # by kept, then time, then keeping over recomputing
            K2, D2, S2 = K2[order], D2[order], S2[order]
            mask = np.ones(len(K2), bool)
            mask[1:] = D2[1:] < np.minimum.accumulate(D2)[:-1]
            lists.append((K2[mask], D2[mask], S2[mask]))
        K, D, _ = lists[b - a]
        return K, D

    def recomputed(self, a: int, b: int, index: int) -> list[int]:
        """The layers point ``index`` of chunk ``[a, b)`` recomputes."""
        self.get(a, b)
        lists, out = self._lists[a], []
        for k in range(b - a, 0, -1):
            s = int(lists[k][2][index])
            if s & 1:
                out.append(a + k - 1)
            index = s >> 1
        return sorted(out)


def _best_within(K: np.ndarray, cap: float) -> int:
    """Index of the frontier point keeping the most buckets within ``cap`` (least added time), -1 if none."""
    if cap >= K[-1]:
        return len(K) - 1
    return int(np.searchsorted(K, math.floor(cap + 1e-9), side="right")) - 1


class _Prepared:
    """One IterationModel's prefix sums, frontiers and the mutable state of the depth-first search."""

    def __init__(self, model: IterationModel, granularity: int):
        self.model, self.gran = model, granularity
        layers, e = model.layers, model.extras
        self.n, self.pp, self.vpp, self.C, self.m = len(layers), model.pp, model.vpp, model.stages, model.microbatches
        self.F = np.concatenate([[0.0], np.cumsum([l.forward_ms for l in layers])]).tolist()
        self.B = np.concatenate([[0.0], np.cumsum([l.backward_ms for l in layers])]).tolist()
        self.P = [0] + np.cumsum([l.param_count for l in layers], dtype=np.int64).tolist()
        self.X = [0] + np.cumsum([l.expert_param_count for l in layers], dtype=np.int64).tolist()
        self.freed = [l.freed_bytes for l in layers]
        self._frontiers = {math.inf: _Frontiers(layers, granularity)}
        C = self.C
        self.extra_f = [(c == 0) * e.embedding_forward_ms + (c == C - 1) * e.head_forward_ms + model.busy_ms(c)
                        for c in range(C)]
        self.extra_b = [(c == 0) * e.embedding_backward_ms + (c == C - 1) * e.head_backward_ms + model.busy_ms(c)
                        for c in range(C)]
        self.extra_act = [(c == 0) * e.embedding_activation_bytes + (c == C - 1) * e.head_activation_bytes
                          for c in range(C)]
        self.extra_params = [(c == 0) * e.embedding_params + (c == C - 1) * e.head_params for c in range(C)]
        self.peaks = in_flight_peaks(self.pp, self.vpp, self.m)
        mtp = layers[-1]
        min_layer = min((l.forward_ms + l.backward_ms for l in layers[:-1]), default=0.0)
        # floor[c]: least layer work chunk c can get (chunk 0 may hold only the embedding, the last holds MTP)
        floor = [0.0 if c == 0 else min_layer for c in range(C)]
        floor[-1] = mtp.forward_ms + mtp.backward_ms
        # heaviest in-flight vector per rank (the one with the most microbatches) for the memory bounds
        self.heavy = [max(vecs, key=sum) for vecs in self.peaks]
        # per first unplaced chunk k and rank r, over r's unplaced chunks: layer-work floor, known extra work
        # (embedding, head, transfers), its activation bytes (weighted by the heavy vector), its params
        def rest(values: Callable[[int], float]) -> list[list[float]]:
            return [[sum(values(c) for c in range(k, C) if c % self.pp == r) for r in range(self.pp)]
                    for k in range(C + 1)]

        self.rest_floor = rest(lambda c: floor[c])
        self.rest_fixed = rest(lambda c: self.extra_f[c] + self.extra_b[c])
        self.rest_fixed_act = rest(lambda c: self.heavy[c % self.pp][c // self.pp] * self.extra_act[c])
        self.rest_params_r = rest(lambda c: self.extra_params[c])
        self.open = [[any(c % self.pp == r for c in range(k, C)) for r in range(self.pp)] for k in range(C + 1)]
        # for the bound on recompute that layers still to place will force (see _future): per rank the
        # in-flight vector with the most microbatches, bytes per ms of work, params per ms of work, and
        # the most bytes one ms of recompute can free
        self.act = [0] + np.cumsum([l.activation_bytes for l in layers], dtype=np.int64).tolist()
        self.kept = [0] + np.cumsum([l.recompute_kept_bytes for l in layers], dtype=np.int64).tolist()
        worked = [l for l in layers if l.forward_ms + l.backward_ms > 0]
        mem = model.memory

        def per_ms(value: Callable[[LayerCost], float]) -> float:
            return min((value(l) / (l.forward_ms + l.backward_ms) for l in worked), default=0.0)

        self.bytes_per_ms = per_ms(lambda l: l.activation_bytes)
        self.kept_per_ms = per_ms(lambda l: l.recompute_kept_bytes)
        self.static_raw_per_ms = per_ms(lambda l: mem.static_bytes(l.param_count, l.expert_param_count))
        self.static_per_ms = self.static_raw_per_ms / mem.activation_factor
        self.tail_per_ms = per_ms(lambda l: model.tail_ms(l.param_count, l.expert_param_count))
        self.rest_params = [sum(self.extra_params[c] for c in range(k, C)) for k in range(C + 1)]
        self.freed_per_ms = max((math.inf if l.recompute_cost_ms == 0 else l.freed_bytes / l.recompute_cost_ms
                                 for l in layers if l.freed_bytes > 0), default=0.0)
        # search state: chunk ranges and times, per-stage least recompute (dlb), per-rank totals
        self.a, self.b = [0] * C, [0] * C
        self.f, self.bw, self.dlb = [0.0] * C, [0.0] * C, [0.0] * C
        self.work, self.params, self.experts = [0.0] * self.pp, [0] * self.pp, [0] * self.pp
        self.total, self.full, self.freeable = [0.0] * self.pp, [0.0] * self.pp, [0.0] * self.pp
        self.held = [0.0] * self.pp  # least activation bytes the placed stages hold (all recomputed), scaled
        self.picked: list[_Choice] = [_Choice(math.inf, (), ())] * self.pp
        self.exact = [True] * self.pp
        self._solved: dict[tuple, tuple[float, tuple[int, ...], tuple[int, ...], float] | None] = {}
        self._futures: dict[tuple, list[tuple[float, float, float]]] = {}

    @functools.cached_property
    def schedule(self) -> CompiledSchedule:
        """The compiled op order, built on the first simulated split: a model pruned at its root never needs it."""
        return megatron_schedule(self.pp, self.vpp, self.m)

    # -- memory and recompute ---------------------------------------------------------------
    def _avail(self, r: int, more_params: float = 0.0) -> float:
        """Unscaled activation bytes rank ``r`` may hold at its peak, given the parameters placed on it."""
        mem: MemoryModel = self.model.memory
        free = (self.model.capacity_bytes - mem.static_bytes(self.params[r] + more_params, self.experts[r])
                - mem.fixed_bytes)
        return free / mem.activation_factor

    def frontiers(self, limit: float = math.inf) -> _Frontiers:
        """The frontiers where only layers re-materialising at most ``limit`` bytes may be recomputed."""
        if limit >= max(self.freed):
            limit = math.inf
        if limit not in self._frontiers:
            self._frontiers[limit] = _Frontiers(self.model.layers, self.gran, limit)
        return self._frontiers[limit]

    def workspace_levels(self, chunks: Sequence[int]) -> list[float]:
        """The workspace levels a rank holding ``chunks`` is solved at (see the module doc); ``inf`` alone
        (no limit, nothing charged) when the memory model leaves the workspace out."""
        if not self.model.memory.recompute_workspace:
            return [math.inf]
        return sorted({0} | {self.freed[j] for c in chunks for j in range(self.a[c], self.b[c]) if self.freed[j] > 0})

    def recompute(self, r: int, count: int) -> tuple[float, _Choice, tuple[float, ...], float] | None:
        """Least total recompute of rank ``r``'s first ``count`` virtual stages that fits; None if none does.

        Returns (a proven lower bound on that total, the best choice found, the per-stage least
        added times, the least scaled activation bytes, workspace included). Stages not placed
        yet count as holding nothing, so for ``count < vpp`` these are lower bounds. Per
        workspace level (module doc) the choice is a branch and bound over the stages' frontiers
        from a greedy start; past ``_SOLVE_STEPS`` it keeps the best found and proves only the
        per-stage bound.
        """
        chunks = range(r, r + count * self.pp, self.pp)
        key = (r, tuple((self.a[c], self.b[c]) for c in chunks))
        if key not in self._solved:
            self._solved[key] = self._recompute(r, chunks)
        return self._solved[key]

    def _recompute(self, r: int, chunks: range) -> tuple[float, _Choice, tuple[float, ...], float] | None:
        proven, best, lower, held = math.inf, None, None, math.inf
        for level in self.workspace_levels(chunks):
            solved = self._recompute_within(r, chunks, level)
            if solved is None:
                continue
            bound, choice, least, level_held = solved
            proven, held = min(proven, bound), min(held, level_held)
            lower = least if lower is None else tuple(map(min, lower, least))
            if best is None or (sum(choice.times), choice.times) < (sum(best.times), best.times):
                best = choice
        if best is None:
            return None
        return proven, best, lower, held

    def _recompute_within(self, r: int, chunks: range,
                          level: float) -> tuple[float, _Choice, tuple[float, ...], float] | None:
        """:meth:`recompute` at one workspace level (``inf``: no limit, no workspace charged)."""
        count, gran = len(chunks), self.gran
        frontiers = self.frontiers(level)
        fronts = [frontiers.get(self.a[c], self.b[c]) for c in chunks]
        extra = [self.extra_act[c] for c in chunks]
        vecs = [vec[:count] for vec in self.peaks[r]]
        workspace = 0.0 if math.isinf(level) else level
        avail = self._avail(r) - workspace
        low = [x + gran * int(K[0]) for x, (K, _) in zip(extra, fronts)]
        lows = [sum(n * x for n, x in zip(vec, low)) for vec in vecs]
        held = max(lows)
        if held > avail:
            return None
        held = (held + workspace) * self.model.memory.activation_factor
        lower = []
        for v, (K, _) in enumerate(fronts):
            cap = math.inf
            for vec, total_low in zip(vecs, lows):
                if vec[v]:
                    cap = min(cap, (avail - total_low + vec[v] * (low[v] - extra[v])) / (gran * vec[v]))
            lower.append(_best_within(K, cap))
        lower_t = tuple(lower)
        floor = [float(D[i]) for (_, D), i in zip(fronts, lower)]
        over = [sum(n * (x + gran * int(K[i])) for n, x, (K, _), i in zip(vec, extra, fronts, lower)) - avail
                for vec in vecs]
        if max(over) <= 0:
            return sum(floor), _Choice(level, lower_t, tuple(floor)), tuple(floor), held
        # a feasible start: from the per-stage least times, keep recomputing more where a ms frees the most
        idx = list(lower)
        while max(over) > 0:  # terminates: with every stage at its least bytes the rank fits (checked above)
            vec = vecs[max(range(len(vecs)), key=over.__getitem__)]
            v = min((v for v in range(count) if idx[v] > 0 and vec[v]), key=lambda v: (
                (fronts[v][1][idx[v] - 1] - fronts[v][1][idx[v]])
                / (vec[v] * (fronts[v][0][idx[v]] - fronts[v][0][idx[v] - 1]))))
            K = fronts[v][0]
            freed = gran * int(K[idx[v]] - K[idx[v] - 1])
            over = [o - n[v] * freed for o, n in zip(over, vecs)]
            idx[v] -= 1
        start = tuple(float(D[i]) for (_, D), i in zip(fronts, idx))
        best: list = [sum(start), tuple(idx), start]
        later = [[sum(vec[w] * low[w] for w in range(v + 1, count)) for vec in vecs] for v in range(count)]
        rest_floor = [sum(floor[v + 1:]) for v in range(count)]
        steps = [_SOLVE_STEPS]

        def walk(v: int, spent: list[float], total: float, chosen: tuple[int, ...], times: tuple[float, ...]) -> None:
            K, D = fronts[v]
            if v == count - 1:
                cap = math.inf
                for vec, u in zip(vecs, spent):
                    if vec[v]:
                        cap = min(cap, (avail - u - vec[v] * extra[v]) / (gran * vec[v]))
                i = _best_within(K, cap)
                if i >= 0 and (total + D[i], times + (float(D[i]),)) < (best[0], best[2]):
                    best[:] = [total + float(D[i]), chosen + (i,), times + (float(D[i]),)]
                return
            for i in range(lower[v], -1, -1):
                steps[0] -= 1
                if steps[0] < 0 or total + D[i] + rest_floor[v] > best[0]:
                    break  # out of steps, or D grows as i falls
                x = extra[v] + gran * int(K[i])
                new = [u + vec[v] * x for vec, u in zip(vecs, spent)]
                if all(u + rest <= avail for u, rest in zip(new, later[v])):
                    walk(v + 1, new, total + float(D[i]), chosen + (i,), times + (float(D[i]),))

        walk(0, [0.0] * len(vecs), 0.0, (), ())
        proven = best[0] if steps[0] >= 0 else sum(floor)  # out of steps: only the per-stage bound is proven
        return proven, _Choice(level, best[1], best[2]), tuple(floor), held

    def room_for_rest(self, k: int, pos: int) -> bool:
        """Whether the weights still to place (static bytes, the same on any rank) fit the open ranks' room."""
        mem = self.model.memory
        room = sum(max(0.0, self.model.capacity_bytes - mem.fixed_bytes - self.held[r]
                       - mem.static_bytes(self.params[r], self.experts[r]))
                   for r in range(self.pp) if self.open[k][r])
        need = mem.static_bytes(self.P[self.n] - self.P[pos] + self.rest_params[k], self.X[self.n] - self.X[pos])
        return need <= room

    # -- time -------------------------------------------------------------------------------
    def _room_ms(self, r: int, k: int) -> float:
        """The most layer work (ms) rank ``r`` can still take with every layer recomputed: a wall in its level
        curve (``-inf``: even its placed stages and unplaced extras overflow).

        Its heaviest in-flight vector L must fit: the static bytes of its parameters and those of its
        unplaced embedding / head, the placed stages' least bytes (all recomputed, weighted by L), the
        unplaced stages' extras (L-weighted) and, per ms of new work, at least ``static_raw_per_ms``
        plus ``kept_per_ms`` times the smallest L entry of an unplaced stage (the fewest microbatches
        any new layer can be held for), activations scaled by the fragmentation factor. Each term is
        a least value, so the room is at least the true one: the wall never cuts off a completion.
        """
        mem = self.model.memory
        heavy = self.heavy[r]
        unplaced = [heavy[v] for v in range(self.vpp) if r + v * self.pp >= k]
        if not unplaced:
            return 0.0
        free = (self.model.capacity_bytes - mem.fixed_bytes
                - mem.static_bytes(self.params[r] + self.rest_params_r[k][r], self.experts[r])
                - mem.activation_factor * (self.full[r] - self.freeable[r] + self.rest_fixed_act[k][r]))
        per_ms = self.static_raw_per_ms + mem.activation_factor * self.kept_per_ms * min(unplaced)
        if free < 0:
            return -math.inf
        return math.inf if per_ms <= 0 else free / per_ms

    def _future(self, r: int, k: int) -> list[tuple[float, float, float]]:
        """Rank ``r``'s least extra recompute ``e(x)`` if it takes ``x`` ms more layer work: convex pieces
        ``(x_i, e_i, slope_i)`` from ``x_0 = 0``.

        The rank's heaviest in-flight vector L must fit what its memory allows (``avail``). With
        its placed stages held in full it weighs ``full`` (sum of L[v] times their bytes; the
        embedding / head it will get count too). New work placed in stage u adds at least
        ``L[u] * bytes_per_ms`` per ms, and ``static_per_ms`` of room for its parameters, so
        ``E_u(x) = full - avail + (L[u] bytes_per_ms + static_per_ms) x`` must be freed. A ms of
        recompute frees at most ``freed_per_ms`` bytes of one stage, worth L[v] times that: the
        placed stages offer ``freeable`` at best ``L_p = max L[placed]``, new work its own bytes
        at ``L[u]``; the cheapest way takes the faster first. Splitting new work over several
        stages costs at least the cheapest single one, so the recompute is at least ``min_u
        cost_u(x)``; ``e`` is the lower convex envelope of what that exceeds the placed stages'
        own least total (``total``, already in the rank's work), sampled at every breakpoint
        and zero crossing so it stays below.
        """
        key = (r, k, self.full[r], self.freeable[r], self.total[r], self.params[r], self.experts[r])
        if key not in self._futures:  # the other ranks' state repeats while the search moves one rank's chunk
            self._futures[key] = self._future_uncached(r, k)
        return self._futures[key]

    def _future_uncached(self, r: int, k: int) -> list[tuple[float, float, float]]:
        heavy = self.heavy[r]
        placed = [heavy[v] for v in range(self.vpp) if r + v * self.pp < k]
        unplaced = sorted({heavy[v] for v in range(self.vpp) if r + v * self.pp >= k})
        phi, total = self.freed_per_ms, self.total[r]
        if phi == 0 or math.isinf(phi) or not unplaced:
            return []
        y0 = self.full[r] + self.rest_fixed_act[k][r] - self._avail(r, self.rest_params_r[k][r])
        if not math.isfinite(y0):  # unlimited memory: nothing ever needs recomputing
            return []
        lp, cap = max(placed, default=0), self.freeable[r]
        options = []  # per u: (growth of bytes per ms, [(excess bytes where the rate changes, ms per byte after)])
        for u in unplaced:
            if u == 0:
                continue
            grow = u * self.bytes_per_ms + self.static_per_ms
            rates = [(0.0, 1 / (lp * phi)), (cap, 1 / (u * phi))] if lp > u and cap > 0 else [(0.0, 1 / (u * phi))]
            options.append((grow, rates))
        if not options or all(g == 0 for g, _ in options):
            return []

        def cost(option: tuple[float, list[tuple[float, float]]], x: float) -> float:
            grow, rates = option
            excess = y0 + grow * x
            out = 0.0
            for i, (at, per) in enumerate(rates):
                upto = rates[i + 1][0] if i + 1 < len(rates) else math.inf
                out += max(0.0, min(excess, upto) - at) * per
            return out

        xs = {0.0}
        for grow, rates in options:
            if grow > 0:
                xs |= {(at - y0) / grow for at, _ in rates}
                for i, (at, per) in enumerate(rates):  # where this option's cost reaches total
                    before = sum((rates[j + 1][0] - rates[j][0]) * rates[j][1] for j in range(i))
                    if per > 0 and before <= total:
                        xs.add((at + (total - before) / per - y0) / grow)
        xs = sorted(x for x in xs if x >= 0)
        far = xs[-1] + 1e6
        points = [(x, max(0.0, min(cost(o, x) for o in options) - total)) for x in xs + [far]]
        hull: list[tuple[float, float]] = []
        for point in points:  # lower convex hull, left to right
            while len(hull) >= 2 and ((hull[-1][1] - hull[-2][1]) * (point[0] - hull[-2][0])
                                      >= (point[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0])):
                hull.pop()
            hull.append(point)
        return [(x, e, (hull[i + 1][1] - e) / (hull[i + 1][0] - x)) for i, (x, e) in enumerate(hull[:-1])]

    def bound(self, k: int, pos: int, threshold: float) -> float:
        """Lower bound on the step of every completion of chunks ``0..k-1`` (chunk ``k`` starts at layer ``pos``).

        For each rank r: its first op waits for the first microbatch's forward through stages
        0..r-1 (r transfers), then it runs ``m * W_r`` of work (W_r: its stages' forward +
        backward + least total recompute), and after its last op, B(m-1) of stage r, that
        microbatch's backward still crosses stages r-1..0 to rank 0. So ``step >= fchain_r +
        m W_r + tail_r`` and ``step >= fbchain_r + m W_r + tail_0``, with unplaced stages at
        zero, backward at the per-stage least recompute and tails at the parameters known so
        far. Each rank's unplaced stages bring known extras (transfers, embedding, head). The
        layer work still to place goes to the open ranks, each taking at least its floor per
        unplaced stage; ``x`` ms of it costs the rank ``x + e(x)`` per microbatch
        (:meth:`_future`) and at least ``tail_per_ms * x`` more tail. The least common level
        all ranks can stay under is found exactly (water filling over convex piecewise-linear
        level curves).
        """
        pp, m, p2p = self.pp, self.m, self.model.p2p_ms
        tail = self.model.tail_ms
        floors, opened, fixed, fixed_params = self.rest_floor[k], self.open[k], self.rest_fixed[k], self.rest_params_r[k]
        tail0 = tail(self.params[0] + fixed_params[0], self.experts[0])
        fchain = fbchain = 0.0
        top = 0.0
        curves = []
        ranks = []  # per open rank, for the 1F1B chain through the unplaced stages (_chained_bound)
        for r in range(pp):
            work = m * (self.work[r] + fixed[r])
            own = fchain + tail(self.params[r] + fixed_params[r], self.experts[r]) + work
            chained = fbchain + tail0 + work
            if r < k:
                fchain += self.f[r] + p2p
                fbchain += self.f[r] + self.bw[r] + self.dlb[r] + 2 * p2p
            else:
                fchain += p2p
                fbchain += 2 * p2p
            if not opened[r]:
                top = max(top, own, chained)
                continue
            room = self._room_ms(r, k)
            if room < floors[r]:  # not even the least work its unplaced stages need fits
                return math.inf
            future = self._future(r, k)
            curve = _level_curve(own, chained, self.tail_per_ms, m, future)
            top = max(top, _on_curve(curve, floors[r]))
            curves.append((curve, room))
            ranks.append((chained, curve, future, room, fixed[r]))
        if top > threshold or not curves:
            return top
        events = []  # (level, change of d(layer work placed)/d(level) there)
        for curve, room in curves:
            rate = 0.0
            for x, level, slope in curve:
                if x >= room:
                    break
                events.append((level, 1 / slope - rate))
                rate = 1 / slope
            if math.isfinite(room):  # the wall: past it the rank takes no more work at any level
                events.append((_on_curve(curve, room), -rate))
        need = self.F[self.n] + self.B[self.n] - self.F[pos] - self.B[pos]
        events.sort()
        placed = rate = 0.0
        level = events[0][0]
        for at, change in events:
            if rate > 0 and placed + rate * (at - level) >= need:
                break
            placed += rate * (at - level)
            level, rate = at, max(0.0, rate + change)
        if rate <= 1e-12 and placed < need * (1 - 1e-9):  # the open ranks' rooms cannot hold the work left
            return math.inf
        filled = max(top, level + (need - placed) / rate) if rate > 1e-12 else max(top, level)
        if self.vpp > 1 or filled > threshold:
            return filled
        return _chained_bound(ranks, m, need, filled, threshold)

    def step(self, least: bool = False) -> float:
        """Simulated step of the placed split with each rank's chosen recompute (or per-stage least times)."""
        bwd = list(self.bw)
        for c in range(self.C):
            bwd[c] += self.dlb[c] if least else self.picked[c % self.pp].times[c // self.pp]
        ends = self.schedule.rank_ends(self.f, bwd, self.model.p2p_ms)
        return max(end + self.model.tail_ms(self.params[r], self.experts[r]) for r, end in enumerate(ends))

    def layout_text(self) -> str:
        parts = []
        for c in range(self.C):
            decoder = min(self.b[c], self.n - 1) - self.a[c]
            parts.append(("E" if c == 0 else "") + (f"t*{decoder}" if decoder else "")
                         + ("mL" if c == self.C - 1 else ""))
        return "|".join(parts)


class _Search:
    """Shared top-k heap, pruning threshold and lower-bound bookkeeping across the models searched."""

    def __init__(self, keep: int, max_nodes: int | None, tolerance: float):
        self.keep, self.max_nodes, self.tolerance = keep, max_nodes, tolerance
        self.best: list[tuple[float, float, int, tuple]] = []  # max-heap of (-step, -recompute ms, n, payload)
        self.counter = 0
        self.leaves = 0
        self.nodes = 0  # partial splits expanded (not pruned) in the model being searched
        self.unresolved = math.inf  # least lower bound over what was not searched to the end

    @property
    def exhausted(self) -> bool:
        return self.max_nodes is not None and self.nodes >= self.max_nodes

    def threshold(self) -> float:
        return -self.best[0][0] if len(self.best) == self.keep else math.inf

    def offer(self, step: float, recompute_ms: float, payload: tuple) -> None:
        entry = (-step, -recompute_ms, self.counter, payload)
        self.counter += 1
        if len(self.best) < self.keep:
            heapq.heappush(self.best, entry)
        elif (entry[0], entry[1]) > (self.best[0][0], self.best[0][1]):
            heapq.heapreplace(self.best, entry)

    def visit(self, prep: _Prepared, c: int, a: int) -> None:
        n, C, pp = prep.n, prep.C, prep.pp
        r, v = c % pp, c // pp
        if c == C - 1:
            candidates = [n]
        else:
            hi = n - (C - 1 - c)  # every later chunk needs a layer, the last one the MTP layer
            lo = a if c == 0 else a + 1  # the first chunk may hold only the embedding
            done = prep.F[a] + prep.B[a]
            target = done + (prep.F[n] + prep.B[n] - done) / (C - c)
            candidates = sorted(range(lo, hi + 1), key=lambda b: abs(prep.F[b] + prep.B[b] - target))
        saved = (prep.work[r], prep.params[r], prep.experts[r], prep.total[r], prep.full[r], prep.picked[r],
                 prep.exact[r], prep.freeable[r], prep.held[r])
        saved_dlb = prep.dlb[r:c + 1:pp]
        heavy = prep.heavy[r][v]
        for b in candidates:
            prep.a[c], prep.b[c] = a, b
            prep.f[c] = prep.F[b] - prep.F[a] + prep.extra_f[c]
            prep.bw[c] = prep.B[b] - prep.B[a] + prep.extra_b[c]
            prep.params[r] = saved[1] + prep.P[b] - prep.P[a] + prep.extra_params[c]
            prep.experts[r] = saved[2] + prep.X[b] - prep.X[a]
            solved = prep.recompute(r, v + 1)
            if solved is None:
                continue
            total, picked, lower, prep.held[r] = solved
            if not prep.room_for_rest(c + 1, b):
                continue
            prep.total[r], prep.picked[r], prep.exact[r] = total, picked, picked.times == lower
            prep.full[r] = saved[4] + heavy * (prep.extra_act[c] + prep.act[b] - prep.act[a])
            prep.freeable[r] = saved[7] + heavy * (prep.act[b] - prep.act[a] - prep.kept[b] + prep.kept[a])
            prep.work[r] = _rank_work(prep, r, v + 1) + total
            for w, least in enumerate(lower):
                prep.dlb[r + w * pp] = least
            threshold = self.threshold()
            bound = prep.bound(c + 1, b, threshold)
            if bound > threshold:
                continue
            self.nodes += 1
            if self.exhausted or (self.tolerance and bound >= threshold * (1 - self.tolerance)):
                self.unresolved = min(self.unresolved, bound)
            elif c == C - 1:
                self.leaf(prep, bound)
            else:
                self.visit(prep, c + 1, b)
        (prep.work[r], prep.params[r], prep.experts[r], prep.total[r], prep.full[r], prep.picked[r],
         prep.exact[r], prep.freeable[r], prep.held[r]) = saved
        prep.dlb[r:c + 1:pp] = saved_dlb

    def leaf(self, prep: _Prepared, bound: float) -> None:
        """Offer a full split with every rank's least-total recompute; note its lower bound if not exact."""
        self.leaves += 1
        step = prep.step()
        recompute = sum(sum(choice.times) for choice in prep.picked)
        self.offer(step, recompute, (prep, tuple(prep.a), tuple(prep.b), tuple(prep.picked)))
        if not all(prep.exact):
            self.unresolved = min(self.unresolved, max(bound, prep.step(least=True)))


def _inverse(pieces: Sequence[tuple[float, float, float]], y: float) -> float:
    """The largest ``x`` where an increasing convex piecewise-linear ``(x_i, value_i, slope_i)`` stays <= ``y``
    (-1 when even its start is above)."""
    if y < pieces[0][1]:
        return -1.0
    x, value, slope = next(p for p in reversed(pieces) if p[1] <= y)
    return x + (y - value) / slope if slope > 0 else math.inf


def _chained_bound(ranks: Sequence[tuple[float, list, list, float, float]], m: int, need: float, low: float,
                   threshold: float) -> float:
    """The 1F1B bound with the open ranks chained: at least ``low`` (the water filling's level).

    Under 1F1B rank ``r``'s last op, B(m-1) of stage r, comes after microbatch 0's forward and
    microbatch m-1's backward through every stage before it, so ``step >= sum_{s<r} W_s + m W_r
    + tail_0`` with ``W_s`` the whole work of stage s. The water filling prices the stages not
    placed yet at zero in that sum; here each open rank ``s`` adds what it takes, its extras plus
    ``x_s`` (its recompute left out: a relaxation). At a level T the open ranks, in order, take the
    most work each can (its level curve, its chain term, its memory wall); taking less on an
    earlier rank frees at most 1/m of it for each later one, so this greedy places the most work
    any split can at T, and the least T that places all the work left is a lower bound. Found by
    bisection, keeping the lower end; above ``threshold`` only that it is above is established.
    """

    def placeable(level: float) -> float:
        total = prefix = 0.0
        for chained, curve, future, room, fixed in ranks:
            budget = (level - chained - prefix) / m  # x + e(x) must stay within it
            excess = [(x, x + e, 1 + slope) for x, e, slope in future] or [(0.0, 0.0, 1.0)]
            x = min(room, _inverse(curve, level), _inverse(excess, budget))
            if x < 0:
                return -1.0
            total += x
            prefix += fixed + x
        return total

    enough = need * (1 - 1e-12)
    if math.isfinite(threshold):
        if placeable(threshold) < enough:
            return math.nextafter(threshold, math.inf)  # the node is pruned: above is all that matters
        high = threshold
    else:
        high = max(low, 1e-9) * 2
        for _ in range(64):
            if placeable(high) >= enough:
                break
            high *= 2
        else:
            return math.inf
    for _ in range(24):
        middle = (low + high) / 2
        if placeable(middle) >= enough:
            high = middle
        else:
            low = middle
    return low


def _level_curve(own: float, chained: float, tail_per_ms: float, m: int,
                 excess: Sequence[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """``T(x) = max(own + tail_per_ms x, chained) + m (x + e(x))`` as convex pieces ``(x_i, T_i, slope_i)`` from 0."""
    xs = {0.0} | {x for x, _, _ in excess}
    if tail_per_ms > 0 and chained > own:
        xs.add((chained - own) / tail_per_ms)
    xs = sorted(xs)
    # breakpoints an ulp apart would make a flat piece (slope 0) that the water filling divides by
    xs = [x for i, x in enumerate(xs) if i == 0 or x - xs[i - 1] > 1e-9 * max(1.0, abs(x))]

    def level(x: float) -> float:
        return max(own + tail_per_ms * x, chained) + m * (x + _excess_at(excess, x))

    points = [(x, level(x)) for x in xs + [xs[-1] + 1.0]]
    return [(x, t, (points[i + 1][1] - t) / (points[i + 1][0] - x)) for i, (x, t) in enumerate(points[:-1])]


def _on_curve(curve: Sequence[tuple[float, float, float]], x: float) -> float:
    out = curve[0][1]
    for xi, t, slope in curve:
        if xi <= x:
            out = t + slope * (x - xi)
    return out


def _excess_at(pieces: Sequence[tuple[float, float, float]], x: float) -> float:
    """The piecewise-linear excess of :meth:`_Prepared._future` at ``x``."""
    out = 0.0
    for xi, ei, slope in pieces:
        if xi <= x:
            out = ei + slope * (x - xi)
    return out


def _rank_work(prep: _Prepared, r: int, count: int) -> float:
    """Forward + backward (without recompute) of rank ``r``'s first ``count`` placed virtual stages."""
    return sum(prep.f[c] + prep.bw[c] for c in range(r, r + count * prep.pp, prep.pp))


def _build_plan(prep: _Prepared, starts: tuple[int, ...], ends: tuple[int, ...],
                picked: tuple[_Choice, ...]) -> Plan:
    prep.a, prep.b = list(starts), list(ends)
    recompute = []
    for c in range(prep.C):
        choice = picked[c % prep.pp]
        recompute += prep.frontiers(choice.level).recomputed(starts[c], ends[c], choice.indices[c // prep.pp])
    layout = parse_layout(prep.layout_text(), prep.n - 1, prep.pp, 1)
    model = prep.model
    return Plan(layout, tuple(sorted(recompute)), model, model.evaluate(layout, recompute))


def search(models: Sequence[IterationModel], *, keep: int = 5, byte_granularity: int = 1,
           tolerance: float = 0.0, max_nodes: int | None = None) -> SearchResult:
    """The ``keep`` fastest plans over ``models`` (each one (pp, vpp)) that fit every rank's memory.

    Ties go to less recompute. ``tolerance`` > 0 also prunes what cannot beat the ``keep``-th
    best by more than that fraction (the result's ``gap`` stays within it); ``max_nodes``
    caps the partial splits expanded (not pruned) per model. Raises NoPlanFits, with the
    closest miss, when nothing fits.
    """
    if not models:
        raise ValueError("need at least one model to search")
    if keep < 1 or byte_granularity < 1 or (max_nodes is not None and max_nodes < 1):
        raise ValueError("need keep, byte_granularity, max_nodes >= 1")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    run = _Search(keep, max_nodes, tolerance)
    prepared = [_Prepared(m, byte_granularity) for m in models]
    roots = sorted(((p.bound(0, 0, math.inf), i) for i, p in enumerate(prepared)))
    for root, i in roots:
        threshold = run.threshold()
        if root > threshold:
            continue
        if run.tolerance and root >= threshold * (1 - run.tolerance):
            run.unresolved = min(run.unresolved, root)
            continue
        run.nodes = 0
        run.visit(prepared[i], 0, 0)
    if not run.best:
        raise _closest_miss(prepared)
    plans = tuple(_build_plan(*payload) for *_, payload in sorted(run.best, key=lambda e: (-e[0], -e[1], e[2])))
    return SearchResult(plans, min(plans[0].step_ms, run.unresolved), run.leaves)


def _closest_miss(prepared: Sequence[_Prepared]) -> NoPlanFits:
    """The split whose fullest rank overflows least with every layer recomputed, over all models.

    Exact for 1F1B models (a min-max dynamic program over splits); an interleaved model is
    represented by its even split.
    """
    best: NoPlanFits | None = None
    for prep in prepared:
        if prep.vpp == 1:
            ends = _min_max_split(prep, lambda a, b, r: _overflow(prep, r, [(r, a, b)])[0])
        else:
            per, extra = divmod(prep.n, prep.C)
            ends = tuple(itertools.accumulate(per + (c >= prep.C - extra) for c in range(prep.C)))
        chunks = [(c, a, b) for c, (a, b) in enumerate(zip((0,) + ends[:-1], ends))]
        per_rank = [[ch for ch in chunks if ch[0] % prep.pp == r] for r in range(prep.pp)]
        worst = max(range(prep.pp), key=lambda r: _overflow(prep, r, per_rank[r])[0])
        over, static, act = _overflow(prep, worst, per_rank[worst])
        if best is None or over < best.overflow_bytes:
            best = NoPlanFits(pp=prep.pp, vpp=prep.vpp, rank=worst, overflow_bytes=over, static_bytes=static,
                              activation_bytes=act, capacity_bytes=prep.model.capacity_bytes)
    return best


def _overflow(prep: _Prepared, rank: int, chunks: Sequence[tuple[int, int, int]]) -> tuple[float, float, float]:
    """(bytes over capacity, static bytes, activation bytes) of ``rank`` holding ``(chunk, a, b)``s, all recomputed."""
    model, mem = prep.model, prep.model.memory
    params = sum(prep.P[b] - prep.P[a] + prep.extra_params[c] for c, a, b in chunks)
    experts = sum(prep.X[b] - prep.X[a] for _, a, b in chunks)
    kept = [0.0] * prep.vpp
    for c, a, b in chunks:
        kept[c // prep.pp] = prep.extra_act[c] + sum(l.recompute_kept_bytes for l in model.layers[a:b])
    static = mem.static_bytes(params, experts)
    act = mem.activation_bytes(prep.peaks[rank], kept,
                               mem.workspace_bytes(l for _, a, b in chunks for l in model.layers[a:b]))
    return static + act + mem.fixed_bytes - model.capacity_bytes, static, act


def _min_max_split(prep: _Prepared, overflow: Callable[[int, int, int], float]) -> tuple[int, ...]:
    """Stage ends minimising the worst stage's ``overflow(a, b, stage)`` over 1F1B splits."""
    pp, n = prep.pp, prep.n
    best: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
    for i in range(pp - 1, -1, -1):
        for a in range(n):
            if i == pp - 1:
                best[(i, a)] = (overflow(a, n, i), (n,))
                continue
            options = []
            for b in range(a if i == 0 else a + 1, n - (pp - 1 - i) + 1):
                rest = best[(i + 1, b)]
                options.append((max(overflow(a, b, i), rest[0]), (b,) + rest[1]))
            best[(i, a)] = min(options, default=(math.inf, ()))
    return best[(0, 0)][1]
