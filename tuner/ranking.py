"""What a measured config's time is, when configs are ranked: device time, or the time of an eager call.

The sweeps time a config's device work (``workers.timing``). An eager training step calls its
launches back to back, and the host prepares each call while the GPU runs earlier ones, so a
call costs the longer of its device time and its host time (argument checks, allocations, TMA
descriptors, Triton's dispatch). On the H200 a table entry chosen by device time alone ran 1.4-1.8x
slower in eager calls, host-bound (bench/2026-12-02f, 2026-12-03e). Hence two ranks:

* ``eager`` (the default): ``max(device, host)``, what back-to-back eager calls run at;
* ``device``: device time alone, for steps replayed as CUDA graphs, where the host is not paid.

Trials without a host time (the interpreter, sweeps from before it was measured) rank by device time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from db import Trial

Rank = Literal["eager", "device"]
RANKS: tuple[Rank, ...] = ("eager", "device")


def call_ms(device_ms: float, host_ms: float | None, rank: Rank) -> float:
    """A call's time under ``rank``."""
    if rank == "device" or host_ms is None:
        return device_ms
    return max(device_ms, host_ms)


def trial_host_ms(trial: Trial) -> float | None:
    """The trial's host time: the re-timing's where it was re-timed (measured beside its rivals), else
    the screening's."""
    metrics = trial.metrics or {}
    return metrics.get("retime_host_ms", metrics.get("host_ms"))


def trial_ms(trial: Trial, rank: Rank) -> float:
    """The trial's time under ``rank``, from its re-timing where it has one."""
    device = trial.retime_ms if trial.retime_ms is not None else trial.median_ms
    return call_ms(device, trial_host_ms(trial), rank)


def entry_ms(entry: Mapping[str, Any], rank: Rank) -> float | None:
    """An exported table entry's time under ``rank`` (None for entries that record no time)."""
    device = entry.get("retime_ms") if entry.get("retime_ms") is not None else entry.get("median_ms")
    return None if device is None else call_ms(device, entry.get("host_ms"), rank)


def host_bound(trial: Trial) -> bool:
    """Whether an eager call of the trial's config waits on the host rather than the GPU."""
    host = trial_host_ms(trial)
    return host is not None and trial_ms(trial, "eager") > trial_ms(trial, "device")
