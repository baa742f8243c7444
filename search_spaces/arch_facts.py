"""Per-arch hardware facts that search-space constraints are written against.

Values are the per-block limits a Triton kernel can use: shared memory (opt-in maximum
per block), warp/wavefront size, the register ceiling per thread, the register file of an SM (or
CU), which caps a thread's registers below that ceiling once a block has more than 256 threads
(CUDA; HIP: 512 per lane, 4 waves a SIMD at 16 warps), and ``tma``: whether
Triton's tensor descriptors load through the tensor-memory accelerator (Hopper and later; the
interpreter emulates them).
"""

from __future__ import annotations

from typing import Any

_CUDA = {"backend": "cuda", "warp_size": 32, "max_regs_per_thread": 255, "regs_per_sm": 65_536}
_HIP = {"backend": "hip", "warp_size": 64, "max_regs_per_thread": 512, "regs_per_sm": 131_072}

ARCH_FACTS: dict[str, dict[str, Any]] = {
    "sm_80": {**_CUDA, "smem_bytes": 166_912, "tma": False},
    "sm_89": {**_CUDA, "smem_bytes": 101_376, "tma": False},
    "sm_90": {**_CUDA, "smem_bytes": 232_448, "tma": True},
    "sm_100": {**_CUDA, "smem_bytes": 232_448, "tma": True},
    "gfx942": {**_HIP, "smem_bytes": 65_536, "tma": False},
    "gfx950": {**_HIP, "smem_bytes": 163_840, "tma": False},
    # The CPU interpreter has no hardware limits; constraints see generous values.
    "interp": {"backend": "interp", "smem_bytes": 1 << 30, "warp_size": 32, "max_regs_per_thread": 1 << 20,
               "regs_per_sm": 1 << 40, "tma": True},
}


class UnknownArchError(KeyError):
    """An arch name this project has no facts for."""


def arch_facts(arch: str) -> dict[str, Any]:
    """Facts of ``arch``; a clear error listing the known archs otherwise."""
    try:
        return ARCH_FACTS[arch]
    except KeyError:
        raise UnknownArchError(f"unknown arch {arch!r}; known: {sorted(ARCH_FACTS)}") from None
