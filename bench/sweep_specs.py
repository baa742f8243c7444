"""Writes the sweep specs of the project's H200 tuning runs, one file per (kernel, model preset).

Every launch of a group (expert GEMMs, memory-bound block kernels, attention) is swept over the
V4-Flash and V4-Pro presets. Spaces of at most ``GRID_LIMIT``
valid configs per shape are swept exhaustively; larger ones (the expert GEMMs, RoPE, mHC glue)
by TPE with a per-shape trial budget, since one device session cannot grid them all (about
3,600 memory-bound and 30,000 GEMM configs over all shapes).

Every sweep measures the kernel's heuristic default first (the runner enqueues it).

Usage: python bench/sweep_specs.py OUT_DIR [GROUP]  (gemm, memory or attention; default gemm and memory)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from kernels import registry
from search_spaces import load_space

MEMORY_BOUND = ("mhc_glue_fwd", "mhc_glue_bwd", "mhc_collapse_fwd", "mhc_collapse_bwd", "mhc_expand_fwd",
                "mhc_expand_bwd", "rope_fwd", "rope_bwd", "router_fwd", "router_bwd", "router_hash_fwd")
EXPERT_GEMMS = ("expert_up_fwd", "expert_down_fwd", "expert_down_bwd_dx", "expert_up_bwd_dx",
                "expert_down_bwd_dw", "expert_up_bwd_dw")
ATTENTION = ("sparse_attn_fwd", "sparse_attn_bwd", "compressor_fwd", "compressor_bwd", "indexer_fwd")
GROUPS = {"gemm": EXPERT_GEMMS, "memory": MEMORY_BOUND, "attention": ATTENTION}
GRID_LIMIT = 24
TPE_TRIALS = {"memory": 16, "gemm": 20}  # attention kernels: the "gemm" budget (they count FLOPs)


def spec(kernel: str, preset: str) -> dict:
    """Grid when every preset shape has at most GRID_LIMIT valid configs, else TPE."""
    space = load_space(kernel)
    grid = space.grid("sm_90")
    largest = max(sum(space.violation(c, s, "sm_90") is None for c in grid)
                  for s in registry.get(kernel).presets[preset])
    body: dict = {"kernel": kernel, "shapes": preset, "arch": "sm_90"}
    if largest > GRID_LIMIT:
        body["strategy"] = {"name": "tpe", "seed": 0}
        body["budget"] = {"max_trials": TPE_TRIALS["memory" if kernel in MEMORY_BOUND else "gemm"]}
    else:
        body["strategy"] = {"name": "grid"}
    if kernel in MEMORY_BOUND or registry.get(kernel).flops is None:
        body["timing"] = {"method": "cudagraph"}  # microsecond kernels: device time, not launch cost
    return body


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    kernels = GROUPS[sys.argv[2]] if len(sys.argv) > 2 else (*EXPERT_GEMMS, *MEMORY_BOUND)  # GEMMs first
    n = 0
    for kernel in kernels:
        for preset in ("v4-flash", "v4-pro"):
            n += 1
            (out / f"{n:02d}-{kernel}-{preset}.yaml").write_text(yaml.safe_dump(spec(kernel, preset), sort_keys=False))
    print(f"wrote {n} specs to {out}")


if __name__ == "__main__":
    main()
