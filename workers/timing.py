"""Timing of one kernel launch: on a GPU with CUDA events, on the interpreter by wall clock.

``events``: ``triton.testing.do_bench`` warms up, flushes the L2 cache before every
repetition and times each one with CUDA events; we keep every sample and report median,
p20 and p80. For kernels of a few microseconds the host's launch cost can exceed the
kernel's, and then events time the host. ``cudagraph`` removes the host: it captures
(L2 flush, launch) pairs in a CUDA graph, times replays, and subtracts replays of a graph
of the flushes alone, so what remains is device time with a cold L2, as in a training step
where launches are queued ahead of the GPU.

Neither sees what the host spends on a call (argument checks, allocations, TMA descriptors,
Triton's dispatch). An eager step calls back to back, so a launch whose host time exceeds its
device time runs at its host time. ``host_ms`` measures it apart, for ``tuner.sweep.ranking``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Method = Literal["events", "cudagraph"]
FLUSH_BYTES = 256 << 20  # several times the L2 of current GPUs
GRAPH_LAUNCHES = 20
GRAPH_REPLAYS = 10
HOST_CALLS = 10  # back-to-back calls a host sample: few enough that the launch queue never fills
HOST_ROUNDS = 10


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int


def _summarise(samples: list[float]) -> Timing:
    samples = sorted(samples)
    if len(samples) == 1:
        return Timing(samples[0], samples[0], samples[0], 1)
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return Timing(statistics.median(samples), q[1], q[7], len(samples))


def _replay_ms(body: Callable[[], object]) -> list[float]:
    """Milliseconds of each replay of a graph holding ``GRAPH_LAUNCHES`` calls of ``body``."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_LAUNCHES):
            body()
    graph.replay()
    samples = []
    for _ in range(GRAPH_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def measure_graph(fn: Callable[[], object]) -> Timing:
    """Device time per call of ``fn`` with a cold L2 and no host launch cost (see module doc)."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    fn()  # compile and size the allocator outside the capture
    torch.cuda.synchronize()
    flush_only = statistics.median(_replay_ms(flush.zero_))
    with_fn = _replay_ms(lambda: (flush.zero_(), fn()))
    return _summarise([(s - flush_only) / GRAPH_LAUNCHES for s in with_fn])


def host_ms(fn: Callable[[], object], calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> float:
    """The least over ``rounds`` of the host's milliseconds a call over ``calls`` back-to-back calls of
    ``fn`` that do not wait for the GPU (it is idle at the start of each round; without one, the
    calls' whole time). The least, not the median: during a sweep the compile workers share the
    host's cores, and within one sweep the median of one launch path spread over 43-73 µs (H200)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    samples = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    sync()
    return min(samples)


def _samples(fn: Callable[[], object], warmup_ms: float, rep_ms: float, on_gpu: bool) -> list[float]:
    """Milliseconds of each repetition of ``fn`` over about ``rep_ms`` after ``warmup_ms`` (by CUDA events on a
    GPU, ``do_bench``; by wall clock on the interpreter, at least 3 and at most 100)."""
    if on_gpu:
        import triton.testing

        return [float(s) for s in triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")]
    fn()  # the interpreter has nothing to warm up beyond the first call
    samples: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 100):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def measure(fn: Callable[[], object], warmup_ms: float, rep_ms: float, on_gpu: bool,
            method: Method = "events") -> Timing:
    """Median/p20/p80 of ``fn`` over repetitions filling about ``rep_ms`` after ``warmup_ms``."""
    if on_gpu and method == "cudagraph":
        return measure_graph(fn)
    return _summarise(_samples(fn, warmup_ms, rep_ms, on_gpu))


def screen(fn: Callable[[], object], warmup_ms: float, rep_ms: float, on_gpu: bool, method: Method = "events",
           probe_ms: float = 0.0, stop_over_ms: float | None = None) -> tuple[Timing, bool]:
    """A sweep's timing of one config, and whether it stopped after its probe.

    With ``stop_over_ms`` (a multiple of the shape's best so far) and ``probe_ms`` shorter than ``rep_ms``,
    the first ``probe_ms`` of repetitions are a probe: a config whose probe median is already over
    ``stop_over_ms`` stops there, with the probe's figures (it is no rival of the best, which the re-timing
    decides among the closest); any other runs the rest of ``rep_ms``, the probe's samples counted in. Most
    of a grid's configs are far from its best, and each then costs its probe, not the whole timing.
    ``cudagraph`` timing is of a fixed count of replays: it is never cut short.
    """
    if stop_over_ms is None or not 0 < probe_ms < rep_ms or (on_gpu and method == "cudagraph"):
        return measure(fn, warmup_ms, rep_ms, on_gpu, method), False
    probe = _samples(fn, warmup_ms, probe_ms, on_gpu)
    if statistics.median(probe) > stop_over_ms:
        return _summarise(probe), True
    return _summarise(probe + _samples(fn, 0.0, rep_ms - probe_ms, on_gpu)), False
