"""The expert-parallel all-to-all of one MoE layer, timed across ``ep`` ranks: what is sent and how it is timed.

Per MoE layer and microbatch, each of the ``ep`` ranks routes its ``mbs × seq`` tokens to
``experts_per_token = k`` experts, so it **dispatches** ``rows = mbs · seq · k`` rows of
``hidden`` bf16 values, split evenly over the ``ep`` ranks (uniform routing, as the layer
profiles assume: see ``tuner.train.profile_layers``), and receives as many; the **combine** sends the
expert outputs back, the same volume. ``bytes_per_rank`` is what leaves a rank per all-to-all:
``rows · hidden · 2 · (ep - 1) / ep`` (its own share stays on the GPU).

The forward of a layer is one dispatch + one combine (``alltoall_ms``); its backward moves the
gradients along the same two paths again, so the planner prices the backward (and a recompute's
forward) with the same time (``tuner.plan.iteration``). Neither is inside the layer profiles'
``forward_ms``, which one GPU measures with no EP traffic at all.

Timing (:func:`time_rank`, run by every rank inside a joined process group, NCCL on GPUs, gloo
on the CPU): ``warmup`` untimed rounds, then ``reps`` rounds of barrier → dispatch → combine with
``torch.distributed.all_to_all_single``, each all-to-all timed by CUDA events on a GPU, by the
wall clock on the CPU. An all-to-all ends when its slowest rank is done, so :func:`summarize`
takes, per round, the slowest rank's time, and reports the median over rounds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from v4.config import ModelConfig, ModelArgumentError, expert_parallel_config

ELEMENT_BYTES = 2  # bf16


@dataclass(frozen=True)
class AlltoallShape:
    """What one rank sends per all-to-all: ``rows`` rows of ``hidden`` bf16 values over ``ep`` ranks."""

    rows: int
    hidden: int
    ep: int

    @property
    def splits(self) -> list[int]:
        """Rows sent to each rank: even, the first ``rows % ep`` ranks one more."""
        return [self.rows // self.ep + (r < self.rows % self.ep) for r in range(self.ep)]

    @property
    def bytes_per_rank(self) -> int:
        """Bytes leaving a rank per all-to-all (mean over ranks when the split is uneven)."""
        return self.rows * (self.ep - 1) * self.hidden * ELEMENT_BYTES // self.ep


def alltoall_shape(config: ModelConfig, seq: int, mbs: int, ep: int) -> AlltoallShape:
    """The all-to-all of one MoE layer of ``config``; ModelArgumentError names the argument that does not fit."""
    if ep < 2:
        raise ModelArgumentError(f"ep: an all-to-all needs at least 2 expert-parallel ranks, got {ep}")
    expert_parallel_config(config, ep)  # the same ep rule as the layer profiles it completes
    for name, value in (("seq", seq), ("mbs", mbs)):
        if value < 1:
            raise ModelArgumentError(f"{name}: must be >= 1, got {value}")
    return AlltoallShape(mbs * seq * config.experts_per_token, config.hidden, ep)


@dataclass(frozen=True)
class AlltoallCost:
    """The measured all-to-all of one MoE layer (medians of the slowest rank per round)."""

    shape: AlltoallShape
    dispatch_ms: float
    combine_ms: float
    reps: int

    @property
    def alltoall_ms(self) -> float:
        """One forward: dispatch + combine."""
        return self.dispatch_ms + self.combine_ms

    @property
    def gbps(self) -> float:
        """Bytes leaving a rank per second over dispatch and combine, in GB/s."""
        return 2 * self.shape.bytes_per_rank / (self.alltoall_ms * 1e6) if self.alltoall_ms > 0 else 0.0


def time_rank(shape: AlltoallShape, rank: int, device: str, warmup: int, reps: int) -> dict[str, list[float]]:
    """This rank's dispatch and combine times in ms, one per timed round (see the module doc).

    Must run on every rank of a process group of ``shape.ep`` ranks at once.
    """
    import torch.distributed as dist

    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    sent, received = shape.splits, [shape.splits[rank]] * shape.ep
    tokens = torch.randn(shape.rows, shape.hidden, device=dev, dtype=torch.bfloat16)
    at_experts = torch.empty(sum(received), shape.hidden, device=dev, dtype=torch.bfloat16)
    back = torch.empty_like(tokens)

    def dispatch() -> None:
        dist.all_to_all_single(at_experts, tokens, received, sent)

    def combine() -> None:
        dist.all_to_all_single(back, at_experts, sent, received)

    times: dict[str, list[float]] = {"dispatch": [], "combine": []}
    for round_ in range(warmup + reps):
        dist.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            events[0].record()
            dispatch()
            events[1].record()
            combine()
            events[2].record()
            events[2].synchronize()
            split = (events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2]))
        else:
            start = time.perf_counter()
            dispatch()
            middle = time.perf_counter()
            combine()
            split = ((middle - start) * 1e3, (time.perf_counter() - middle) * 1e3)
        if round_ >= warmup:
            times["dispatch"].append(split[0])
            times["combine"].append(split[1])
    return times


def summarize(shape: AlltoallShape, per_rank: list[dict[str, list[float]]]) -> AlltoallCost:
    """Per round the slowest rank, then the median over rounds, for dispatch and combine."""
    reps = min(len(t["dispatch"]) for t in per_rank)
    slowest = {phase: [max(t[phase][i] for t in per_rank) for i in range(reps)] for phase in ("dispatch", "combine")}
    return AlltoallCost(shape, statistics.median(slowest["dispatch"]), statistics.median(slowest["combine"]), reps)
