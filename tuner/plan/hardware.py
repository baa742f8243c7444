"""The GPU kinds the planner knows: the name profiles are stored under, memory, and the kernel arch.

``memory_bytes`` is the marketed capacity (141 GB = 141e9 bytes for an H200); the driver reports
a little more on some parts, and the calibration's ``reserved_bytes`` covers what the runtime
takes. A plan on the GPU's own profiles uses the memory the profiler measured instead, when it did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GB = 10**9


@dataclass(frozen=True)
class GpuKind:
    """``name`` as the CLI takes it, ``device_name`` as ``torch.cuda.get_device_name`` reports it."""

    name: str
    device_name: str
    memory_bytes: int
    arch: str


GPUS: dict[str, GpuKind] = {g.name: g for g in (
    GpuKind("h100", "NVIDIA H100 80GB HBM3", 80 * GB, "sm_90"),
    GpuKind("h200", "NVIDIA H200", 141 * GB, "sm_90"),
    GpuKind("b200", "NVIDIA B200", 180 * GB, "sm_100"),
    GpuKind("mi300x", "AMD Instinct MI300X", 192 * GB, "gfx942"),
    GpuKind("mi325x", "AMD Instinct MI325X", 256 * GB, "gfx942"),
    GpuKind("mi355x", "AMD Instinct MI355X", 288 * GB, "gfx950"),
    # the CPU proxy runs (gloo ranks, ``tuner plan validate --device cpu``); profiles store it as "cpu"
    GpuKind("cpu", "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "cpu"),
)}


class UnknownGpu(ValueError):
    """A GPU kind not in :data:`GPUS`."""


def gpu_kind(name: str) -> GpuKind:
    """The GPU kind called ``name`` (case-insensitive)."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UnknownGpu(f"unknown GPU kind {name!r}; known: {', '.join(GPUS)}") from None
