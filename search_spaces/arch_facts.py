"""Per-arch hardware facts that search-space constraints are written against.

Values are the per-block limits a Triton kernel can use: shared memory (opt-in maximum
per block), warp/wavefront size, the register ceiling per thread, and ``tma``: whether
Triton's tensor descriptors load through the tensor-memory accelerator (Hopper and later; the
interpreter emulates them); ``wgmma``: whether Gluon's warpgroup MMA compiles there (sm_90 only;
the interpreter cannot run Gluon); ``warp_specialize``: whether Triton warp-specializes a loop of
TMA loads asked to (``tl.range(..., warp_specialize=True)``; checked by offline compiles, the
interpreter runs the loop as written); ``ignored_knob_values``: knob values the arch's compiler
overrides, which the spaces therefore leave out there (Triton 3.6 compiles ``kpack`` 2 as 1 for gfx950,
with a deprecation warning: offline compiles).
"""

from __future__ import annotations

from typing import Any

ARCH_FACTS: dict[str, dict[str, Any]] = {
    "sm_80": {"backend": "cuda", "smem_bytes": 166_912, "warp_size": 32,
              "max_regs_per_thread": 255, "tma": False, "wgmma": False,
              "warp_specialize": False},
    "sm_89": {"backend": "cuda", "smem_bytes": 101_376, "warp_size": 32,
              "max_regs_per_thread": 255, "tma": False, "wgmma": False,
              "warp_specialize": False},
    "sm_90": {"backend": "cuda", "smem_bytes": 232_448, "warp_size": 32,
              "max_regs_per_thread": 255, "tma": True, "wgmma": True,
              "warp_specialize": True},
    "sm_100": {"backend": "cuda", "smem_bytes": 232_448, "warp_size": 32,
               "max_regs_per_thread": 255, "tma": True, "wgmma": False,
               "warp_specialize": True},
    "gfx942": {"backend": "hip", "smem_bytes": 65_536, "warp_size": 64,
               "max_regs_per_thread": 512, "tma": False, "wgmma": False,
               "warp_specialize": False},
    "gfx950": {"backend": "hip", "smem_bytes": 163_840, "warp_size": 64,
               "max_regs_per_thread": 512, "tma": False, "wgmma": False,
               "warp_specialize": False, "ignored_knob_values": {"kpack": (2,)}},
    # The CPU interpreter has no hardware limits; constraints see generous values.
    "interp": {"backend": "interp", "smem_bytes": 1 << 30, "warp_size": 32,
               "max_regs_per_thread": 1 << 20, "tma": True, "wgmma": False,
               "warp_specialize": True},
}


class UnknownArchError(KeyError):
    """An arch name this project has no facts for."""


def arch_facts(arch: str) -> dict[str, Any]:
    """Facts of ``arch``; a clear error listing the known archs otherwise."""
    try:
        return ARCH_FACTS[arch]
    except KeyError:
        raise UnknownArchError(f"unknown arch {arch!r}; known: {sorted(ARCH_FACTS)}") from None
