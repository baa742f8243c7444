"""Timing of one kernel launch: CUDA events via ``do_bench`` on a GPU, wall clock on the interpreter.

On a GPU ``triton.testing.do_bench`` warms up, flushes the L2 cache before every repetition
and times each one with CUDA events; we keep every sample and report median, p20 and p80.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass



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


def measure(fn: Callable[[], object], warmup_ms: float, rep_ms: float, on_gpu: bool) -> Timing:
    """Median/p20/p80 of ``fn`` over repetitions filling about ``rep_ms`` after ``warmup_ms``."""
    if on_gpu:
        import triton.testing

        samples = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        return _summarise([float(s) for s in samples])
    fn()  # the interpreter has nothing to warm up beyond the first call
    samples: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 100):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return _summarise(samples)

