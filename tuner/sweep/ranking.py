"""Which of several measured configs is fastest: by device time, or by the time of an eager call.

The sweeps time a config's device work (``workers.timing``). An eager training step calls its
launches back to back, and the host prepares each call while the GPU runs earlier ones, so a
call costs the longer of its device time and its host time (argument checks, allocations, TMA
descriptors, Triton's dispatch). On the H200 a table entry chosen by device time alone ran 1.4-1.8x
slower in eager calls, host-bound (docs/findings.md, Launches and host time). Hence two ranks:

* ``device`` (the default): device time alone, what steps replayed as CUDA graphs pay;
* ``eager``: ``max(device, host)``, what back-to-back eager calls run at, eager times within
  ``HOST_TIE`` of the least decided by device time.

Device time is the default because host times measured during a sweep are noisy: the compile
workers share the host's cores, and one launch path's host time, the least of ten rounds, still
spread over 41-88 µs across the configs of one sweep (H200), wider than the 10% band
and than most differences between configs. The re-timed configs, and so every table entry, record
their host time (under ``eager`` every screened trial does too: its rank needs it), and the export
warns of host-bound entries, so a launch whose host cost depends on its config (host-built TMA
descriptors: +50 µs a call) is named even where device time picks it.

Trials without a host time (the interpreter, sweeps from before it was measured) compare by device
time. The search itself is told device times: host noise would steer it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from db import Trial

Rank = Literal["eager", "device"]
RANKS: tuple[Rank, ...] = ("eager", "device")
HOST_TIE = 0.10
DEFAULT_RANK: Rank = "device"
T = TypeVar("T")


@dataclass(frozen=True)
class CallTime:
    """A config's measured time a call: on the device, and on the host where measured."""

    device_ms: float
    host_ms: float | None = None

    def ms(self, rank: Rank) -> float:
        """The time under ``rank``."""
        if rank == "device" or self.host_ms is None:
            return self.device_ms
        return max(self.device_ms, self.host_ms)

    @property
    def host_bound(self) -> bool:
        """Whether an eager call waits on the host rather than the GPU."""
        return self.host_ms is not None and self.host_ms > self.device_ms


def trial_time(trial: Trial) -> CallTime:
    """The trial's time, from its re-timing where it has one (device and host measured beside its rivals)."""
    metrics = trial.metrics or {}
    if trial.retime_ms is not None:
        return CallTime(trial.retime_ms, metrics.get("retime_host_ms", metrics.get("host_ms")))
    return CallTime(trial.median_ms, metrics.get("host_ms"))


def screening_time(trial: Trial) -> CallTime:
    """The trial's screening time (before any re-timing)."""
    return CallTime(trial.median_ms, (trial.metrics or {}).get("host_ms"))


def entry_time(entry: Mapping[str, Any]) -> CallTime | None:
    """An exported table entry's time (None for entries that record no time)."""
    device = entry.get("retime_ms") if entry.get("retime_ms") is not None else entry.get("median_ms")
    return None if device is None else CallTime(device, entry.get("host_ms"))


def common_rank(rank: Rank, times: Sequence[CallTime]) -> Rank:
    """``rank``, or ``device`` where some of ``times`` lack a host time: an unmeasured host must not win."""
    return "device" if any(t.host_ms is None for t in times) else rank


def pick(items: Sequence[T], time: Callable[[T], CallTime], rank: Rank) -> T:
    """The fastest of ``items`` under ``rank`` (the first on equal times): the least device time among
    those whose time is within ``HOST_TIE`` of the least (with ``device``, exactly the least), under
    :func:`common_rank`."""
    times = [time(item) for item in items]
    rank = common_rank(rank, times)
    tie = 1 + HOST_TIE if rank == "eager" else 1
    best = min(t.ms(rank) for t in times)
    contenders = [i for i, t in enumerate(times) if t.ms(rank) <= best * tie]
    return items[min(contenders, key=lambda i: times[i].device_ms)]
