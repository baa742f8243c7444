"""Event-by-event simulation of pipeline-parallel training schedules.

The layout/recompute planner needs the step time and the activation-memory peak
of a candidate layout with uneven stage costs, where the textbook bubble formula
is wrong.  So each rank runs its Megatron op list in order, every op waits for its
rank and for its data dependencies, and the makespan is exact for that graph.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["F", "B"]
Schedule = Literal["1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved")


@dataclass(frozen=True)
class Op:
    """One forward ("F") or backward ("B") pass of one microbatch through one stage."""

    kind: Kind
    microbatch: int
    stage: int


@dataclass(frozen=True)
class OpRecord:
    """Where and when an op ran: one bar of a Gantt chart."""

    rank: int
    stage: int
    microbatch: int
    kind: Kind
    start: float
    end: float


@dataclass(frozen=True)
class ScheduleResult:
    """Timing and memory drivers of one simulated step.

    ``peak_in_flight[r][v]`` is the most microbatches whose forward through stage
    ``v * pp + r`` was done and whose backward was not (the activations that stage
    holds); ``peak_in_flight_rank[r]`` is the same count summed over the rank's
    stages at the worst moment, which is what bounds memory under interleaving.
    """

    pp: int
    vpp: int
    microbatches: int
    schedule: str
    makespan: float
    busy: tuple[float, ...]
    bubble_fraction: float
    ops: tuple[OpRecord, ...]
    peak_in_flight: tuple[tuple[int, ...], ...]
    peak_in_flight_rank: tuple[int, ...]


class DeadlockError(RuntimeError):
    """Raised when no rank can start its next op, so the step would never finish."""


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_times(name: str, values: Sequence[float], stages: int) -> tuple[float, ...]:
    if len(values) != stages:
        raise ValueError(f"{name} needs one time per stage (pp * vpp = {stages}), got {len(values)}")
    out = tuple(float(t) for t in values)
    for s, t in enumerate(out):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"{name}[{s}] must be a finite time >= 0, got {t!r}")
    return out


def _validate(pp: int, vpp: int, microbatches: int, schedule: str) -> None:
    _check_int("pp", pp, 1)
    _check_int("vpp", vpp, 1)
    _check_int("microbatches", microbatches, 1)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule == "1f1b" and vpp != 1:
        raise ValueError(f"vpp must be 1 for the 1f1b schedule (got {vpp}); use schedule='interleaved'")
    if schedule == "interleaved":
        if vpp < 2:
            raise ValueError(f"vpp must be > 1 for the interleaved schedule (got {vpp}); use schedule='1f1b'")
        if microbatches % pp:
            raise ValueError(
                f"microbatches ({microbatches}) must be a multiple of pp ({pp}) for the interleaved "
                "schedule, as Megatron requires")


def build_ops(pp: int, vpp: int, microbatches: int, schedule: Schedule = "1f1b") -> list[list[Op]]:
    """Per-rank op lists in Megatron's order: warm-up forwards, steady 1F1B, cool-down backwards."""
    _validate(pp, vpp, microbatches, schedule)
    total = microbatches * vpp
    group = pp * vpp

    def virtual(k: int, rank: int, forward: bool) -> Op:
        # Megatron's get_model_chunk_id: pp microbatches at a time walk the chunks,
        # backward walks them in reverse.
        chunk = (k % group) // pp
        if not forward:
            chunk = vpp - 1 - chunk
        mb = (k // group) * pp + k % pp
        return Op("F" if forward else "B", mb, chunk * pp + rank)

    lists: list[list[Op]] = []
    for rank in range(pp):
        if schedule == "1f1b":
            warmup = min(pp - rank - 1, microbatches)
        else:
            warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
        ops = [virtual(k, rank, True) for k in range(warmup)]
        for i in range(total - warmup):
            ops.append(virtual(warmup + i, rank, True))
            ops.append(virtual(i, rank, False))
        ops.extend(virtual(k, rank, False) for k in range(total - warmup, total))
        lists.append(ops)
    return lists


def _deps(op: Op, pp: int, stages: int) -> list[tuple[Op, bool]]:
    """Ops that must finish before ``op``, each with whether its result crosses to another rank."""
    def cross(a: int, b: int) -> bool:
        return a % pp != b % pp

    if op.kind == "F":
        return [] if op.stage == 0 else [(Op("F", op.microbatch, op.stage - 1), cross(op.stage - 1, op.stage))]
    deps = [(Op("F", op.microbatch, op.stage), False)]
    if op.stage < stages - 1:
        deps.append((Op("B", op.microbatch, op.stage + 1), cross(op.stage + 1, op.stage)))
    return deps


class CompiledSchedule:
    """Per-rank op lists turned into one topological order, so a step can be timed in one pass.

    The order is what the event-by-event simulation visits: every op after its rank's previous
    op and after its data dependencies. Timing is then a longest path: each op starts at the
    latest of its rank's previous end and its dependencies' ends (plus ``p2p`` across ranks).
    The planner times thousands of candidate stage costs on one schedule, so the order is built
    once and :meth:`run` is a flat loop. Raises DeadlockError when the lists can never complete.
    """

    def __init__(self, op_lists: Sequence[Sequence[Op]], vpp: int):
        pp = len(op_lists)
        stages = pp * vpp
        index: dict[Op, int] = {}
        order: list[tuple[Op, int, int, tuple[tuple[int, bool], ...]]] = []
        head = [0] * pp
        waiters: dict[Op, list[int]] = defaultdict(list)  # op -> ranks blocked on it
        worklist = list(range(pp))
        while worklist:
            rank = worklist.pop()
            ops = op_lists[rank]
            while head[rank] < len(ops):
                op = ops[head[rank]]
                deps = _deps(op, pp, stages)
                missing = next((d for d, _ in deps if d not in index), None)
                if missing is not None:
                    waiters[missing].append(rank)
                    break
                prev = index[ops[head[rank] - 1]] if head[rank] else -1
                index[op] = len(order)
                order.append((op, rank, prev, tuple((index[d], cross) for d, cross in deps)))
                head[rank] += 1
                worklist.extend(waiters.pop(op, ()))
        total = sum(len(ops) for ops in op_lists)
        if len(order) != total:
            blocked = [f"rank {r}: {op_lists[r][head[r]]}" for r in range(pp) if head[r] < len(op_lists[r])]
            raise DeadlockError("pipeline schedule deadlocks; next ops that can never start: " + "; ".join(blocked))
        self.pp, self.vpp = pp, vpp
        self.ops = tuple(o[0] for o in order)
        self.rank = tuple(o[1] for o in order)
        self._prev = tuple(o[2] for o in order)
        self._deps = tuple(o[3] for o in order)
        # durations are looked up in forward + backward concatenated: F of stage s at s, B at stages + s
        self._slot = tuple(op.stage + (0 if op.kind == "F" else stages) for op in self.ops)
        self.last = tuple(index[ops[-1]] if ops else -1 for ops in op_lists)

    def run(self, forward: Sequence[float], backward: Sequence[float], p2p: float = 0.0) -> list[float]:
        """End time of every op, in :attr:`ops` order (inputs are trusted: the planner's hot path)."""
        durations = list(forward) + list(backward)
        end = [0.0] * len(self.ops)
        for i, (prev, deps, slot) in enumerate(zip(self._prev, self._deps, self._slot)):
            t = end[prev] if prev >= 0 else 0.0
            for j, cross in deps:
                x = end[j] + p2p if cross else end[j]
                if x > t:
                    t = x
            end[i] = t + durations[slot]
        return end

    def rank_ends(self, forward: Sequence[float], backward: Sequence[float], p2p: float = 0.0) -> list[float]:
        """When each rank finishes its last op."""
        end = self.run(forward, backward, p2p)
        return [end[i] if i >= 0 else 0.0 for i in self.last]


@functools.lru_cache(maxsize=64)
def megatron_schedule(pp: int, vpp: int, microbatches: int) -> CompiledSchedule:
    """Megatron's 1F1B (vpp = 1) or interleaved 1F1B (vpp > 1) order, compiled once per shape."""
    return CompiledSchedule(build_ops(pp, vpp, microbatches, schedule_name(vpp)), vpp)


def schedule_name(vpp: int) -> Schedule:
    """The Megatron schedule that runs ``vpp`` virtual stages per rank."""
    return "1f1b" if vpp == 1 else "interleaved"


def simulate_ops(op_lists: Sequence[Sequence[Op]], vpp: int, microbatches: int,
                 forward: Sequence[float], backward: Sequence[float], p2p: float = 0.0,
                 schedule: str = "custom") -> ScheduleResult:
    """Run given per-rank op lists; lets a planner try orders other than Megatron's.

    Each op starts when its rank has finished the previous op and its dependencies
    are done (plus ``p2p`` when the producer sits on another rank).  Raises
    DeadlockError when the lists can never complete.
    """
    pp = len(op_lists)
    _check_int("pp (number of op lists)", pp, 1)
    _check_int("vpp", vpp, 1)
    _check_int("microbatches", microbatches, 1)
    stages = pp * vpp
    fwd = _check_times("forward", forward, stages)
    bwd = _check_times("backward", backward, stages)
    if not math.isfinite(p2p) or p2p < 0:
        raise ValueError(f"p2p must be a finite time >= 0, got {p2p!r}")
    seen: set[Op] = set()
    for rank, ops in enumerate(op_lists):
        for op in ops:
            if not (0 <= op.stage < stages and 0 <= op.microbatch < microbatches) or op.stage % pp != rank:
                raise ValueError(f"op_lists[{rank}] holds {op}, which does not belong on rank {rank}")
            if op in seen:
                raise ValueError(f"op_lists holds {op} twice")
            seen.add(op)
    if len(seen) != 2 * stages * microbatches:
        raise ValueError(f"op_lists must hold every F and B op once: {len(seen)} of {2 * stages * microbatches}")
    return _result(CompiledSchedule(op_lists, vpp), op_lists, microbatches, fwd, bwd, p2p, schedule)


def _result(compiled: CompiledSchedule, op_lists: Sequence[Sequence[Op]], microbatches: int,
            fwd: tuple[float, ...], bwd: tuple[float, ...], p2p: float, schedule: str) -> ScheduleResult:
    """Time the compiled schedule and collect the Gantt records, bubbles and in-flight peaks."""
    pp, vpp = compiled.pp, compiled.vpp
    ends = compiled.run(fwd, bwd, p2p)
    position = {op: i for ops in op_lists for i, op in enumerate(ops)}
    records = []
    for op, rank, finish in zip(compiled.ops, compiled.rank, ends):
        start = finish - (fwd[op.stage] if op.kind == "F" else bwd[op.stage])
        records.append((start, rank, position[op], OpRecord(rank, op.stage, op.microbatch, op.kind, start, finish)))
    makespan = max(ends)
    busy = tuple(sum(fwd[op.stage] if op.kind == "F" else bwd[op.stage] for op in ops) for ops in op_lists)
    bubble = 1.0 - sum(busy) / (pp * makespan) if makespan > 0 else 0.0
    peaks, rank_peaks = _in_flight(op_lists, vpp)
    return ScheduleResult(pp, vpp, microbatches, schedule, makespan, busy, bubble,
                          tuple(r for *_, r in sorted(records, key=lambda x: x[:3])), peaks, rank_peaks)


def _in_flight(op_lists: Sequence[Sequence[Op]], vpp: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Peak activations held, counted in each rank's op order (its ops never overlap)."""
    pp = len(op_lists)
    peaks: list[tuple[int, ...]] = []
    rank_peaks: list[int] = []
    for ops in op_lists:
        live = [0] * vpp
        peak = [0] * vpp
        rank_peak = 0
        for op in ops:
            v = op.stage // pp
            live[v] += 1 if op.kind == "F" else -1
            peak[v] = max(peak[v], live[v])
            rank_peak = max(rank_peak, sum(live))
        peaks.append(tuple(peak))
        rank_peaks.append(rank_peak)
    return tuple(peaks), tuple(rank_peaks)


def simulate(pp: int, vpp: int, microbatches: int, forward: Sequence[float], backward: Sequence[float],
             p2p: float = 0.0, schedule: Schedule = "1f1b") -> ScheduleResult:
    """Simulate one training step of Megatron's 1F1B or interleaved 1F1B schedule.

    ``forward[s]``/``backward[s]`` are the times of stage ``s`` (on rank ``s % pp``);
    ``backward`` should already include any recompute the planner adds.
    """
    _check_int("pp", pp, 1)
    _check_int("vpp", vpp, 1)
    fwd = _check_times("forward", forward, pp * vpp)
    bwd = _check_times("backward", backward, pp * vpp)
    if not math.isfinite(p2p) or p2p < 0:
        raise ValueError(f"p2p must be a finite time >= 0, got {p2p!r}")
    op_lists = build_ops(pp, vpp, microbatches, schedule)  # validates the schedule against vpp
    return _result(megatron_schedule(pp, vpp, microbatches), op_lists, microbatches, fwd, bwd, p2p, schedule)


@functools.lru_cache(maxsize=64)
def in_flight_peaks(pp: int, vpp: int, microbatches: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per rank, the maximal vectors of microbatches held per virtual stage over Megatron's op order.

    A rank's activation bytes at any moment are ``sum_v live[v] * bytes[v]``; with unequal
    virtual stages the worst moment depends on the bytes, so the memory model takes the max
    over these vectors (the others are dominated: no smaller in every entry). Under 1F1B there
    is one vector, ``(min(pp - rank, microbatches),)``; interleaved, the entries of each sum to
    at most Megatron's in-flight count (see ``MemoryModel.in_flight``).
    """
    out = []
    for ops in build_ops(pp, vpp, microbatches, schedule_name(vpp)):
        live = [0] * vpp
        seen = set()
        for op in ops:
            live[op.stage // pp] += 1 if op.kind == "F" else -1
            seen.add(tuple(live))
        out.append(tuple(sorted(a for a in seen
                                if not any(b != a and all(x >= y for x, y in zip(b, a)) for b in seen))))
    return tuple(out)
