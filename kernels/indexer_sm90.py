"""The indexer's scoring for Hopper (sm_90), written in Gluon (``GLUON`` 1 in the indexer's config).

Triton's scoring (``kernels.indexer``) issues each head's dot and waits for it before the ReLU,
the w weighting and the head sum. So a warp's tensor-core work and its epilogue take turns (on
the H200 the tensor pipe was busy 47-54% of the scoring's time, ncu). Here the dots
are asynchronous warpgroup MMAs. Head h + 1's dot runs while head h's result is ReLU'd, weighted
and added (four heads a loop iteration, of which the last waits for its dot alone). The q tiles
of the next heads are copied into a shared-memory ring by ``cp.async`` while both run.

Tiling: a program takes ``BLOCK_S`` = 64 queries of one batch element (latest first) and one
key tile of ``BLOCK_T`` compressed entries, whose keys stay in shared memory for every head.
On 4 warps (one warpgroup) the tile is 128 entries. On 8 warps it is 256, each warpgroup taking
half of the entries against the same q tile, which halves the q bytes a FLOP. The head
dimension is 128 (the V4 indexer's). Gluon has no interpreter mode, so this form runs on sm_90
GPUs only; its parity tests run there.

Measured on the H200: within 4% of Triton's scoring at every indexer shape, at the
same device time (90 us at S = 4,096, 257 us at 8,192), so the epilogue is not what bounds either.
Both re-read every head's q tile for each key tile (about 4.6 TB/s of L2 traffic at 8,192,
derived from the tiling, not measured).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels.host_math import cdiv
from kernels.registry import Config

BLOCK_S = 64
DIM = 128
TILES = {128: 4, 256: 8}  # BLOCK_T: num_warps
STAGES = (3, 4, 5)  # q ring slots: the dot in flight, the next, the rest copied ahead (H200: 5 ~ 4 > 3)
# Triton 3.6 names the CTA-wide barrier thread_barrier; later versions call it barrier.
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


@gluon.constexpr_function
def _rows_layout(num_warps):
    """[rows, 128] bf16 tiles copied 16 bytes a thread."""
    return gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _scores_layout(num_warps, block_t):
    """The warpgroup-MMA layout of a [64, block_t] score tile: each warpgroup takes block_t / groups
    entries of all 64 queries."""
    groups = num_warps // 4
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, groups], instr_shape=[16, block_t // groups, 16])


@gluon.jit
def _copy_rows(buffer, ptr, first_row, last_row, row_stride, col0, ROWS: gl.constexpr, D: gl.constexpr,
               rows_layout: gl.constexpr):
    """Start copying rows ``first_row ..`` (clamped to ``last_row``: rows past it copy that row,
    whose results are never stored) of ``D`` columns from ``col0`` into ``buffer``."""
    rows = gl.minimum(first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, rows_layout)), last_row)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, rows_layout))
    async_copy.async_copy_global_to_shared(buffer, ptr + (rows.to(gl.int64) * row_stride + col0)[:, None]
                                           + cols[None, :])


@gluon.jit
def _issue_head(q_ring, k_smem, q_ptr, zero, h, b, s0, S, H, BLOCK_S_: gl.constexpr, D: gl.constexpr,
                NUM_STAGES: gl.constexpr, rows_layout: gl.constexpr):
    """Head h's dot, issued asynchronously once its q tile has landed, after starting the copy of
    head h + NUM_STAGES - 2's tile into the slot head h - 2's dot read.

    The wait is for this thread's copies; the barrier makes every thread's visible and puts every
    warp past head h - 2's wait. One cp.async group a head (empty past the last dot) keeps the
    wait count fixed; the keys are in head 0's group."""
    ahead: gl.constexpr = NUM_STAGES - 2
    async_copy.wait_group(ahead - 1)
    fence_async_shared()
    _cta_barrier()
    if h + ahead < gl.cdiv(H, 4) * 4:  # dots past the last head read its q again
        _copy_rows(q_ring.index((h + ahead) % NUM_STAGES), q_ptr, b * S + s0, b * S + S - 1, H * D,
                   gl.minimum(h + ahead, H - 1) * D, BLOCK_S_, D, rows_layout)
    async_copy.commit_group()
    return warpgroup_mma(q_ring.index(h % NUM_STAGES), k_smem.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _weighted(scores, w_ptr, w_rows, h, H):
    """Head h's ReLU'd scores weighted by its fp32 w (the block's queries are rows ``w_rows``), zeros
    past the last head."""
    w = gl.load(w_ptr + w_rows + gl.minimum(h, H - 1)).to(gl.float32) * (h < H).to(gl.float32)
    return gl.maximum(scores, 0.0) * w[:, None]


@gluon.jit
def _index_score_sm90_kernel(
    q_ptr, k_ptr, w_ptr, scores_ptr, S, T, H, ratio,
    BLOCK_S_: gl.constexpr, BLOCK_T: gl.constexpr, D: gl.constexpr, NUM_STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):
    """Scores of program (query block, key tile), as ``kernels.indexer._score_kernel`` stores them.

    The ring holds NUM_STAGES q tiles: head h's (its dot being issued), head h - 1's (its dot
    possibly still running) and NUM_STAGES - 2 heads copied ahead (``_issue_head``)."""
    rows_layout: gl.constexpr = _rows_layout(NUM_WARPS)
    scores_layout: gl.constexpr = _scores_layout(NUM_WARPS, BLOCK_T)
    query_blocks = gl.cdiv(S, BLOCK_S_)
    b = gl.program_id(0) // query_blocks
    s0 = (query_blocks - 1 - gl.program_id(0) % query_blocks) * BLOCK_S_
    t0 = gl.program_id(1) * BLOCK_T
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_T, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_T, D], gl.bfloat16))
    q_ring = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_S_, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_S_, D], gl.bfloat16))
    if t0 < gl.minimum(s0 + BLOCK_S_, S) // ratio:  # some query of the block sees the tile
        # q rows are the (query, head) rows of [B * S * H, D]; k rows those of [B * T, D].
        _copy_rows(k_smem, k_ptr, b * T + t0, b * T + T - 1, D, 0, BLOCK_T, D, rows_layout)
        for h in gl.static_range(NUM_STAGES - 2):
            if h < gl.cdiv(H, 4) * 4:
                _copy_rows(q_ring.index(h), q_ptr, b * S + s0, b * S + S - 1, H * D, gl.minimum(h, H - 1) * D,
                           BLOCK_S_, D, rows_layout)
            async_copy.commit_group()
        queries = s0 + gl.arange(0, BLOCK_S_, layout=gl.SliceLayout(1, scores_layout))
        w_rows = (b * S + gl.minimum(queries, S - 1)).to(gl.int64) * H
        zero = gl.zeros([BLOCK_S_, BLOCK_T], gl.float32, layout=scores_layout)
        total = zero
        # Four heads an iteration: each head's result is read while the next head's dot runs, and
        # only the last one's waits for its dot alone. No dot is in flight across the loop's back
        # edge: an accumulator read in the iteration after its dot was issued made ptxas serialize
        # every wgmma of the kernel (offline sm_90, Triton 3.6: C7514). A head count that is not a
        # multiple of 4 runs dots of the last head again, weighted 0.
        for h in range(0, H, 4):
            dot_0 = _issue_head(q_ring, k_smem, q_ptr, zero, h, b, s0, S, H, BLOCK_S_, D, NUM_STAGES, rows_layout)
            dot_1 = _issue_head(q_ring, k_smem, q_ptr, zero, h + 1, b, s0, S, H, BLOCK_S_, D, NUM_STAGES,
                                rows_layout)
            total += _weighted(warpgroup_mma_wait(num_outstanding=1, deps=(dot_0,)), w_ptr, w_rows, h, H)
            dot_2 = _issue_head(q_ring, k_smem, q_ptr, zero, h + 2, b, s0, S, H, BLOCK_S_, D, NUM_STAGES,
                                rows_layout)
            total += _weighted(warpgroup_mma_wait(num_outstanding=1, deps=(dot_1,)), w_ptr, w_rows, h + 1, H)
            dot_3 = _issue_head(q_ring, k_smem, q_ptr, zero, h + 3, b, s0, S, H, BLOCK_S_, D, NUM_STAGES,
                                rows_layout)
            total += _weighted(warpgroup_mma_wait(num_outstanding=1, deps=(dot_2,)), w_ptr, w_rows, h + 2, H)
            total += _weighted(warpgroup_mma_wait(num_outstanding=0, deps=(dot_3,)), w_ptr, w_rows, h + 3, H)
        keys = t0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, scores_layout))
        visible = (queries + 1) // ratio
        mask = (queries < S)[:, None] & (keys[None, :] < visible[:, None])
        gl.store(scores_ptr + ((b * S + queries).to(gl.int64) * T)[:, None] + keys[None, :], total, mask=mask)


def fits(config: Config, dim: int) -> str | None:
    """Why ``config`` cannot run this form at head dimension ``dim`` (None when it can)."""
    wrong = [f"{name} {config.get(name)!r} (it needs {value})" for name, value in
             (("BLOCK_S", BLOCK_S), ("BLOCK_H", 1), ("KEY_TILES", 1)) if config.get(name) != value]
    wrong += [f"{name} {config[name]!r} (it needs 0)" for name in ("LATE_HEAD_SUM", "TMA", "KEY_ROWS")
              if config.get(name)]
    if config.get("HEAD_SPLITS", 1) != 1:
        wrong.append(f"HEAD_SPLITS {config['HEAD_SPLITS']!r} (it needs 1)")
    if TILES.get(config.get("BLOCK_T")) != config.get("num_warps"):
        wrong.append(f"BLOCK_T {config.get('BLOCK_T')!r} on {config.get('num_warps')!r} warps "
                     f"(it takes {' or '.join(f'{t} on {w}' for t, w in TILES.items())})")
    if config.get("num_stages") not in STAGES:
        wrong.append(f"num_stages {config.get('num_stages')!r} (q ring slots: one of {STAGES})")
    if dim != DIM:
        wrong.append(f"head dimension {dim} (it needs {DIM})")
    return "; ".join(wrong) or None


def launch_scoring(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, ratio: int,
                   config: Config, compile_only: bool) -> None:
    """Fill ``rows [1, B, S, S // r]`` (``kernels.indexer._score_rows``'s buffer, one head split) where
    visible, on an sm_90 GPU."""
    batch, seq, heads, dim = q.shape
    n_keys = k.shape[1]
    grid = (batch * cdiv(seq, BLOCK_S), cdiv(n_keys, config["BLOCK_T"]))
    args = (q, k, w, rows, seq, n_keys, heads, ratio)
    constexprs = {"BLOCK_S_": BLOCK_S, "BLOCK_T": config["BLOCK_T"], "D": dim, "NUM_STAGES": config["num_stages"],
                  "NUM_WARPS": config["num_warps"], "num_warps": config["num_warps"]}
    if compile_only:
        _index_score_sm90_kernel.warmup(*args, grid=grid, **constexprs)
    elif grid[0] and grid[1]:
        _index_score_sm90_kernel[grid](*args, **constexprs)
