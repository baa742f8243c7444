"""Writes the sweep specs of the project's H200 tuning runs, one file per (kernel, model preset).

Every launch of a group (expert GEMMs, memory-bound block kernels, attention) is swept over the
V4-Flash and V4-Pro presets. Spaces of at most ``GRID_LIMIT``
valid configs per shape are swept exhaustively; larger ones (the expert GEMMs, RoPE, mHC glue)
by TPE with a per-shape trial budget, since one device session cannot grid them all (about
3,600 memory-bound and 30,000 GEMM configs over all shapes).

The attention group is ordered for a short device session: the exhaustive grids of the two
largest sparse-attention spaces at the Flash CSA shape (the search-efficiency replay needs them),
then TPE over the other sequence-4,096 shapes (the twelve cells of the benchmark), the compressor
and indexer, and last the sequence-8,192 shapes; the compressor presets of Flash and Pro are the
same shapes, swept once.

Every sweep measures the kernel's heuristic default first (the runner enqueues it).

Usage: python bench/sweep_specs.py OUT_DIR [GROUP]  (gemm, memory, attention, tma,
split-glue-tma-bwd, glue-4096, attention-bwd-transposed, attention-bwd-8192, indexer-key-tiles, glue-bwd-transposed,
glue-bwd-transposed-wide, glue-bwd-slabs or indexer-select;
default gemm and memory)
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
TPE_TRIALS = {"memory": 16, "gemm": 20}
ATTENTION_TPE_TRIALS = 12
GRID_SHAPE = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 4, "topk": 512, "window": 128}  # Flash CSA


def graph_timed(kernel: str) -> bool:
    """Memory-bound launches and any without a FLOP count run for microseconds: their sweeps (and
    benchmarks) time device time by CUDA-graph replay, not launch cost."""
    return kernel in MEMORY_BOUND or registry.get(kernel).flops is None


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
    if graph_timed(kernel):
        body["timing"] = {"method": "cudagraph"}
    return body


def attention_specs() -> list[tuple[str, dict]]:
    """The attention sweeps in the order a short session should run them (see the module doc)."""
    def tpe(kernel: str, shapes: list[dict]) -> dict:
        body = {"kernel": kernel, "shapes": shapes, "arch": "sm_90", "strategy": {"name": "tpe", "seed": 0},
                "budget": {"max_trials": ATTENTION_TPE_TRIALS}}
        if registry.get(kernel).flops is None:  # the compressor's microsecond launches: device time
            body["timing"] = {"method": "cudagraph"}
        return body

    def preset_shapes(kernel: str, seq: int, presets: tuple[str, ...] = ("v4-flash", "v4-pro")) -> list[dict]:
        shapes = [s for p in presets for s in registry.get(kernel).presets[p] if s["seq"] == seq]
        return [s for s in shapes if s != GRID_SHAPE]

    specs = [(f"{k}-grid", {"kernel": k, "shapes": [GRID_SHAPE], "arch": "sm_90", "strategy": {"name": "grid"}})
             for k in ("sparse_attn_fwd", "sparse_attn_bwd")]
    for seq in (4096, 8192):
        specs += [(f"{k}-{seq}", tpe(k, preset_shapes(k, seq))) for k in ("sparse_attn_fwd", "sparse_attn_bwd")]
        specs += [(f"{k}-{seq}", tpe(k, preset_shapes(k, seq, ("v4-flash",)))) for k in ("compressor_fwd", "compressor_bwd")]
        specs.append((f"indexer_fwd-{seq}", tpe("indexer_fwd", preset_shapes("indexer_fwd", seq))))
    return specs


# The TMA comparison: pointer loads against TMA descriptors over the tiles that suit the H200
# (8 warps, 128-row tiles), as a grid, at the balanced-load shapes of both models.
TMA_SPACES = {
    "expert_up_fwd": {"BLOCK_M": [128], "BLOCK_N": [64, 128], "BLOCK_K": [64, 128], "GROUP_M": [8], "TMA": [0, 1],
                      "num_warps": [8], "num_stages": [3, 4], "maxnreg": [None]},
    "expert_down_fwd": {"BLOCK_M": [128], "BLOCK_N": [128, 256], "BLOCK_K": [64, 128], "GROUP_M": [8], "TMA": [0, 1],
                        "num_warps": [8], "num_stages": [3, 4], "maxnreg": [None]},
}


# The backward dX GEMMs, at the EP = 8 balanced-load shapes (Flash 32 experts, Pro 48) only; the
# down dX epilogue (SwiGLU backward) allows 64-wide column tiles at 8 warps (its space's bound).
TMA_BWD_SPACES = {
    "expert_down_bwd_dx": {"BLOCK_M": [64, 128], "BLOCK_N": [64], "BLOCK_K": [64, 128], "GROUP_M": [8],
                           "TMA": [0, 1], "num_warps": [8], "num_stages": [3, 4], "maxnreg": [None]},
    "expert_up_bwd_dx": TMA_SPACES["expert_down_fwd"],
}


def tma_specs(spaces: dict[str, dict], ep8_only: bool = False) -> list[tuple[str, dict]]:
    """Grids of ``spaces`` at every balanced-load (skew 0) preset shape of Flash and Pro (with
    ``ep8_only``, those with fewer than 64 local experts)."""
    specs = []
    for kernel, space in spaces.items():
        shapes = [s for p in ("v4-flash", "v4-pro") for s in registry.get(kernel).presets[p]
                  if s["skew"] == 0 and (s["experts"] < 64 or not ep8_only)]
        specs.append((f"{kernel}-tma", {"kernel": kernel, "shapes": shapes, "arch": "sm_90", "space": space,
                                        "strategy": {"name": "grid"}}))
    return specs


# The glue forward at 4,096 tokens, where the 2026-12-01 TPE sweeps (16 trials of 540 configs) left
# it at 35-38% of the copy bandwidth: a grid over the long-loop tilings around their best.
GLUE_4096_SPACE = {"BLOCK_N": [32, 64], "BLOCK_K": [64, 128], "SPLIT_K": [4, 8, 16], "num_warps": [4, 8],
                   "num_stages": [3, 4], "maxnreg": [None]}


def glue_4096_specs() -> list[tuple[str, dict]]:
    shapes = [{"tokens": 4096, "hidden": hidden} for hidden in (4096, 7168)]
    return [("mhc_glue_fwd-4096-grid", {"kernel": "mhc_glue_fwd", "shapes": shapes, "arch": "sm_90",
                                        "space": GLUE_4096_SPACE, "strategy": {"name": "grid"},
                                        "timing": {"method": "cudagraph"}})]


# The sparse-attention backward with its entry gradient transposed (wgmma at any head count; 64-head
# blocks fit): a grid against the form it replaces, atomics, one pass, at the six sequence-4,096 shapes.
ATTENTION_BWD_TRANSPOSED_SPACE = {"BLOCK_H": [32, 64], "TILE_K": [16, 32], "DE_TRANSPOSED": [0, 1],
                                  "num_warps": [8], "num_stages": [1, 2], "DKV_MODE": ["atomic"], "R_CHUNK": [0],
                                  "maxnreg": [None]}


def attention_bwd_transposed_specs(seq: int = 4096, space: dict = ATTENTION_BWD_TRANSPOSED_SPACE
                                   ) -> list[tuple[str, dict]]:
    shapes = [s for p in ("v4-flash", "v4-pro") for s in registry.get("sparse_attn_bwd").presets[p]
              if s["seq"] == seq]
    return [(f"sparse_attn_bwd-transposed-grid-{seq}", {"kernel": "sparse_attn_bwd", "shapes": shapes,
                                                        "arch": "sm_90", "space": space,
                                                        "strategy": {"name": "grid"}})]


# The same at sequence 8,192 (four of its six shapes had no table entry), at the two stages the
# sequence-4,096 grid's winners all took (a 64 x 16 transposed tile at one stage hit an illegal
# address there).
ATTENTION_BWD_8192_SPACE = ATTENTION_BWD_TRANSPOSED_SPACE | {"num_stages": [2]}


# The indexer's scoring with the key range as a grid axis (KEY_TILES) against the one-axis grid,
# the selection held at its tuned tiling, at the two sequence-4,096 shapes.
INDEXER_KEY_TILES_SPACE = {"BLOCK_S": [16, 64], "BLOCK_H": [1, 4], "BLOCK_T": [128, 256], "KEY_TILES": [0, 1, 2],
                           "num_warps": [4, 8], "num_stages": [2], "SELECT_ROWS": [2], "SELECT_WARPS": [16],
                           "maxnreg": [None]}


def indexer_key_tiles_specs() -> list[tuple[str, dict]]:
    shapes = [s for p in ("v4-flash", "v4-pro") for s in registry.get("indexer_fwd").presets[p] if s["seq"] == 4096]
    return [("indexer_fwd-key-tiles-grid", {"kernel": "indexer_fwd", "shapes": shapes, "arch": "sm_90",
                                            "space": INDEXER_KEY_TILES_SPACE, "strategy": {"name": "grid"}})]


# The glue backward with dfn accumulated transposed (wgmma at 64-token steps) against the form it
# replaces, whose tuned configs all took 16-token mma.sync steps, at every glue preset shape.
GLUE_BWD_TRANSPOSED_SPACE = {"BLOCK_N": [16, 64], "BLOCK_K": [64, 128, 256], "SLABS": [8], "DFN_TRANSPOSED": [0, 1],
                             "num_warps": [4, 8], "num_stages": [2], "maxnreg": [None]}


def glue_bwd_transposed_specs() -> list[tuple[str, dict]]:
    shapes = [s for p in ("v4-flash", "v4-pro") for s in registry.get("mhc_glue_bwd").presets[p]]
    return [("mhc_glue_bwd-transposed-grid", {"kernel": "mhc_glue_bwd", "shapes": shapes, "arch": "sm_90",
                                              "space": GLUE_BWD_TRANSPOSED_SPACE, "strategy": {"name": "grid"},
                                              "timing": {"method": "cudagraph"}})]


# The glue backward's transposed form (the 2026-12-01 H200 grid's winner at every shape, 1.47-1.71x
# the best of the old form) over the slab counts, tile widths and stages that grid held fixed.
GLUE_BWD_TRANSPOSED_WIDE_SPACE = {"BLOCK_N": [64], "BLOCK_K": [64, 128, 256], "SLABS": [8, 16, 32],
                                  "DFN_TRANSPOSED": [1], "num_warps": [4, 8], "num_stages": [1, 2],
                                  "maxnreg": [None]}


# Fewer slabs for that winner: the wide grid's best took its least slab count (8) at every shape.
GLUE_BWD_SLABS_SPACE = GLUE_BWD_TRANSPOSED_WIDE_SPACE | {"BLOCK_K": [64], "SLABS": [2, 4, 8], "num_warps": [4]}


def glue_bwd_grid_specs(name: str, space: dict) -> list[tuple[str, dict]]:
    """The glue-bwd-transposed grid's shapes and timing over another ``space``."""
    body = glue_bwd_transposed_specs()[0][1] | {"space": space}
    return [(f"mhc_glue_bwd-{name}-grid", body)]


# The indexer's selection (a third of its time, and slower in the tuned config than in the
# default: 102-107 against 84-88 us) over its rows and warps, the scoring held at the key-tiles
# grid's winner, at every indexer shape. The 2026-12-01 grid's winner had the fewest warps it
# held (2); one warp (admitted at sequence 4,096 only: 203-211 registers, no spills offline) is next.
INDEXER_SELECT_SPACE = {"BLOCK_S": [16], "BLOCK_H": [4], "BLOCK_T": [256], "KEY_TILES": [1], "num_warps": [8],
                        "num_stages": [2], "SELECT_ROWS": [1, 2, 4, 8, 16], "SELECT_WARPS": [1, 2, 4, 8, 16],
                        "maxnreg": [None]}


def indexer_select_specs() -> list[tuple[str, dict]]:
    shapes = [s for p in ("v4-flash", "v4-pro") for s in registry.get("indexer_fwd").presets[p]]
    return [("indexer_fwd-select-grid", {"kernel": "indexer_fwd", "shapes": shapes, "arch": "sm_90",
                                         "space": INDEXER_SELECT_SPACE, "strategy": {"name": "grid"}})]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    group = sys.argv[2] if len(sys.argv) > 2 else None
    if group == "attention":
        specs = attention_specs()
    elif group == "tma":
        specs = tma_specs(TMA_SPACES)
    elif group == "glue-4096":
        specs = glue_4096_specs()
    elif group == "attention-bwd-transposed":
        specs = attention_bwd_transposed_specs()
    elif group == "attention-bwd-8192":
        specs = attention_bwd_transposed_specs(8192, ATTENTION_BWD_8192_SPACE)
    elif group == "indexer-key-tiles":
        specs = indexer_key_tiles_specs()
    elif group == "glue-bwd-transposed":
        specs = glue_bwd_transposed_specs()
    elif group == "glue-bwd-transposed-wide":
        specs = glue_bwd_grid_specs("transposed-wide", GLUE_BWD_TRANSPOSED_WIDE_SPACE)
    elif group == "glue-bwd-slabs":
        specs = glue_bwd_grid_specs("slabs", GLUE_BWD_SLABS_SPACE)
    elif group == "indexer-select":
        specs = indexer_select_specs()
    elif group == "split-glue-tma-bwd":  # the 2026-12-01 follow-up: the split glue forward, TMA backward GEMMs
        specs = [(f"mhc_glue_fwd-{p}", spec("mhc_glue_fwd", p)) for p in ("v4-flash", "v4-pro")]
        specs += tma_specs(TMA_BWD_SPACES, ep8_only=True)
    else:
        kernels = GROUPS[group] if group else (*EXPERT_GEMMS, *MEMORY_BOUND)  # GEMMs first
        specs = [(f"{k}-{p}", spec(k, p)) for k in kernels for p in ("v4-flash", "v4-pro")]
    for n, (name, body) in enumerate(specs, 1):
        (out / f"{n:02d}-{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    print(f"wrote {len(specs)} specs to {out}")


if __name__ == "__main__":
    main()
