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

The model groups (``proxy-8l``, ``v4-flash-ep8``, ``v4-pro-ep8``) sweep the launches of that model's step
the committed table misses, ``MODEL_TRIALS`` TPE trials a shape (``SWEEP_TRIALS`` in the environment
overrides it: fewer trials fit a short device call).

Usage: python bench/sweep_specs.py OUT_DIR [GROUP]  (a name of ``SPEC_GROUPS`` at the end, e.g. gemm,
memory, attention or glue-bwd-slabs; default gemm and memory)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import yaml

from kernels import registry
from kernels.tuning import load_table
from search_spaces import load_space

MEMORY_BOUND = ("mhc_glue_fwd", "mhc_glue_bwd", "mhc_collapse_fwd", "mhc_collapse_bwd", "mhc_expand_fwd",
                "mhc_expand_bwd", "rope_fwd", "rope_bwd", "router_fwd", "router_bwd", "router_hash_fwd",
                "moe_combine_fwd", "cross_entropy_fwd", "cross_entropy_bwd", "adamw_step")
EXPERT_GEMMS = ("expert_up_fwd", "expert_down_fwd", "expert_down_bwd_dx", "expert_up_bwd_dx",
                "expert_down_bwd_dw", "expert_up_bwd_dw")
PRESETS = ("v4-flash", "v4-pro")
GRID_LIMIT = 24
TPE_TRIALS = {"memory": 16, "gemm": 20}
ATTENTION_TPE_TRIALS = 12
GRID_SHAPE = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 4, "topk": 512, "window": 128}  # Flash CSA


def graph_timed(kernel: str) -> bool:
    """Memory-bound launches and any without a FLOP count run for microseconds: their sweeps (and
    benchmarks) time device time by CUDA-graph replay, not launch cost."""
    return kernel in MEMORY_BOUND or registry.get(kernel).flops is None


def shapes_of(kernel: str, seq: int | None = None, presets: tuple[str, ...] = PRESETS) -> list[dict]:
    """The kernel's shapes of ``presets`` (Flash and Pro), those at sequence ``seq`` if given."""
    return [s for p in presets for s in registry.get(kernel).presets[p] if seq is None or s["seq"] == seq]


def grid_spec(kernel: str, shapes: list[dict] | str, space: dict | None = None) -> dict:
    """An exhaustive sweep of ``space`` (default: the kernel's own) at ``shapes`` (or a preset's name),
    graph-timed where ``graph_timed``."""
    body: dict = {"kernel": kernel, "shapes": shapes, "arch": "sm_90"}
    if space is not None:
        body["space"] = space
    body["strategy"] = {"name": "grid"}
    if graph_timed(kernel):
        body["timing"] = {"method": "cudagraph"}
    return body


def tpe_spec(kernel: str, shapes: list[dict] | str, trials: int) -> dict:
    """A TPE sweep (seed 0) of ``trials`` configs a shape, graph-timed where ``graph_timed``."""
    body: dict = {"kernel": kernel, "shapes": shapes, "arch": "sm_90", "strategy": {"name": "tpe", "seed": 0},
                  "budget": {"max_trials": trials}}
    if graph_timed(kernel):
        body["timing"] = {"method": "cudagraph"}
    return body


def per_preset_specs(kernels: tuple[str, ...]) -> list[tuple[str, dict]]:
    return [(f"{k}-{p}", spec(k, p)) for k in kernels for p in PRESETS]


def spec(kernel: str, preset: str) -> dict:
    """Grid when every preset shape has at most GRID_LIMIT valid configs, else TPE."""
    space = load_space(kernel)
    grid = space.grid("sm_90")
    largest = max(sum(space.violation(c, s, "sm_90") is None for c in grid)
                  for s in registry.get(kernel).presets[preset])
    if largest > GRID_LIMIT:
        return tpe_spec(kernel, preset, TPE_TRIALS["memory" if kernel in MEMORY_BOUND else "gemm"])
    return grid_spec(kernel, preset)


def search_efficiency_specs() -> list[tuple[str, dict]]:
    """The exhaustive grids of the two largest sparse-attention spaces at the Flash CSA shape, which
    the search-efficiency replay (bench/search_efficiency.py) samples from."""
    return [(f"{k}-grid", grid_spec(k, [GRID_SHAPE])) for k in ("sparse_attn_fwd", "sparse_attn_bwd")]


def attention_specs() -> list[tuple[str, dict]]:
    """The attention sweeps in the order a short session should run them (see the module doc)."""
    def preset_shapes(kernel: str, seq: int, presets: tuple[str, ...] = PRESETS) -> list[dict]:
        return [s for s in shapes_of(kernel, seq, presets) if s != GRID_SHAPE]

    specs = search_efficiency_specs()
    for seq in (4096, 8192):
        specs += [(f"{k}-{seq}", tpe_spec(k, preset_shapes(k, seq), ATTENTION_TPE_TRIALS))
                  for k in ("sparse_attn_fwd", "sparse_attn_bwd")]
        specs += [(f"{k}-{seq}", tpe_spec(k, preset_shapes(k, seq, ("v4-flash",)), ATTENTION_TPE_TRIALS))
                  for k in ("compressor_fwd", "compressor_bwd")]
        specs.append((f"indexer_fwd-{seq}", tpe_spec("indexer_fwd", preset_shapes("indexer_fwd", seq),
                                                     ATTENTION_TPE_TRIALS)))
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
        shapes = [s for s in shapes_of(kernel) if s["skew"] == 0 and (s["experts"] < 64 or not ep8_only)]
        specs.append((f"{kernel}-tma", grid_spec(kernel, shapes, space)))
    return specs


# The glue forward at 4,096 tokens, where the 2026-12-01 TPE sweeps (16 trials of 540 configs) left
# it at 35-38% of the copy bandwidth: a grid over the long-loop tilings around their best.
GLUE_4096_SPACE = {"BLOCK_N": [32, 64], "BLOCK_K": [64, 128], "SPLIT_K": [4, 8, 16], "FUSED_GATES": [0],
                   "GATES_BLOCK_N": [0], "num_warps": [4, 8], "num_stages": [3, 4], "maxnreg": [None]}
GLUE_4096_SHAPES = [{"tokens": 4096, "hidden": hidden} for hidden in (4096, 7168)]


def glue_4096_specs() -> list[tuple[str, dict]]:
    return [("mhc_glue_fwd-4096-grid", grid_spec("mhc_glue_fwd", GLUE_4096_SHAPES, GLUE_4096_SPACE))]


# The split forward with its gates in the last split program of each token block (FUSED_GATES 1: two
# launches, not three; the gates launch was 2.9-3.3 us of 44-73 at 4,096 tokens), beside
# the three-launch form over the same split tilings, at both 4,096-token shapes.
GLUE_FUSED_GATES_SPACE = GLUE_4096_SPACE | {"SPLIT_K": [4, 8], "FUSED_GATES": [0, 1]}


def glue_fused_gates_specs() -> list[tuple[str, dict]]:
    return [("mhc_glue_fwd-fused-gates-grid", grid_spec("mhc_glue_fwd", GLUE_4096_SHAPES, GLUE_FUSED_GATES_SPACE))]


# 128-token blocks beside 64 (every program reads its split's chunk of fn, as many bytes as of h at
# 64 tokens, half at 128; the projection kernel ran at 83% of L2 throughput), and the
# gates launch over 16-token blocks or the projection's (64-token blocks are 64 programs at 4,096
# tokens), at both 4,096-token shapes; the committed tiling is in the grid.
GLUE_WIDE_BLOCKS_SPACE = GLUE_4096_SPACE | {"BLOCK_N": [64, 128], "BLOCK_K": [32, 64], "GATES_BLOCK_N": [0, 16],
                                            "num_stages": [3]}


def glue_wide_blocks_specs() -> list[tuple[str, dict]]:
    return [("mhc_glue_fwd-wide-blocks-grid", grid_spec("mhc_glue_fwd", GLUE_4096_SHAPES, GLUE_WIDE_BLOCKS_SPACE))]


# The sparse-attention backward with its entry gradient transposed (wgmma at any head count; 64-head
# blocks fit): a grid against the form it replaces, atomics, one pass, at the six sequence-4,096 shapes.
ATTENTION_BWD_TRANSPOSED_SPACE = {"BLOCK_H": [32, 64], "TILE_K": [16, 32], "DE_TRANSPOSED": [0, 1],
                                  "num_warps": [8], "num_stages": [1, 2], "DKV_MODE": ["atomic"], "R_CHUNK": [0],
                                  "UNCHAINED": [0], "PTX_BARRIER": [0], "maxnreg": [None]}


def attention_bwd_transposed_specs(seq: int = 4096, space: dict = ATTENTION_BWD_TRANSPOSED_SPACE
                                   ) -> list[tuple[str, dict]]:
    return [(f"sparse_attn_bwd-transposed-grid-{seq}", grid_spec("sparse_attn_bwd", shapes_of("sparse_attn_bwd", seq),
                                                                 space))]


# The same at sequence 8,192 (four of its six shapes had no table entry), at the two stages the
# sequence-4,096 grid's winners all took (a 64 x 16 transposed tile at one stage hit an illegal
# address there).
ATTENTION_BWD_8192_SPACE = ATTENTION_BWD_TRANSPOSED_SPACE | {"num_stages": [2]}


# The backward with dS and P through memory (UNCHAINED) beside the chained form, in the
# one tiling whose first dots are warpgroup MMAs at 8 warps (64 heads x 16 entries, transposed; two
# stages), atomics and the split reduction, at all twelve shapes, beside each shape's committed entry.
ATTENTION_BWD_UNCHAINED_SPACE = {"BLOCK_H": [64], "TILE_K": [16], "DE_TRANSPOSED": [1], "num_warps": [8],
                                 "num_stages": [2], "DKV_MODE": ["atomic", "split"], "R_CHUNK": [0],
                                 "UNCHAINED": [0, 1], "PTX_BARRIER": [0], "maxnreg": [None]}


def attention_grid_with_committed_specs(kernel: str, name: str, space: dict) -> list[tuple[str, dict]]:
    """At each of the twelve shapes of ``kernel``, the grid of ``space`` beside the shape's committed
    entry (``grid_with_committed_specs``)."""
    return grid_with_committed_specs(kernel, name, space, shapes_of(kernel),
                                     lambda shape: f"{shape['seq']}-{shape['heads']}-{shape['ratio']}")


def grid_with_committed_specs(kernel: str, name: str, space: dict | list[dict], shapes: list[dict],
                              label: Callable[[dict], str]) -> list[tuple[str, dict]]:
    """At each of ``shapes`` (named in the spec by ``label``), the grid of ``space`` (or of each space of a
    list) beside the shape's committed entry (a one-point grid; the heuristic default where the table has
    none), which the export must be able to keep: export with ``--fastest KERNEL`` where the grid leaves
    the committed config out, since the export otherwise takes the newer sweep's winner, the grid's."""
    spaces = space if isinstance(space, list) else [space]
    specs = []
    for shape in shapes:
        prefix = f"{kernel}-{name}-{label(shape)}"
        # as tuning.resolve runs an entry: its config over the default (older entries lack new knobs);
        # the default alone where the table has no entry
        entry = load_table("sm_90")["entries"].get(kernel, {}).get(registry.get(kernel).shape_key(shape), {})
        committed = registry.get(kernel).default_config(shape) | entry.get("config", {})
        one_point = {p: [v] for p, v in committed.items()}
        specs += [(f"{prefix}-committed", grid_spec(kernel, [shape], one_point))]
        specs += [(f"{prefix}-grid" + (f"-{i + 1}" if i else ""), grid_spec(kernel, [shape], grid))
                  for i, grid in enumerate(spaces)]
    return specs


# That sweep's winner at every shape was 64 x 16, transposed, atomics, UNCHAINED. Unchained, 32-entry
# tiles fit the register bound (offline sm_90: 472 bytes spilled) and re-read Q and dO half as often
# per entry: 16- and 32-entry tiles with atomics (the split reduction lost at every shape), each
# with and without the PTX barrier that lets the gathers pipeline, beside the committed entry.
ATTENTION_BWD_UNCHAINED_32_SPACE = ATTENTION_BWD_UNCHAINED_SPACE | {"TILE_K": [16, 32], "DKV_MODE": ["atomic"],
                                                                   "UNCHAINED": [1], "PTX_BARRIER": [0, 1]}


# The indexer's grids run before KEY_ROWS and SELECT_IN_SCORING existed: Triton's scoring with
# (query, head) rows, the selection a launch of its own.
INDEXER_ROW_FORM = {"KEY_ROWS": [0], "SELECT_IN_SCORING": [0]}
# ... and those before HEAD_SPLITS and GLUON too: the heads in one program, Triton's scoring.
INDEXER_TRITON_UNSPLIT = {"HEAD_SPLITS": [1], "GLUON": [0]} | INDEXER_ROW_FORM


# The indexer's scoring with the key range as a grid axis (KEY_TILES) against the one-axis grid,
# the selection held at its tuned tiling, at the two sequence-4,096 shapes.
INDEXER_KEY_TILES_SPACE = {"BLOCK_S": [16, 64], "BLOCK_H": [1, 4], "BLOCK_T": [128, 256], "KEY_TILES": [0, 1, 2],
                           "num_warps": [4, 8], "num_stages": [2], "SELECT_ROWS": [2], "SELECT_WARPS": [16],
                           "maxnreg": [None], **INDEXER_TRITON_UNSPLIT}


def indexer_key_tiles_specs() -> list[tuple[str, dict]]:
    return [("indexer_fwd-key-tiles-grid", grid_spec("indexer_fwd", shapes_of("indexer_fwd", 4096),
                                                     INDEXER_KEY_TILES_SPACE))]


# The glue backward with dfn accumulated transposed (wgmma at 64-token steps) against the form it
# replaces, whose tuned configs all took 16-token mma.sync steps, at every glue preset shape.
GLUE_BWD_TRANSPOSED_SPACE = {"BLOCK_N": [16, 64], "BLOCK_K": [64, 128, 256], "SLABS": [8], "DFN_TRANSPOSED": [0, 1],
                             "num_warps": [4, 8], "num_stages": [2]}


def glue_bwd_transposed_specs() -> list[tuple[str, dict]]:
    return [("mhc_glue_bwd-transposed-grid", grid_spec("mhc_glue_bwd", shapes_of("mhc_glue_bwd"),
                                                       GLUE_BWD_TRANSPOSED_SPACE))]


# The glue backward's transposed form (the 2026-12-01 H200 grid's winner at every shape, 1.47-1.71x
# the best of the old form) over the slab counts, tile widths and stages that grid held fixed.
GLUE_BWD_TRANSPOSED_WIDE_SPACE = {"BLOCK_N": [64], "BLOCK_K": [64, 128, 256], "SLABS": [8, 16, 32],
                                  "DFN_TRANSPOSED": [1], "num_warps": [4, 8], "num_stages": [1, 2]}


# Fewer slabs for that winner: the wide grid's best took its least slab count (8) at every shape.
GLUE_BWD_SLABS_SPACE = GLUE_BWD_TRANSPOSED_WIDE_SPACE | {"BLOCK_K": [64], "SLABS": [2, 4, 8], "num_warps": [4]}

# The transposed form's tiles (the tuned entries': 64 x 64, 2 or 8 slabs) by TMA descriptors beside
# pointers.
GLUE_BWD_TMA_SPACE = GLUE_BWD_TRANSPOSED_WIDE_SPACE | {"BLOCK_K": [64, 128], "SLABS": [2, 8], "TMA": [0, 1]}

# Host-encoded (TMA 1) against device-built (TMA 2) descriptors, beside pointers, in the committed
# 64 x 64 transposed tilings, at every glue shape (device-built ones cost the host no
# encoding, and may cost the 16,384-token entries 1-3% of device time; never compared in one run).
GLUE_BWD_TMA_MODES_SPACE = GLUE_BWD_TMA_SPACE | {"BLOCK_K": [64], "num_warps": [4], "TMA": [0, 1, 2]}


def glue_bwd_grid_specs(name: str, space: dict, min_tokens: int = 0) -> list[tuple[str, dict]]:
    """The glue-bwd-transposed grid's shapes (those of at least ``min_tokens`` tokens) over another ``space``."""
    shapes = [s for s in shapes_of("mhc_glue_bwd") if s["tokens"] >= min_tokens]
    return [(f"mhc_glue_bwd-{name}-grid", grid_spec("mhc_glue_bwd", shapes, space))]


# The indexer's selection (a third of its time, and slower in the tuned config than in the
# default: 102-107 against 84-88 us) over its rows and warps, the scoring held at the key-tiles
# grid's winner, at every indexer shape. The 2026-12-01 grid's winner had the fewest warps it
# held (2); one warp (admitted at sequence 4,096 only: 203-211 registers, no spills offline) is next.
INDEXER_SELECT_SPACE = {"BLOCK_S": [16], "BLOCK_H": [4], "BLOCK_T": [256], "KEY_TILES": [1], "num_warps": [8],
                        "num_stages": [2], "SELECT_ROWS": [1, 2, 4, 8, 16], "SELECT_WARPS": [1, 2, 4, 8, 16],
                        "maxnreg": [None], **INDEXER_TRITON_UNSPLIT}


def indexer_select_specs() -> list[tuple[str, dict]]:
    return [("indexer_fwd-select-grid", grid_spec("indexer_fwd", shapes_of("indexer_fwd"), INDEXER_SELECT_SPACE))]


# The indexer after its selection moved to uint32 keys with an early stop (fewer instructions per
# pass, about half the passes): the scoring over the tilings that decide how many (query, head)
# rows a dot takes and how many programs share an SM, the selection held at its sequence-4,096
# winner (its scores do not depend on topk, so both 4,096 shapes see the same scoring); then the
# selection again at every indexer shape, the scoring held at its tuned tiling.
INDEXER_SCORING_SPACE = {"BLOCK_S": [16, 32, 64], "BLOCK_H": [1, 2, 4], "BLOCK_T": [128, 256], "KEY_TILES": [1, 2],
                         "num_warps": [4, 8], "num_stages": [2], "SELECT_ROWS": [1], "SELECT_WARPS": [1],
                         "maxnreg": [None], **INDEXER_TRITON_UNSPLIT}
INDEXER_UINT32_SELECT_SPACE = INDEXER_SELECT_SPACE | {"SELECT_ROWS": [1, 2, 4], "SELECT_WARPS": [1, 2, 4, 8]}


def indexer_scoring_and_select_specs() -> list[tuple[str, dict]]:
    return [("indexer_fwd-scoring-grid", grid_spec("indexer_fwd", shapes_of("indexer_fwd", 4096),
                                                   INDEXER_SCORING_SPACE)),
            ("indexer_fwd-uint32-select-grid", grid_spec("indexer_fwd", shapes_of("indexer_fwd"),
                                                         INDEXER_UINT32_SELECT_SPACE))]


# The scoring with its heads summed once per key tile (LATE_HEAD_SUM: 252 against 570 sm_90
# instructions per head block of the tuned tiling, offline) over the tilings it makes affordable,
# beside the incumbent (the tuned configs of 2026-12-02, the per-block sum), the selection held at
# each sequence's winner, at every indexer shape (one key tile a program: the 2026-12-02 grid's
# best took it at every tiling).
INDEXER_LATE_SUM_SPACE = {"BLOCK_S": [8, 16, 32], "BLOCK_H": [2, 4, 8], "BLOCK_T": [64, 128, 256], "KEY_TILES": [1],
                          "LATE_HEAD_SUM": [1], "num_warps": [4, 8], "num_stages": [2], "maxnreg": [None],
                          **INDEXER_TRITON_UNSPLIT}
INDEXER_INCUMBENT_SPACE = {"BLOCK_S": [16], "BLOCK_H": [4], "BLOCK_T": [256], "KEY_TILES": [1], "LATE_HEAD_SUM": [0],
                           "num_warps": [8], "num_stages": [2], "maxnreg": [None], **INDEXER_TRITON_UNSPLIT}
INDEXER_SELECT_WINNER = {4096: {"SELECT_ROWS": [1], "SELECT_WARPS": [2]},
                         8192: {"SELECT_ROWS": [1], "SELECT_WARPS": [4]}}


def indexer_late_sum_specs() -> list[tuple[str, dict]]:
    return [(f"indexer_fwd-{name}-grid-{seq}", grid_spec("indexer_fwd", shapes_of("indexer_fwd", seq), space | select))
            for seq, select in INDEXER_SELECT_WINNER.items()
            for name, space in (("incumbent", INDEXER_INCUMBENT_SPACE), ("late-sum", INDEXER_LATE_SUM_SPACE))]


# The forward's lazy rescaling (RESCALE_SLACK 8: the accumulator's BLOCK_H x 512 multiply only
# when some head's max grows by more than 8 log2 units) against rescaling every tile, over the
# tile lengths and stages of the tuned configs, at the six sequence-4,096 shapes.
ATTENTION_FWD_LAZY_SPACE = {"BLOCK_H": [64], "TILE_K": [32, 64], "TAIL_K": [0], "num_warps": [8],
                            "num_stages": [1, 2], "RESCALE_SLACK": [0, 8], "UNCHAINED": [0], "PTX_BARRIER": [0],
                            "GLUON": [0], "LATE_FIRST": [0], "maxnreg": [None]}


def attention_fwd_grid_specs(name: str, seq: int, space: dict) -> list[tuple[str, dict]]:
    return [(f"sparse_attn_fwd-{name}-grid-{seq}", grid_spec("sparse_attn_fwd", shapes_of("sparse_attn_fwd", seq),
                                                             space))]


# That grid's result (sequence 4,096): lazy rescaling lost at every shape, and the
# winners were 64-entry tiles (two stages at the window shapes, one at CSA) that the earlier TPE
# sweeps had not tried there. The same tiles without it at sequence 8,192.
ATTENTION_FWD_TILES_SPACE = ATTENTION_FWD_LAZY_SPACE | {"RESCALE_SLACK": [0]}
# The HCA forward, the one layer type whose default no sweep has beaten at sequence 4,096: head
# blocks, tile lengths, warps and a third stage, at its four shapes.
ATTENTION_FWD_HCA_SPACE = {"BLOCK_H": [32, 64], "TILE_K": [16, 32, 64], "TAIL_K": [0], "num_warps": [4, 8],
                           "num_stages": [2, 3], "RESCALE_SLACK": [0], "UNCHAINED": [0], "PTX_BARRIER": [0],
                           "GLUON": [0], "LATE_FIRST": [0], "maxnreg": [None]}


def attention_fwd_hca_specs() -> list[tuple[str, dict]]:
    shapes = [s for s in shapes_of("sparse_attn_fwd") if s["ratio"] == 128]
    return [("sparse_attn_fwd-hca-grid", grid_spec("sparse_attn_fwd", shapes, ATTENTION_FWD_HCA_SPACE))]


# A tail tile (TAIL_K) for each query's last partial tile, beside none, over the tilings that won
# the HCA and CSA forwards, at their eight shapes: an HCA query's entries are its window and up to
# 32 (sequence 4,096) or 64 compressed ones, a CSA query's below sequence 4 * topk ragged.
ATTENTION_FWD_TAIL_SPACES = {  # by compress ratio
    128: {"BLOCK_H": [32, 64], "TILE_K": [32, 64], "TAIL_K": [0, 16, 32], "num_warps": [4, 8], "num_stages": [2, 3],
          "RESCALE_SLACK": [0], "UNCHAINED": [0], "PTX_BARRIER": [0], "GLUON": [0], "LATE_FIRST": [0],
          "maxnreg": [None]},
    4: {"BLOCK_H": [64], "TILE_K": [64], "TAIL_K": [0, 16, 32], "num_warps": [8], "num_stages": [1, 2],
        "RESCALE_SLACK": [0], "UNCHAINED": [0], "PTX_BARRIER": [0], "GLUON": [0], "LATE_FIRST": [0], "maxnreg": [None]},
}


# P through memory (UNCHAINED) beside the chained form, over the 64-head tilings that
# won the forward at every shape (32- or 64-entry tiles, a 32-entry tail or none, one or two
# stages), at all twelve shapes.
ATTENTION_FWD_UNCHAINED_SPACE = {"BLOCK_H": [64], "TILE_K": [32, 64], "TAIL_K": [0, 32], "num_warps": [8],
                                 "num_stages": [1, 2], "RESCALE_SLACK": [0], "UNCHAINED": [0, 1], "PTX_BARRIER": [0],
                                 "GLUON": [0], "LATE_FIRST": [0], "maxnreg": [None]}


def attention_fwd_unchained_specs(name: str = "unchained", space: dict = ATTENTION_FWD_UNCHAINED_SPACE
                                  ) -> list[tuple[str, dict]]:
    return [(f"sparse_attn_fwd-{name}-grid-{seq}",
             grid_spec("sparse_attn_fwd", shapes_of("sparse_attn_fwd", seq), space)) for seq in (4096, 8192)]


# UNCHAINED's hand-off behind an inline PTX barrier (PTX_BARRIER 1), which the pipeliner does not
# stop at: two stages then pipeline its gathers. The call-2 grid's two-stage tilings, chained,
# unchained and unchained behind PTX, at all twelve shapes.
ATTENTION_FWD_PIPELINED_SPACE = ATTENTION_FWD_UNCHAINED_SPACE | {"num_stages": [2], "PTX_BARRIER": [0, 1]}

# That sweep's PTX barrier read its hand-off volatile (scalar system-scope loads) and lost by
# 1.17-1.34x; PTX_BARRIER 2 reads it plainly. The same two-stage grid with 0 and 2 (it holds the
# committed chained entries), and the backward's 32-entry grid with 0, 1 and 2 beside its
# committed entry.
ATTENTION_FWD_PLAIN_HANDOFF_SPACE = ATTENTION_FWD_PIPELINED_SPACE | {"PTX_BARRIER": [0, 2]}
ATTENTION_BWD_PLAIN_HANDOFF_SPACE = ATTENTION_BWD_UNCHAINED_32_SPACE | {"TILE_K": [32], "PTX_BARRIER": [0, 1, 2]}

# PTX_BARRIER 2 tied the chained forward. The Gluon form (GLUON 1, one tiling) beside
# that grid's two-stage chained and plain-handoff configs, at all twelve shapes; then its three
# modes (in turn, partial sums, overlapped) against each other.
ATTENTION_FWD_GLUON_SPACE = ATTENTION_FWD_PLAIN_HANDOFF_SPACE | {"TILE_K": [64], "GLUON": [0, 1]}
ATTENTION_FWD_GLUON_MODES_SPACE = ATTENTION_FWD_GLUON_SPACE | {"TAIL_K": [0], "UNCHAINED": [0], "PTX_BARRIER": [0],
                                                               "GLUON": [1, 2, 3]}
# Mode 2 (partial sums) won the CSA forwards, 3 (overlapped) the others: both beside mode 4 (2 from
# static ring slots, four CTA barriers a tile instead of six).
ATTENTION_FWD_GLUON_SLOTS_SPACE = ATTENTION_FWD_GLUON_MODES_SPACE | {"GLUON": [2, 3, 4]}
# The persistent mode 5 (one program an SM, each item's Q and first tile copied in during the
# previous item) beside the modes that won (3 at the window and HCA shapes, 4 at the CSA ones),
# each with the last queries first (LATE_FIRST 1) and in order.
ATTENTION_FWD_PERSISTENT_SPACE = ATTENTION_FWD_GLUON_MODES_SPACE | {"GLUON": [3, 4, 5], "LATE_FIRST": [0, 1]}
# Mode 5 lost the CSA forwards to 4 (it spills there): 4 with its start overlapped (6) beside both,
# in order only (last-first lost everywhere).
ATTENTION_FWD_EARLY_START_SPACE = ATTENTION_FWD_GLUON_MODES_SPACE | {"GLUON": [4, 5, 6], "LATE_FIRST": [0]}


def attention_fwd_tail_specs() -> list[tuple[str, dict]]:
    return [(f"sparse_attn_fwd-tail-grid-ratio-{ratio}",
             grid_spec("sparse_attn_fwd", [s for s in shapes_of("sparse_attn_fwd") if s["ratio"] == ratio], space))
            for ratio, space in ATTENTION_FWD_TAIL_SPACES.items()]


# The compressor, swept with 12 TPE trials a shape on 2026-11-30 (and not at sequence 8,192): the
# forward's whole grid without a register cap (its tiles hold a few values a thread), the
# backward's space by TPE with COMPRESSOR_BWD_TRIALS a shape, at its six shapes.
COMPRESSOR_FWD_SPACE = {"maxnreg": [None]}
COMPRESSOR_BWD_TRIALS = 100


def compressor_specs() -> list[tuple[str, dict]]:
    shapes = shapes_of("compressor_fwd", presets=("v4-flash",))  # Pro's compressor shapes are Flash's
    return [("compressor_fwd-grid", grid_spec("compressor_fwd", shapes, COMPRESSOR_FWD_SPACE)),
            ("compressor_bwd-tpe", tpe_spec("compressor_bwd", shapes, COMPRESSOR_BWD_TRIALS))]


# The backward's grids run before CHANNELS_FIRST existed launched slabs first.
BEFORE_CHANNELS_FIRST = {"CHANNELS_FIRST": [0]}
# Those run before DAPE_LAST existed zeroed dape by a fill launch (with atomics).
BEFORE_DAPE_LAST = {"DAPE_LAST": [0]} | BEFORE_CHANNELS_FIRST
# Those run before SAVED_STATS existed recomputed the window softmax.
BEFORE_SAVED_STATS = {"SAVED_STATS": [0], "BLOCK_P": [1]} | BEFORE_DAPE_LAST


# The backward's HCA shape at sequence 8,192, which the compressor group's sweep did not reach:
# its 104 valid configs as a grid.
def compressor_bwd_hca_8192_specs() -> list[tuple[str, dict]]:
    shapes = [s for s in shapes_of("compressor_bwd", 8192, ("v4-flash",)) if s["ratio"] == 128]
    return [("compressor_bwd-hca-8192-grid", grid_spec("compressor_bwd", shapes, BEFORE_SAVED_STATS))]


# The backward with fewer dape slabs (SLABS 4-16, new; 32 was the least, one entry a slab at the HCA
# shapes, whose 8 MB of fp32 partials the closing torch sum reads back: 4.5 of its 14.5 us at
# sequence 4,096): the HCA shapes' whole grids, TPE at the ratio-4 shapes.
COMPRESSOR_BWD_SLABS_TRIALS = 80


def compressor_bwd_slabs_specs() -> list[tuple[str, dict]]:
    shapes = shapes_of("compressor_bwd", presets=("v4-flash",))
    return [("compressor_bwd-hca-grid", grid_spec("compressor_bwd", [s for s in shapes if s["ratio"] == 128],
                                                  BEFORE_SAVED_STATS)),
            ("compressor_bwd-ratio-4-tpe", tpe_spec("compressor_bwd", [s for s in shapes if s["ratio"] == 4],
                                                    COMPRESSOR_BWD_SLABS_TRIALS))]


# The HCA backward from the forward's saved log-sum-exp and fp32 c (SAVED_STATS 1: one launch,
# dape complete in each program; the committed entries take 13-17 us over two launches and 2-4 MB
# of fp32 dape partials), beside each shape's committed entry, at both HCA shapes.
COMPRESSOR_BWD_SAVED_STATS_SPACE = {"SAVED_STATS": [1], "BLOCK_G": [2, 4, 8], "BLOCK_P": [2, 4, 8],
                                    "BLOCK_D": [64, 128], "SLABS": [4], "DAPE_ATOMIC": [0], "num_warps": [4],
                                    "num_stages": [1, 2], "maxnreg": [None], **BEFORE_DAPE_LAST}


# Its first H200 grid was fastest at the most entries a loop step (8, against 4 and
# 2), the fewest positions (2) and the narrower channel block (64): more entries a step, down to
# one step for all 32 entries at 4,096, fewer positions and channels.
COMPRESSOR_BWD_SAVED_STATS_WIDE_SPACE = COMPRESSOR_BWD_SAVED_STATS_SPACE | {
    "BLOCK_G": [16, 32, 64], "BLOCK_P": [1, 2], "BLOCK_D": [16, 32, 64], "num_warps": [2, 4, 8], "num_stages": [1]}


def compressor_bwd_saved_stats_specs(space: dict = COMPRESSOR_BWD_SAVED_STATS_SPACE) -> list[tuple[str, dict]]:
    specs = []
    for shape in shapes_of("compressor_bwd", presets=("v4-flash",)):
        if shape["ratio"] != 128:
            continue
        committed = committed_config("compressor_bwd", shape)
        held = {p: [v] for p, v in committed.items()} | BEFORE_SAVED_STATS
        name = f"compressor_bwd-hca-{shape['seq']}"
        specs += [(f"{name}-committed", grid_spec("compressor_bwd", [shape], held)),
                  (f"{name}-saved-stats-grid", grid_spec("compressor_bwd", [shape], space))]
    return specs


# The ratio-4 backward with relaxed dape atomics (the acq_rel default fenced the adds, one MEMBAR a
# program): each ratio-4 shape's committed entry (1-warp programs of one tile each, atomics) beside
# its neighbours in entries a step, slabs, stages and register cap.
COMPRESSOR_BWD_RELAXED_SPACE = {"BLOCK_G": [2, 4, 8], "BLOCK_D": [16], "SLABS": [64, 128, 256], "DAPE_ATOMIC": [1],
                                "num_warps": [1], "num_stages": [1, 2], "maxnreg": [None, 128], **BEFORE_SAVED_STATS}


def compressor_bwd_ratio_4_beside_committed(label: str, space: dict) -> list[tuple[str, dict]]:
    """At each ratio-4 backward shape, its committed entry alone, then the grid of ``space``."""
    specs = []
    for shape in shapes_of("compressor_bwd", presets=("v4-flash",)):
        if shape["ratio"] != 4:
            continue
        held = {p: [v] for p, v in committed_config("compressor_bwd", shape).items()} | BEFORE_SAVED_STATS
        name = f"compressor_bwd-ratio-4-{shape['seq']}-{shape['dim']}"
        specs += [(f"{name}-committed", grid_spec("compressor_bwd", [shape], held)),
                  (f"{name}-{label}-grid", grid_spec("compressor_bwd", [shape], space))]
    return specs


def compressor_bwd_relaxed_specs() -> list[tuple[str, dict]]:
    return compressor_bwd_ratio_4_beside_committed("relaxed", COMPRESSOR_BWD_RELAXED_SPACE)


# The ratio-4 backward's dape published by the last program of each channel block from zero-at-rest
# scratch (DAPE_LAST 1: no fill launch before the kernel, 0.7 of the 6.5 us of kernel time and a
# graph node at CSA d 128, sequence 4,096), beside each ratio-4 shape's committed
# entry, over the same neighbourhood as the relaxed-atomics grid.
COMPRESSOR_BWD_DAPE_LAST_SPACE = COMPRESSOR_BWD_RELAXED_SPACE | {"DAPE_LAST": [0, 1]}


def compressor_bwd_dape_last_specs() -> list[tuple[str, dict]]:
    return compressor_bwd_ratio_4_beside_committed("dape-last", COMPRESSOR_BWD_DAPE_LAST_SPACE)


# The ratio-4 backward with its grid launched channel blocks first (CHANNELS_FIRST 1: the programs
# that launch together read neighbouring 32-byte sectors of the same rows; slabs first, they read
# the same 16 or 32 channels of rows far apart), at 16 and 32 channels a program, beside each
# ratio-4 shape's committed entry.
COMPRESSOR_BWD_CHANNELS_FIRST_SPACE = COMPRESSOR_BWD_RELAXED_SPACE | {
    "CHANNELS_FIRST": [0, 1], "BLOCK_D": [16, 32], "maxnreg": [None]}


def compressor_bwd_channels_first_specs() -> list[tuple[str, dict]]:
    return compressor_bwd_ratio_4_beside_committed("channels-first", COMPRESSOR_BWD_CHANNELS_FIRST_SPACE)


# The indexer's own compressor backward (CSA, d 128), the compressor's one miss (2.03-2.17x a
# same-size copy): TPE over its whole space, CHANNELS_FIRST and DAPE_LAST included,
# beyond the 1-warp neighbourhoods gridded so far.
COMPRESSOR_BWD_CSA_128_TRIALS = 150


def compressor_bwd_csa_128_tpe_specs() -> list[tuple[str, dict]]:
    shapes = [s for s in shapes_of("compressor_bwd", presets=("v4-flash",)) if s["ratio"] == 4 and s["dim"] == 128]
    spec = tpe_spec("compressor_bwd", shapes, COMPRESSOR_BWD_CSA_128_TRIALS)
    spec["space"] = {"BLOCK_D": [16, 32, 64, 128]}  # the space it ran over, before 8 channels were offered
    return [("compressor_bwd-csa-128-tpe", spec)]


# The CSA d 128 backward with 8 channels a program (half a 32-byte sector; new), for more programs:
# Nsight Compute found its 2,048 one-warp programs at 16 channels latency-bound, 11% achieved
# occupancy; 8 channels double them, and launched channel blocks first, a row's two
# halves of a sector are read by programs that run together.
COMPRESSOR_BWD_NARROW_SPACE = COMPRESSOR_BWD_CHANNELS_FIRST_SPACE | {"BLOCK_D": [8, 16], "SLABS": [128, 256, 512]}


def compressor_bwd_narrow_channels_specs() -> list[tuple[str, dict]]:
    specs = compressor_bwd_ratio_4_beside_committed("narrow-channels", COMPRESSOR_BWD_NARROW_SPACE)
    return [(name, spec) for name, spec in specs if spec["shapes"][0]["dim"] == 128]


# The indexer's whole space (77,130 valid configs at the Flash 4,096 shape), by TPE from valid
# configs only, at its four shapes: the earlier sweeps gridded slices of it.
INDEXER_TPE_TRIALS = 200


def indexer_tpe_specs() -> list[tuple[str, dict]]:
    return [("indexer_fwd-tpe", tpe_spec("indexer_fwd", shapes_of("indexer_fwd"), INDEXER_TPE_TRIALS))]


# The selection's interpolating threshold search (SELECT_INTERP 1: about 6 counting passes a row
# against 15-19, docs/findings.md) beside the bisection, over the selection's rows and
# warps, each shape's scoring held at its committed sm_90 entry (its TPE winners).
INDEXER_INTERP_SELECT_SPACE = {"SELECT_ROWS": [1, 2, 4], "SELECT_WARPS": [1, 2, 4, 8], "SELECT_INTERP": [0, 1]}
INDEXER_SCORING_PARAMS = ("BLOCK_S", "BLOCK_H", "BLOCK_T", "KEY_TILES", "LATE_HEAD_SUM", "num_warps", "num_stages",
                          "maxnreg")


def committed_config(kernel: str, shape: dict) -> dict:
    """The config of ``kernel``'s entry for ``shape`` in the committed sm_90 table."""
    return load_table("sm_90")["entries"][kernel][registry.get(kernel).shape_key(shape)]["config"]


def indexer_interp_select_specs() -> list[tuple[str, dict]]:
    specs = []
    for shape in shapes_of("indexer_fwd"):
        scoring = committed_config("indexer_fwd", shape)
        space = {p: [scoring[p]] for p in INDEXER_SCORING_PARAMS} | INDEXER_INTERP_SELECT_SPACE | INDEXER_TRITON_UNSPLIT
        specs.append((f"indexer_fwd-interp-select-grid-{shape['seq']}-{shape['topk']}",
                      grid_spec("indexer_fwd", [shape], space)))
    return specs


# The scoring with every head in one block (BLOCK_H 64: the block's q loaded once a program, so a
# program walking several key tiles re-reads only the keys), at the two topk-512 shapes (the
# scoring does not depend on topk), each shape's selection held at its committed entry.
INDEXER_ONE_HEAD_BLOCK_SPACE = {"BLOCK_S": [1, 2, 4], "BLOCK_H": [64], "BLOCK_T": [64, 128], "KEY_TILES": [0, 4],
                                "LATE_HEAD_SUM": [0], "num_warps": [4, 8], "num_stages": [2, 3], "maxnreg": [None],
                                **INDEXER_TRITON_UNSPLIT}


def committed_selection(shape: dict) -> dict:
    """The selection params of the committed indexer entry for ``shape``, as one-choice space overrides."""
    committed = committed_config("indexer_fwd", shape)
    return {p: [committed[p]] for p in INDEXER_INTERP_SELECT_SPACE}


def indexer_scoring_grid_specs(name: str, scoring: dict, topk: int | None = None) -> list[tuple[str, dict]]:
    """Grids of the scoring params ``scoring`` at each indexer shape (of ``topk`` only, if given), each
    shape's selection held at its committed entry."""
    specs = []
    for shape in shapes_of("indexer_fwd"):
        if topk is not None and shape["topk"] != topk:
            continue
        space = scoring | committed_selection(shape)
        specs.append((f"indexer_fwd-{name}-grid-{shape['seq']}-{shape['topk']}", grid_spec("indexer_fwd", [shape], space)))
    return specs


# The scoring's q and key tiles by TMA descriptors (TMA 1) beside pointer loads, over one-head dots
# (the tiling of the 8,192 / topk 1,024 entry) and their neighbours, at every indexer shape, each
# shape's selection held at its committed entry.
INDEXER_TMA_SPACE = {"BLOCK_S": [64, 128], "BLOCK_H": [1], "BLOCK_T": [128, 256], "KEY_TILES": [0, 1, 2],
                     "LATE_HEAD_SUM": [0], "num_warps": [4, 8], "num_stages": [2, 3], "maxnreg": [None], "TMA": [0, 1],
                     **INDEXER_TRITON_UNSPLIT}


# TMA (a 3-D [B * S, H, D] box) for head blocks of 2-8 with the late head sum, the tilings of the
# sequence-4,096 entries and their neighbours, beside the same tilings by pointers.
INDEXER_TMA_HEAD_BLOCKS_SPACE = {"BLOCK_S": [8, 16, 32], "BLOCK_H": [2, 4, 8], "BLOCK_T": [128], "KEY_TILES": [0, 1],
                                 "LATE_HEAD_SUM": [1], "num_warps": [4, 8], "num_stages": [3], "maxnreg": [None],
                                 "TMA": [0, 1], **INDEXER_TRITON_UNSPLIT}


# The heads spread over 1, 2 or 4 programs (HEAD_SPLITS, their partial scores summed by the
# selection): at 4,096 a grid of 64-query blocks of one 128-entry key tile is about 290 programs
# for 264 co-resident ones, a nearly empty second wave. At each sequence-4,096 shape, over both
# sequence-4,096 entries' tilings (one program walking its key tiles, or one a tile); at every
# shape, over the one-head TMA tiling of the sequence-8,192 entries (64- or 128-entry key tiles).
# Each shape's selection is held at its committed entry.
INDEXER_ONE_HEAD_SPLITS_SPACE = {"BLOCK_S": [64], "BLOCK_H": [1], "BLOCK_T": [64, 128], "KEY_TILES": [1],
                                 "LATE_HEAD_SUM": [0], "TMA": [1], "num_warps": [4], "num_stages": [3],
                                 "maxnreg": [None], "HEAD_SPLITS": [1, 2, 4], "GLUON": [0]} | INDEXER_ROW_FORM


def indexer_head_splits_specs() -> list[tuple[str, dict]]:
    specs = []
    tilings = [committed_config("indexer_fwd", shape) for shape in shapes_of("indexer_fwd", 4096)]
    for shape in shapes_of("indexer_fwd"):
        held = committed_selection(shape)
        name = f"indexer_fwd-head-splits-{shape['seq']}-{shape['topk']}"
        if shape["seq"] == 4096:
            for n, tiling in enumerate(tilings):
                space = {p: [tiling[p]] for p in INDEXER_SCORING_PARAMS} | {"TMA": [tiling.get("TMA", 0)]}
                space |= {"KEY_TILES": [0, 1], "HEAD_SPLITS": [1, 2, 4], "GLUON": [0]} | INDEXER_ROW_FORM | held
                specs.append((f"{name}-tiling-{n}", grid_spec("indexer_fwd", [shape], space)))
        specs.append((f"{name}-one-head", grid_spec("indexer_fwd", [shape], INDEXER_ONE_HEAD_SPLITS_SPACE | held)))
    return specs


# Three scoring programs an SM instead of two at sequence 4,096 (about 290 programs of 64 queries
# and one 128-entry key tile, for 264 co-resident ones at two an SM): at most 168 registers and 2
# q stages (64 KiB of shared memory a program) fit three; 64-entry key tiles with at most 128
# registers fit four. Beside each shape's committed entry, its selection held. The trials record
# host times too (tuner/sweep/ranking.py), which show what TMA's host-built descriptors cost at 4,096.
INDEXER_THREE_PER_SM_SPACE = {"BLOCK_S": [64], "BLOCK_H": [1], "BLOCK_T": [64, 128], "KEY_TILES": [1],
                              "LATE_HEAD_SUM": [0], "TMA": [0, 1], "num_warps": [4], "num_stages": [2, 3],
                              "maxnreg": [None, 128, 168], **INDEXER_TRITON_UNSPLIT}


def indexer_beside_committed_specs(label: str, space: dict, seq: int | None = None,
                                   hold_selection: bool = True) -> list[tuple[str, dict]]:
    """Per indexer shape (of sequence ``seq``, or all): its committed entry, and a grid of ``space``
    with the shape's selection held at its committed entry (unless ``hold_selection`` is False:
    ``space`` gives it)."""
    specs = []
    for shape in shapes_of("indexer_fwd", seq):
        # Parameters the entry predates take the values it ran with.
        incumbent = INDEXER_TRITON_UNSPLIT | {p: [v] for p, v in committed_config("indexer_fwd", shape).items()}
        incumbent.setdefault("TMA", [0])
        name = f"indexer_fwd-{label}-{shape['seq']}-{shape['topk']}"
        specs += [(f"{name}-committed", grid_spec("indexer_fwd", [shape], incumbent)),
                  (f"{name}-grid", grid_spec("indexer_fwd", [shape],
                                             space | (committed_selection(shape) if hold_selection else {})))]
    return specs


# The sm_90 Gluon scoring (GLUON 1: asynchronous warpgroup MMAs, each head's epilogue under the
# next head's dot) over its tilings and q ring depths, beside each shape's committed entry, at
# every indexer shape, each shape's selection held at its committed entry.
INDEXER_GLUON_SPACE = {"GLUON": [1], "BLOCK_S": [64], "BLOCK_H": [1], "BLOCK_T": [128, 256], "KEY_TILES": [1],
                       "LATE_HEAD_SUM": [0], "TMA": [0], "HEAD_SPLITS": [1], "num_warps": [4, 8],
                       "num_stages": [3, 4], "maxnreg": [None]} | INDEXER_ROW_FORM


# Its first H200 grid with unserialized MMAs was fastest at its deepest q ring (4
# slots, 10-16% faster than 3) and one warpgroup: 4 and 5 slots (2 programs an SM at 112 KiB).
INDEXER_GLUON_RING_SPACE = INDEXER_GLUON_SPACE | {"BLOCK_T": [128], "num_warps": [4], "num_stages": [4, 5]}


# The scoring's dot turned around (KEY_ROWS 1): keys down its rows, every head of 1-4 queries across
# its columns, so a query's 64 heads are summed inside a warp instead of across the four warps of a
# warpgroup, the cost named when every head in one (query, head) row block lost by
# 1.5x. The block's q is loaded once a program. Beside each sequence-4,096 entry (where the
# indexer misses 2x its floor), its selection held. Offline on sm_90, 2 queries x 64 keys take 121
# registers (4 programs an SM), 4 queries 239 (python -m bench offline_compile --arch sm_90).
INDEXER_KEY_ROWS_SPACE = {"KEY_ROWS": [1], "BLOCK_S": [1, 2, 4], "BLOCK_H": [64], "BLOCK_T": [64, 128],
                          "KEY_TILES": [0, 4], "LATE_HEAD_SUM": [0], "TMA": [0], "num_warps": [4, 8],
                          "num_stages": [2, 3], "maxnreg": [None], "HEAD_SPLITS": [1], "GLUON": [0]}


# The router forward's top-k rounds as one argmax each (ARGMAX 1: 93 sm_90 instructions a round
# against 195 at one token a warp, offline; 178 against 126 at two) beside max-then-min, over the
# tuned tilings' neighbours, at the four router shapes.
ROUTER_ARGMAX_SPACE = {"BLOCK_N": [1, 2, 4], "num_warps": [1, 2], "num_stages": [1], "ARGMAX": [0, 1]}


def router_argmax_specs() -> list[tuple[str, dict]]:
    return [("router_fwd-argmax-grid", grid_spec("router_fwd", shapes_of("router_fwd"), ROUTER_ARGMAX_SPACE))]


# Each scoring program picking its own rows' top-k (SELECT_IN_SCORING 1: no selection launch, its
# passes beside other programs' dots; at sequence 4,096 the selection was 19% of the indexer's
# device time) on KEY_ROWS tilings of 2-8 queries x 64 keys, by pointers or TMA,
# beside the same tilings with the selection launched apart (held at the shape's committed
# entry), at every indexer shape.
INDEXER_KEY_ROWS_TILINGS = {"KEY_ROWS": [1], "BLOCK_S": [2, 4, 8], "BLOCK_H": [64], "BLOCK_T": [64], "KEY_TILES": [0],
                            "LATE_HEAD_SUM": [0], "TMA": [0, 1], "num_warps": [4, 8], "num_stages": [2],
                            "maxnreg": [None], "HEAD_SPLITS": [1], "GLUON": [0]}
INDEXER_SELECT_IN_SCORING = {"SELECT_IN_SCORING": [1], "SELECT_ROWS": [1, 2, 4], "SELECT_WARPS": [4, 8],
                             "SELECT_INTERP": [1]}


def indexer_key_rows_specs(label: str, tilings: dict) -> list[tuple[str, dict]]:
    """Per indexer shape: its committed entry, a grid of KEY_ROWS ``tilings`` with the selection
    launched apart (held at the entry's), and one selecting in the scoring."""
    specs = indexer_beside_committed_specs(f"{label}-apart", tilings | {"SELECT_IN_SCORING": [0]})
    for shape in shapes_of("indexer_fwd"):
        specs.append((f"indexer_fwd-{label}-in-scoring-{shape['seq']}-{shape['topk']}-grid",
                      grid_spec("indexer_fwd", [shape], tilings | INDEXER_SELECT_IN_SCORING)))
    return specs


# The same with the q and key descriptors built by each program (TMA 2) beside host-encoded ones
# (TMA 1, whose encoding the host paid in an H200 bench: 0.170 ms a call against
# 0.094 of device time; 37-46 us a call, measured apart) and pointers, over the tilings that won.
INDEXER_KEY_ROWS_TMA_TILINGS = INDEXER_KEY_ROWS_TILINGS | {"BLOCK_S": [2, 4], "TMA": [0, 1, 2]}


# Around the sequence-4,096 entries (2 queries x 64 keys, host-encoded TMA, selecting in the
# scoring), which miss 2x the floor by 0.5-3% in the bench: 32-key tiles (mma.sync, but 40 KiB of
# shared memory, five programs an SM), 1-3 stages, the bisecting selection beside the
# interpolating one, 1 or 2 rows a step.
INDEXER_FUSED_KNOBS = INDEXER_KEY_ROWS_TILINGS | INDEXER_SELECT_IN_SCORING | {
    "BLOCK_S": [2], "BLOCK_T": [32, 64], "TMA": [1], "num_warps": [4], "num_stages": [1, 2, 3],
    "SELECT_ROWS": [1, 2], "SELECT_WARPS": [4], "SELECT_INTERP": [0, 1]}


# Hopper warp specialization of the row-tile expert GEMMs (TMA loads in a producer warp, the MMAs in
# one consumer warpgroup: 4 warps, where Triton 3.6 specializes the loop; offline sm_90 compiles),
# beside each balanced-load shape's committed entry. The spaces' register bounds keep
# the tiles a 4-warp program can hold.
WARP_SPECIALIZED_SPACE = {"BLOCK_M": [64, 128], "BLOCK_N": [64, 128, 256], "BLOCK_K": [64], "GROUP_M": [8],
                          "TMA": [1], "WARP_SPECIALIZE": [1], "num_warps": [4], "num_stages": [2, 3, 4],
                          "maxnreg": [None]}
ROW_TILE_GEMMS = ("expert_up_fwd", "expert_down_fwd", "expert_up_bwd_dx", "expert_down_bwd_dx")


def warp_specialized_gemm_specs() -> list[tuple[str, dict]]:
    """``WARP_SPECIALIZED_SPACE`` beside the committed entry at every balanced-load Flash and Pro shape
    of the row-tile expert GEMMs (export with ``--merge --fastest`` those launches)."""
    return [spec for kernel in ROW_TILE_GEMMS
            for spec in grid_with_committed_specs(kernel, "warp-specialized", WARP_SPECIALIZED_SPACE,
                                                  [s for s in shapes_of(kernel) if s["skew"] == 0],
                                                  lambda shape: f"{shape['tokens']}-{shape['experts']}")]


# The expert MLP's backward at the expert-parallel shapes ``bench/expert_mlp.py`` times, beside each
# shape's committed entry: the weight gradients with their fp32 tile read before the reduction
# (PREFETCH_GRAD; offline sm_90 with Triton 3.9 at the committed 128 x 128 x 128 tiling: 198 registers against 170, no
# spills), by pointers or TMA; and the dgu launch with its SwiGLU backward over the tile's column
# halves (EPILOGUE_HALVES), which fits 128 columns without spills (offline sm_90: 205 registers against
# 255 and 1,288 bytes spilled) and 64 columns in 99 registers, two stages at two programs an SM.
# And the weight gradients at two programs an SM: 128 x 128 x 64 tiles held to 128 registers, so that one
# program's epilogue (the fp32 tile's read and write) runs beside the other's reduction (offline sm_90 with
# Triton 3.9, three stages: 96 kB of shared memory, 128 or 136 bytes spilled, the same loop as at 168
# registers).
WGRAD_PREFETCH_SPACE = {"BLOCK_M": [128], "BLOCK_N": [128], "BLOCK_K": [64, 128], "GROUP_M": [8], "TMA": [0, 1],
                        "PREFETCH_GRAD": [1], "num_warps": [8], "num_stages": [2, 3], "maxnreg": [None, 232]}
WGRAD_TWO_PROGRAMS_SPACE = {"BLOCK_M": [128], "BLOCK_N": [128], "BLOCK_K": [64], "GROUP_M": [8], "TMA": [0, 1],
                            "PREFETCH_GRAD": [0], "num_warps": [8], "num_stages": [2, 3], "maxnreg": [128]}
SWIGLU_BWD_HALVES_SPACE = {"BLOCK_M": [128], "BLOCK_N": [64, 128], "BLOCK_K": [64, 128], "GROUP_M": [8],
                           "TMA": [1], "WARP_SPECIALIZE": [0], "EPILOGUE_HALVES": [1], "num_warps": [8],
                           "num_stages": [2, 3, 4], "maxnreg": [None]}
EXPERT_BACKWARD_SPACES = {"expert_up_bwd_dw": [WGRAD_PREFETCH_SPACE, WGRAD_TWO_PROGRAMS_SPACE],
                          # and w * a formed before the kernel, which then runs unscaled (PRESCALE)
                          "expert_down_bwd_dw": [WGRAD_PREFETCH_SPACE | {"PRESCALE": [0, 1]},
                                                 WGRAD_TWO_PROGRAMS_SPACE | {"PRESCALE": [0, 1]}],
                          "expert_down_bwd_dx": SWIGLU_BWD_HALVES_SPACE}


def expert_backward_specs() -> list[tuple[str, dict]]:
    """``EXPERT_BACKWARD_SPACES`` beside each launch's committed entry at the shapes ``bench/expert_mlp.py``
    times (export with ``--merge --fastest`` those launches)."""
    return [spec for kernel, space in EXPERT_BACKWARD_SPACES.items()
            for spec in grid_with_committed_specs(kernel, "backward", space,
                                                  [s for s in shapes_of(kernel) if _expert_parallel_benched(s)],
                                                  lambda shape: f"{shape['tokens']}-{shape['experts']}")]


def untuned_gemm_specs() -> list[tuple[str, dict]]:
    """TPE sweeps of the expert GEMMs at the Flash and Pro shapes the committed sm_90 table holds no
    entry for, the weight gradients first, and each kernel's expert-parallel shapes (the ones
    ``bench/expert_mlp.py`` times: a balanced load of 24,576 rows over 32 or 48 experts) before all
    others: a sweep cut short by its deadline has tuned what the benchmarks run. The others go from the
    smallest problem to the largest (by bytes moved), so that such a sweep has tuned the most cells."""
    entries = load_table("sm_90")["entries"]
    first: list[tuple[str, dict]] = []
    rest: list[tuple[int, str, dict]] = []
    for kernel in dict.fromkeys(("expert_up_bwd_dw", "expert_down_bwd_dw", *EXPERT_GEMMS)):
        launch = registry.get(kernel)
        held = entries.get(kernel, {})
        shapes = sorted((s for s in shapes_of(kernel) if launch.shape_key(s) not in held), key=launch.bytes_moved)
        benched = [s for s in shapes if _expert_parallel_benched(s)]
        others = [s for s in shapes if not _expert_parallel_benched(s)]
        if benched:
            first.append((f"{kernel}-untuned-ep8", tpe_spec(kernel, benched, TPE_TRIALS["gemm"])))
        if others:
            rest.append((launch.bytes_moved(others[0]), f"{kernel}-untuned", tpe_spec(kernel, others, TPE_TRIALS["gemm"])))
    return first + [(name, body) for _, name, body in sorted(rest, key=lambda r: r[0])]


def _expert_parallel_benched(shape: dict) -> bool:
    return shape["tokens"] == 24576 and shape["experts"] in (32, 48) and shape["skew"] == 0


MODEL_TRIALS = 12


def model_trials() -> int:
    """``SWEEP_TRIALS`` from the environment, else ``MODEL_TRIALS``; a bad value exits with code 2."""
    raw = os.environ.get("SWEEP_TRIALS", str(MODEL_TRIALS))
    if not raw.isdigit() or int(raw) < 1:
        print(f"SWEEP_TRIALS: must be a whole number >= 1, got {raw!r}", file=sys.stderr)
        sys.exit(2)
    return int(raw)


def model_specs(preset: str, ep: int = 1, seq: int = 4096, trials: int = MODEL_TRIALS,
                kernels: tuple[str, ...] | None = None) -> list[tuple[str, dict]]:
    """TPE sweeps of the launches ``preset``'s training step (mbs 1, expert parallelism ``ep``) makes at
    shapes the committed sm_90 table has no entry for (``tuner sweep shapes``). The proxy's widths match
    none of the Flash and Pro presets' exact fields (45 of its 59 launches ran their defaults with the
    tuned table); Flash and Pro at EP 8 miss their routers' local expert counts, the shared expert, the
    narrow RMSNorms, the up GEMM's dW and the loss (23 of 61, 27 of 61). With ``kernels``, every launch
    of those kernels instead, entry or not: a re-sweep."""
    from tuner.train.model_shapes import model_launches, sweep_specs
    from v4.config import load_preset

    launches = model_launches(load_preset(preset), seq, 1, ep, "sm_90")
    chosen = [launch for launch in launches
              if (launch.kernel in kernels if kernels is not None else launch.source == "default")]
    return [(f"{body['kernel']}-{preset}", body) for body in sweep_specs(chosen, "sm_90", trials)]


SPEC_GROUPS: dict[str, Callable[[], list[tuple[str, dict]]]] = {
    "proxy-8l": lambda: model_specs("proxy-8l", trials=model_trials()),
    "v4-flash-ep8": lambda: model_specs("v4-flash", ep=8, trials=model_trials()),
    "v4-pro-ep8": lambda: model_specs("v4-pro", ep=8, trials=model_trials()),
    # the proxy's expert GEMMs again, device-timed: their entries were ranked by CUDA events around
    # launches whose host path rivals their device time, and lost 13.5 ms in the replayed H200 step
    "proxy-8l-gemms": lambda: model_specs("proxy-8l", trials=model_trials(), kernels=EXPERT_GEMMS),
    "gemm": lambda: per_preset_specs(EXPERT_GEMMS),
    "gemm-untuned": untuned_gemm_specs,
    "gemm-warp-specialized": warp_specialized_gemm_specs,
    "expert-backward": expert_backward_specs,
    "memory": lambda: per_preset_specs(MEMORY_BOUND),
    "moe-combine": lambda: per_preset_specs(("moe_combine_fwd",)),
    "adamw": lambda: per_preset_specs(("adamw_step",)),  # the optimizer's update, a rank's parameters
    # the LM head's loss at V4's vocabulary (Flash and Pro share it) and the proxy's
    "cross-entropy": lambda: [(f"{k}-{p}", spec(k, p)) for k in ("cross_entropy_fwd", "cross_entropy_bwd")
                              for p in ("v4-flash", "proxy")],
    "attention": attention_specs,
    "tma": lambda: tma_specs(TMA_SPACES),
    # the 2026-12-01 follow-up: the split glue forward, TMA backward GEMMs
    "split-glue-tma-bwd": lambda: per_preset_specs(("mhc_glue_fwd",)) + tma_specs(TMA_BWD_SPACES, ep8_only=True),
    "glue-4096": glue_4096_specs,
    "glue-fused-gates": glue_fused_gates_specs,
    "glue-fwd-wide-blocks": glue_wide_blocks_specs,
    "attention-bwd-transposed": attention_bwd_transposed_specs,
    "attention-bwd-8192": lambda: attention_bwd_transposed_specs(8192, ATTENTION_BWD_8192_SPACE),
    "indexer-key-tiles": indexer_key_tiles_specs,
    "glue-bwd-transposed": glue_bwd_transposed_specs,
    "glue-bwd-transposed-wide": lambda: glue_bwd_grid_specs("transposed-wide", GLUE_BWD_TRANSPOSED_WIDE_SPACE),
    "glue-bwd-slabs": lambda: glue_bwd_grid_specs("slabs", GLUE_BWD_SLABS_SPACE),
    "glue-bwd-tma": lambda: glue_bwd_grid_specs("tma", GLUE_BWD_TMA_SPACE),
    # At 4,096 tokens an eager call is host-bound and TMA adds host time (docs/findings.md, Launches and host time):
    # the same grid at the 16,384-token shapes only.
    "glue-bwd-tma-16384": lambda: glue_bwd_grid_specs("tma-16384", GLUE_BWD_TMA_SPACE, min_tokens=16384),
    "glue-bwd-tma-modes": lambda: glue_bwd_grid_specs("tma-modes", GLUE_BWD_TMA_MODES_SPACE),
    "indexer-select": indexer_select_specs,
    "indexer-scoring-and-select": indexer_scoring_and_select_specs,
    "indexer-late-sum": indexer_late_sum_specs,
    "attention-fwd-lazy": lambda: attention_fwd_grid_specs("lazy-rescale", 4096, ATTENTION_FWD_LAZY_SPACE),
    "attention-fwd-8192-tiles": lambda: attention_fwd_grid_specs("tiles", 8192, ATTENTION_FWD_TILES_SPACE),
    "attention-fwd-hca": attention_fwd_hca_specs,
    "attention-fwd-tail": attention_fwd_tail_specs,
    "attention-fwd-unchained": attention_fwd_unchained_specs,
    "attention-fwd-pipelined": lambda: attention_fwd_unchained_specs("pipelined", ATTENTION_FWD_PIPELINED_SPACE),
    "attention-bwd-unchained": lambda: attention_grid_with_committed_specs("sparse_attn_bwd", "unchained",
                                                                        ATTENTION_BWD_UNCHAINED_SPACE),
    "attention-bwd-unchained-32": lambda: attention_grid_with_committed_specs("sparse_attn_bwd", "unchained-32",
                                                                           ATTENTION_BWD_UNCHAINED_32_SPACE),
    "attention-plain-handoff": lambda: [
        *attention_fwd_unchained_specs("plain-handoff", ATTENTION_FWD_PLAIN_HANDOFF_SPACE),
        *attention_grid_with_committed_specs("sparse_attn_bwd", "plain-handoff", ATTENTION_BWD_PLAIN_HANDOFF_SPACE)],
    "attention-gluon": lambda: attention_fwd_unchained_specs("gluon", ATTENTION_FWD_GLUON_SPACE),
    "attention-gluon-modes": lambda: attention_fwd_unchained_specs("gluon-modes", ATTENTION_FWD_GLUON_MODES_SPACE),
    "attention-gluon-slots": lambda: attention_fwd_unchained_specs("gluon-slots", ATTENTION_FWD_GLUON_SLOTS_SPACE),
    "attention-persistent": lambda: attention_fwd_unchained_specs("persistent", ATTENTION_FWD_PERSISTENT_SPACE),
    "attention-early-start": lambda: attention_fwd_unchained_specs("early-start", ATTENTION_FWD_EARLY_START_SPACE),
    "compressor": compressor_specs,
    "router-argmax": router_argmax_specs,
    "search-efficiency": search_efficiency_specs,
    "compressor-bwd-hca-8192": compressor_bwd_hca_8192_specs,
    "indexer-tpe": indexer_tpe_specs,
    "indexer-interp-select": indexer_interp_select_specs,
    "compressor-bwd-slabs": compressor_bwd_slabs_specs,
    "compressor-bwd-saved-stats": compressor_bwd_saved_stats_specs,
    "compressor-bwd-saved-stats-wide": lambda: compressor_bwd_saved_stats_specs(COMPRESSOR_BWD_SAVED_STATS_WIDE_SPACE),
    "compressor-bwd-relaxed": compressor_bwd_relaxed_specs,
    "compressor-bwd-dape-last": compressor_bwd_dape_last_specs,
    "compressor-bwd-channels-first": compressor_bwd_channels_first_specs,
    "compressor-bwd-csa-128-tpe": compressor_bwd_csa_128_tpe_specs,
    "compressor-bwd-narrow-channels": compressor_bwd_narrow_channels_specs,
    "indexer-one-head-block": lambda: indexer_scoring_grid_specs("one-head-block", INDEXER_ONE_HEAD_BLOCK_SPACE, topk=512),
    "indexer-tma": lambda: indexer_scoring_grid_specs("tma", INDEXER_TMA_SPACE),
    "indexer-tma-head-blocks": lambda: indexer_scoring_grid_specs("tma-head-blocks", INDEXER_TMA_HEAD_BLOCKS_SPACE),
    "indexer-head-splits": indexer_head_splits_specs,
    "indexer-three-per-sm": lambda: indexer_beside_committed_specs("three-per-sm", INDEXER_THREE_PER_SM_SPACE, 4096),
    "indexer-gluon": lambda: indexer_beside_committed_specs("gluon", INDEXER_GLUON_SPACE),
    "indexer-gluon-ring": lambda: indexer_beside_committed_specs("gluon", INDEXER_GLUON_RING_SPACE),
    "indexer-key-rows": lambda: indexer_beside_committed_specs("key-rows", INDEXER_KEY_ROWS_SPACE, 4096),
    "indexer-select-in-scoring": lambda: indexer_key_rows_specs("key-rows", INDEXER_KEY_ROWS_TILINGS),
    "indexer-tma-modes": lambda: indexer_key_rows_specs("key-rows-tma", INDEXER_KEY_ROWS_TMA_TILINGS),
    "indexer-fused-knobs": lambda: indexer_beside_committed_specs("fused-knobs", INDEXER_FUSED_KNOBS, 4096,
                                                                  hold_selection=False),
}


def main() -> None:
    if len(sys.argv) not in (2, 3):
        print(__doc__.split("Usage: ")[1], file=sys.stderr, end="")
        sys.exit(2)
    out = Path(sys.argv[1])
    group = sys.argv[2] if len(sys.argv) > 2 else None
    if group is not None and group not in SPEC_GROUPS:
        print(f"GROUP: no group {group!r}; the groups are {', '.join(SPEC_GROUPS)}", file=sys.stderr)
        sys.exit(2)
    specs = SPEC_GROUPS[group]() if group else per_preset_specs((*EXPERT_GEMMS, *MEMORY_BOUND))  # GEMMs first
    out.mkdir(parents=True, exist_ok=True)
    for n, (name, body) in enumerate(specs, 1):
        (out / f"{n:02d}-{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    print(f"wrote {len(specs)} specs to {out}")


if __name__ == "__main__":
    main()
