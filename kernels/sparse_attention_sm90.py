"""The sparse-attention forward for Hopper (sm_90), written in Gluon (``GLUON`` 1-6 in its config).

The Triton kernel (``kernels.sparse_attention``) cannot choose how its two dots are laid out over
the warps. At 64 heads on 8 warps Triton puts all 8 along the 64 head rows of ``Q E^T``, so both
warpgroups compute every logit (68 wgmma a 64-entry tile where 36 do); handing P over through
global memory (``UNCHAINED``) halves that but adds a barrier and a round trip to L2 a tile. Here
the layouts are explicit:

- both dots use a ``[4, 2]`` warpgroup-MMA layout: warpgroup 0 computes the logits of the tile's
  first half of entries and the output's first 256 columns, warpgroup 1 the other halves;
- P crosses between the warpgroups through an 8 KiB shared-memory tile, one CTA barrier a tile;
- each tile of 64 gathered entries is copied into a two-stage shared-memory ring by ``cp.async``
  one tile ahead of the dots that read it.

``GLUON`` 5 runs this as a persistent kernel (one program an SM looping over the queries), which
hides each query's start and end behind its neighbours' tiles; 6 overlaps only a program's start
(its Q and first tile copied while it counts its entries).

Same math, inputs and outputs as the Triton forward (the sink and window folded in, the
natural-log LSE saved for the backward); one fixed tiling: 64 heads, 64 entries a tile, 8 warps.
CSA rows come compacted (``kernels.sparse_attention._compact_picks``: each row's picks first, -1
after), so a query's picks end at its first -1 here.
Gluon has no interpreter mode, so this form runs on sm_90 GPUs only; its parity tests run there.
"""

import functools
import math

import torch
from torch import Tensor
import triton
from kernels.host_math import cdiv, next_pow2
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

# The one tiling this form compiles (the warpgroup layout below is written for it).
BLOCK_H = 64
TILE_K = 64
NUM_WARPS = 8
# GLUON's values: 1 each tile's dots and softmax in turn; 2 the same with per-thread partial sums of
# P (no cross-warpgroup sum a tile); 3 as 1 with a tile's softmax overlapping the previous tile's
# second dot (see the kernel); 4 as 2 from two separately allocated ring slots, two tiles an
# iteration, which spares two of its six CTA barriers a tile (_attend_from_slot). Partial sums and
# the overlap together crash Triton 3.6's ptxas (offline sm_90, error code -11; CUDA 13.0's compiles
# them); 5 as 2 in a persistent program an SM that
# copies each work item's Q and first tile in while the previous item finishes; 6 as 4 with its
# start overlapped (Q and the first tile copied asynchronously while the picks are counted).
MODES = (1, 2, 3, 4, 5, 6)
_CSA_RATIO = gl.constexpr(4)
_LOG2E = gl.constexpr(math.log2(math.e))
_LN2 = gl.constexpr(math.log(2.0))
# Triton 3.6 names the CTA-wide barrier thread_barrier; later versions call it barrier.
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# [rows, 512] tiles moved 16 bytes a thread (Q, entry tiles, the output), and a query's picks.
_ROWS_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0]))
_SLOTS_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [8], [0]))


@gluon.constexpr_function
def _split_over_warpgroups(n):
    """The warpgroup-MMA layout of both dots' [64, n] results: each warpgroup takes n / 2 columns."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, n // 2, 16])


@gluon.jit
def _q_offsets(s, head0, b, S, H, BLOCK: gl.constexpr, D: gl.constexpr, rows_layout: gl.constexpr):
    """Offsets of the [BLOCK, D] rows of heads head0.. of query (b, s) in q and o."""
    q_rows = head0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, rows_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, rows_layout))
    return ((b * S + s).to(gl.int64) * H + q_rows)[:, None] * D + cols[None, :]


@gluon.jit
def _issue_gather(buffer, kv_ptr, kvc_ptr, idx_ptr, p0, s, b, S, SC, TOPK, WINDOW, n_pos,
                  RATIO: gl.constexpr, TILE: gl.constexpr, D: gl.constexpr, rows_layout: gl.constexpr,
                  CHECK_PICKS: gl.constexpr = False):
    """Start copying the entries at positions ``p0 .. p0 + TILE`` of query (b, s) into ``buffer``
    (window positions from kv, the rest from kv_compressed; rows past ``n_pos`` copy the query's
    own kv row, which the logits mask) as one cp.async group. With CHECK_PICKS, ``n_pos`` may
    count picks past the first -1 (``_entry_bound``): -1 picks copy the query's own row too."""
    pos = p0 + gl.arange(0, TILE, layout=gl.SliceLayout(1, rows_layout))
    n_win = gl.minimum(s + 1, WINDOW)
    valid = pos < n_pos
    in_win = valid & (pos < n_win)
    in_comp = valid & (pos >= n_win)
    c = pos - n_win
    if RATIO == _CSA_RATIO:
        t = gl.load(idx_ptr + (b * S + s).to(gl.int64) * TOPK + c, mask=in_comp, other=0)
        if CHECK_PICKS:
            in_comp = in_comp & (t >= 0)
    else:
        t = c
    kv_row = (b * S + gl.where(in_win, s + 1 - n_win + pos, s)).to(gl.int64)
    c_row = (b * SC + t).to(gl.int64)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, rows_layout))
    rows = gl.where(in_comp, kvc_ptr + c_row * D, kv_ptr + kv_row * D)
    async_copy.async_copy_global_to_shared(buffer, rows[:, None] + cols[None, :])
    async_copy.commit_group()


@gluon.jit
def _read_picks(idx_ptr, b, s, S, TOPK, RATIO: gl.constexpr, TOPK_BLOCK: gl.constexpr, slots_layout: gl.constexpr):
    """CSA query s's compacted index row (-1 past TOPK), loaded apart from ``_entry_count`` so
    that a kernel can read it ahead of the count."""
    slots = gl.arange(0, TOPK_BLOCK, layout=slots_layout)
    return gl.load(idx_ptr + (b * S + s).to(gl.int64) * TOPK + slots, mask=slots < TOPK, other=-1)


@gluon.jit
def _entry_count(s, TOPK, WINDOW, picks, RATIO: gl.constexpr, TOPK_BLOCK: gl.constexpr, slots_layout: gl.constexpr):
    """Entry positions of query s (as ``kernels.sparse_attention._entry_count``): its window, then
    its compressed slots up to the first -1 of its compacted row ``picks`` (CSA; ``_read_picks``,
    else unused) or every closed group (HCA)."""
    n = gl.minimum(s + 1, WINDOW)
    if RATIO == _CSA_RATIO:
        slots = gl.arange(0, TOPK_BLOCK, layout=slots_layout)
        n += gl.min(gl.where(picks < 0, slots, TOPK), axis=0)
    elif RATIO != 0:
        n += (s + 1) // RATIO
    return n


@gluon.jit
def _entry_bound(s, TOPK, WINDOW, RATIO: gl.constexpr):
    """At least query s's entry count (``_entry_count``) without reading its picks: every slot
    counted, up to the first -1 pick or not."""
    n = gl.minimum(s + 1, WINDOW)
    if RATIO == _CSA_RATIO:
        n += TOPK
    elif RATIO != 0:
        n += (s + 1) // RATIO
    return n


@gluon.jit
def _online_softmax(logits, p0, n_pos, m, row_sum, partial, qk_scale, PARTIAL_SUMS: gl.constexpr,
                    TILE: gl.constexpr, s_layout: gl.constexpr):
    """One tile's step of the online softmax (log2 domain): the new running max, the rescale
    factor, P, and the denominator's running parts.

    The row sum of P spans both warpgroups' halves of the tile, so summing it every tile costs a
    cross-warpgroup reduction (shared memory and a barrier). With PARTIAL_SUMS each thread keeps
    its own rescaled sum of P (``partial``, summed across the warpgroups once at the end) and
    ``row_sum`` carries the sink's term alone.
    """
    pos = p0 + gl.arange(0, TILE, layout=gl.SliceLayout(0, s_layout))
    logits = gl.where((pos < n_pos)[None, :], logits * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(logits, axis=1))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(logits - m_new[:, None])
    if PARTIAL_SUMS:
        row_sum = row_sum * alpha
        partial = partial * alpha[:, None] + p
    else:
        row_sum = row_sum * alpha + gl.sum(p, axis=1)
    return m_new, alpha, p, row_sum, partial


@gluon.jit
def _attend_from_slot(q_smem, entries, next_slot, p_smem, kv_ptr, kvc_ptr, idx_ptr, i, n_tiles, s, b, S, SC, TOPK,
                      WINDOW, n_pos, qk_scale, m, row_sum, partial, acc, logits_zero, RATIO: gl.constexpr,
                      TILE: gl.constexpr, D: gl.constexpr, rows_layout: gl.constexpr, s_layout: gl.constexpr,
                      o_layout: gl.constexpr):
    """Tile i (in ``entries``) in turn with partial sums, tile i + 1's gather started into
    ``next_slot``. The slots are separate allocations, so Triton's barrier analysis sees that the
    gather does not write what the first dot reads; the wait needs no barrier of its own either:
    Triton puts one after it, before the gather overwrites the slot tile i - 1's second dot read."""
    async_copy.wait_group(0)
    if i + 1 < n_tiles:
        _issue_gather(next_slot, kv_ptr, kvc_ptr, idx_ptr, (i + 1) * TILE, s, b, S, SC, TOPK, WINDOW, n_pos, RATIO,
                      TILE, D, rows_layout)
    logits = warpgroup_mma(q_smem, entries.permute((1, 0)), logits_zero, use_acc=False)
    m, alpha, p, row_sum, partial = _online_softmax(logits, i * TILE, n_pos, m, row_sum, partial, qk_scale, True,
                                                    TILE, s_layout)
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    _cta_barrier()
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    acc = warpgroup_mma(p_smem, entries, acc)
    return m, row_sum, partial, acc


@gluon.jit
def _sparse_attn_fwd_sm90_kernel(
    q_ptr, kv_ptr, kvc_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr,
    S, H, SC, TOPK, WINDOW, qk_scale,
    RATIO: gl.constexpr, TOPK_BLOCK: gl.constexpr, BLOCK: gl.constexpr, TILE: gl.constexpr, D: gl.constexpr,
    PARTIAL_SUMS: gl.constexpr, OVERLAP: gl.constexpr, STATIC_SLOTS: gl.constexpr, EARLY_START: gl.constexpr,
    LATE_FIRST: gl.constexpr,
):
    """EARLY_START (with STATIC_SLOTS): Q and the first tile are copied asynchronously, the tile
    up to the entry bound (as GLUON 5 starts its items), while the picks are counted: the
    program's start then waits on memory once, not three times in a row. OVERLAP: tile i + 1's
    logits and softmax run while tile i's second dot is in flight (both dots issued
    asynchronously, the logits first, so that waiting for them leaves the second dot running),
    with two P tiles; else each tile's dots and softmax in turn, from a two-slot ring or, with
    STATIC_SLOTS, from two slots allocated apart, two tiles a loop (``_attend_from_slot``)."""
    rows_layout: gl.constexpr = _ROWS_LAYOUT
    slots_layout: gl.constexpr = _SLOTS_LAYOUT
    s_layout: gl.constexpr = _split_over_warpgroups(TILE)
    o_layout: gl.constexpr = _split_over_warpgroups(D)
    s = S - 1 - gl.program_id(0) if LATE_FIRST else gl.program_id(0)
    b = gl.program_id(2)
    head0 = gl.program_id(1) * BLOCK

    offsets = _q_offsets(s, head0, b, S, H, BLOCK, D, rows_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK, D], gl.bfloat16))
    if EARLY_START:
        # Mode 6's slots come before its first copies; mode 4 allocates them after its entry count
        # (allocated here, it compiles to 255 registers against 248: offline sm_90, Flash CSA).
        slot_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16)
        slot_a = gl.allocate_shared_memory(gl.bfloat16, [TILE, D], slot_layout)
        slot_b = gl.allocate_shared_memory(gl.bfloat16, [TILE, D], slot_layout)
        _issue_item_start(q_smem, slot_a, q_ptr, kv_ptr, kvc_ptr, idx_ptr, s, gl.program_id(1), b, S, H, SC, TOPK,
                          WINDOW, RATIO, BLOCK, TILE, D, rows_layout)
    else:
        q_smem.store(gl.load(q_ptr + offsets))
    if not STATIC_SLOTS:
        e_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TILE, D],
                                           gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16))
    p_ring = gl.allocate_shared_memory(gl.bfloat16, [2 if OVERLAP else 1, BLOCK, TILE],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK, TILE], gl.bfloat16))

    picks = _read_picks(idx_ptr, b, s, S, TOPK, RATIO, TOPK_BLOCK, slots_layout) if RATIO == _CSA_RATIO else 0
    n_pos = _entry_count(s, TOPK, WINDOW, picks, RATIO, TOPK_BLOCK, slots_layout)
    if not STATIC_SLOTS:
        _issue_gather(e_ring.index(0), kv_ptr, kvc_ptr, idx_ptr, 0, s, b, S, SC, TOPK, WINDOW, n_pos, RATIO, TILE, D,
                      rows_layout)
    # log2-domain running max and denominator, started from the sink: exp2(sink - m) = 1.
    heads = head0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, s_layout))
    m = gl.load(sink_ptr + heads) * _LOG2E
    row_sum = gl.full([BLOCK], 1.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    partial = gl.zeros([BLOCK, TILE], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK, D], gl.float32, layout=o_layout)
    logits_zero = gl.zeros([BLOCK, TILE], gl.float32, layout=s_layout)
    n_tiles = gl.cdiv(n_pos, TILE)
    if STATIC_SLOTS:
        # Two tiles an iteration, from two separately allocated slots (see _attend_from_slot).
        if not EARLY_START:
            slot_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16)
            slot_a = gl.allocate_shared_memory(gl.bfloat16, [TILE, D], slot_layout)
            slot_b = gl.allocate_shared_memory(gl.bfloat16, [TILE, D], slot_layout)
            _issue_gather(slot_a, kv_ptr, kvc_ptr, idx_ptr, 0, s, b, S, SC, TOPK, WINDOW, n_pos, RATIO, TILE, D,
                          rows_layout)
        for i in range(0, n_tiles, 2):
            m, row_sum, partial, acc = _attend_from_slot(
                q_smem, slot_a, slot_b, p_ring.index(0), kv_ptr, kvc_ptr, idx_ptr, i, n_tiles, s, b, S, SC, TOPK,
                WINDOW, n_pos, qk_scale, m, row_sum, partial, acc, logits_zero, RATIO, TILE, D, rows_layout, s_layout,
                o_layout)
            if i + 1 < n_tiles:
                m, row_sum, partial, acc = _attend_from_slot(
                    q_smem, slot_b, slot_a, p_ring.index(0), kv_ptr, kvc_ptr, idx_ptr, i + 1, n_tiles, s, b, S, SC,
                    TOPK, WINDOW, n_pos, qk_scale, m, row_sum, partial, acc, logits_zero, RATIO, TILE, D, rows_layout,
                    s_layout, o_layout)
    elif OVERLAP:
        # Tile 0's logits and P, then per tile i: wait for tile i + 1's entries, issue its logits
        # and tile i's second dot, run its softmax while that dot runs, rescale once it is done.
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
        if n_tiles > 1:
            _issue_gather(e_ring.index(1), kv_ptr, kvc_ptr, idx_ptr, TILE, s, b, S, SC, TOPK, WINDOW, n_pos, RATIO,
                          TILE, D, rows_layout)
        logits = warpgroup_mma(q_smem, e_ring.index(0).permute((1, 0)), logits_zero, use_acc=False)
        m, alpha, p, row_sum, partial = _online_softmax(logits, 0, n_pos, m, row_sum, partial, qk_scale,
                                                        PARTIAL_SUMS, TILE, s_layout)
        p_ring.index(0).store(p.to(gl.bfloat16))
        fence_async_shared()
        for i in range(n_tiles - 1):
            # Every thread's tile i + 1 has landed and its P of tile i is stored.
            async_copy.wait_group(0)
            fence_async_shared()
            _cta_barrier()
            logits = warpgroup_mma(q_smem, e_ring.index((i + 1) % 2).permute((1, 0)), logits_zero, use_acc=False,
                                   is_async=True)
            acc = warpgroup_mma(p_ring.index(i % 2), e_ring.index(i % 2), acc, is_async=True)
            logits = warpgroup_mma_wait(num_outstanding=1, deps=(logits,))
            m, alpha, p, row_sum, partial = _online_softmax(logits, (i + 1) * TILE, n_pos, m, row_sum, partial,
                                                            qk_scale, PARTIAL_SUMS, TILE, s_layout)
            p_ring.index((i + 1) % 2).store(p.to(gl.bfloat16))
            fence_async_shared()
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            # Every warp is past tile i's second dot: its ring slot takes tile i + 2.
            _cta_barrier()
            if i + 2 < n_tiles:
                _issue_gather(e_ring.index(i % 2), kv_ptr, kvc_ptr, idx_ptr, (i + 2) * TILE, s, b, S, SC, TOPK,
                              WINDOW, n_pos, RATIO, TILE, D, rows_layout)
        _cta_barrier()
        last = (n_tiles - 1) % 2
        acc = warpgroup_mma(p_ring.index(last), e_ring.index(last), acc)
    else:
        # _attend_from_slot's steps written out for the ring, with a fenced wait and each slice
        # taken where it is used (taken up front, as arguments, they compile to a different
        # schedule from the one its sweeps measured).
        for i in range(n_tiles):
            # Tile i has landed (this thread's copies; the barrier makes every thread's visible),
            # and every warp is past tile i - 1's second dot, so its ring slot and P tile are free.
            async_copy.wait_group(0)
            fence_async_shared()
            _cta_barrier()
            if i + 1 < n_tiles:
                _issue_gather(e_ring.index((i + 1) % 2), kv_ptr, kvc_ptr, idx_ptr, (i + 1) * TILE, s, b, S, SC,
                              TOPK, WINDOW, n_pos, RATIO, TILE, D, rows_layout)
            entries = e_ring.index(i % 2)
            logits = warpgroup_mma(q_smem, entries.permute((1, 0)), logits_zero, use_acc=False)
            m, alpha, p, row_sum, partial = _online_softmax(logits, i * TILE, n_pos, m, row_sum, partial, qk_scale,
                                                            PARTIAL_SUMS, TILE, s_layout)
            p_ring.index(0).store(p.to(gl.bfloat16))
            fence_async_shared()
            _cta_barrier()
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            acc = warpgroup_mma(p_ring.index(0), entries, acc)
    denom = row_sum + gl.sum(partial, axis=1) if PARTIAL_SUMS else row_sum
    out = acc / gl.convert_layout(denom, gl.SliceLayout(1, o_layout))[:, None]
    gl.store(o_ptr + offsets, gl.convert_layout(out.to(gl.bfloat16), rows_layout))
    gl.store(lse_ptr + (b * S + s).to(gl.int64) * H + heads, (m + gl.log2(denom)) * _LN2)


@gluon.jit
def _work_item(item, B, n_head_blocks, S, LATE_FIRST: gl.constexpr):
    """(query, head block, batch) of persistent work item ``item``: queries major, so that
    consecutive items cost about the same; the last query's first where LATE_FIRST."""
    rank = item // n_head_blocks
    s = rank // B
    return S - 1 - s if LATE_FIRST else s, item % n_head_blocks, rank % B


@gluon.jit
def _issue_item_start(q_smem, slot, q_ptr, kv_ptr, kvc_ptr, idx_ptr, s, head_block, b, S, H, SC, TOPK, WINDOW,
                      RATIO: gl.constexpr, BLOCK: gl.constexpr, TILE: gl.constexpr, D: gl.constexpr,
                      rows_layout: gl.constexpr):
    """Start copying an item's Q block and first entry tile (one cp.async group); the tile is
    gathered before the entry count is known, up to ``_entry_bound``."""
    async_copy.async_copy_global_to_shared(q_smem, q_ptr + _q_offsets(s, head_block * BLOCK, b, S, H, BLOCK, D,
                                                                       rows_layout))
    _issue_gather(slot, kv_ptr, kvc_ptr, idx_ptr, 0, s, b, S, SC, TOPK, WINDOW, _entry_bound(s, TOPK, WINDOW, RATIO),
                  RATIO, TILE, D, rows_layout, CHECK_PICKS=True)


@gluon.jit
def _ring_tile_softmax(q_smem, e_ring, p_smem, kv_ptr, kvc_ptr, idx_ptr, i, slot, s, b, S, SC, TOPK, WINDOW, n_pos,
                       qk_scale, m, row_sum, partial, logits_zero, GATHER_NEXT: gl.constexpr, RATIO: gl.constexpr,
                       TILE: gl.constexpr, D: gl.constexpr, rows_layout: gl.constexpr, s_layout: gl.constexpr):
    """GLUON 5's tile i (in ring slot ``slot``) up to P in shared memory, tile i + 1's gather
    started into the other slot where GATHER_NEXT; ends with every warp past its first dot."""
    # Tile i (and, first, the item's Q) has landed; as in _attend_from_slot, Triton puts a CTA
    # barrier after the wait, past which every warp is done with tile i - 1's second dot (or the
    # previous item's staged output), so the other slot is free.
    async_copy.wait_group(0)
    if GATHER_NEXT:
        _issue_gather(e_ring.index(1 - slot), kv_ptr, kvc_ptr, idx_ptr, (i + 1) * TILE, s, b, S, SC, TOPK, WINDOW,
                      n_pos, RATIO, TILE, D, rows_layout)
    logits = warpgroup_mma(q_smem, e_ring.index(slot).permute((1, 0)), logits_zero, use_acc=False)
    m, alpha, p, row_sum, partial = _online_softmax(logits, i * TILE, n_pos, m, row_sum, partial, qk_scale, True,
                                                    TILE, s_layout)
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    _cta_barrier()
    return m, alpha, row_sum, partial


@gluon.jit
def _sparse_attn_fwd_sm90_persistent_kernel(
    q_ptr, kv_ptr, kvc_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr,
    B, S, H, SC, TOPK, WINDOW, qk_scale,
    RATIO: gl.constexpr, TOPK_BLOCK: gl.constexpr, BLOCK: gl.constexpr, TILE: gl.constexpr, D: gl.constexpr,
    LATE_FIRST: gl.constexpr,
):
    """GLUON 5: mode 2 (in turn, partial sums, two-slot ring) in one program per SM that loops
    over the (query, head block, batch) items. With one 200 KiB program an SM, each program of the
    other modes pays its Q load, entry count, first gather and output store with nothing to hide
    them (about 6 us a program on the H200 where a 64-entry tile takes about 2.3).
    Here an item's Q and first tile are copied in during the previous item's last tile, once its
    first dot has read Q, and its output is staged through the freed ring slot. The last tile is
    written out of the tile loop so that the next item's coordinates are not live in it."""
    rows_layout: gl.constexpr = _ROWS_LAYOUT
    slots_layout: gl.constexpr = _SLOTS_LAYOUT
    s_layout: gl.constexpr = _split_over_warpgroups(TILE)
    o_layout: gl.constexpr = _split_over_warpgroups(D)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK, D], gl.bfloat16))
    e_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TILE, D],
                                       gl.NVMMASharedLayout.get_default_for([TILE, D], gl.bfloat16))
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, TILE],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK, TILE], gl.bfloat16))
    logits_zero = gl.zeros([BLOCK, TILE], gl.float32, layout=s_layout)
    n_head_blocks = H // BLOCK
    n_items = S * n_head_blocks * B

    s, head_block, b = _work_item(gl.program_id(0), B, n_head_blocks, S, LATE_FIRST)
    _issue_item_start(q_smem, e_ring.index(0), q_ptr, kv_ptr, kvc_ptr, idx_ptr, s, head_block, b, S, H, SC, TOPK,
                      WINDOW, RATIO, BLOCK, TILE, D, rows_layout)
    picks = _read_picks(idx_ptr, b, s, S, TOPK, RATIO, TOPK_BLOCK, slots_layout) if RATIO == _CSA_RATIO else 0
    n_pos = _entry_count(s, TOPK, WINDOW, picks, RATIO, TOPK_BLOCK, slots_layout)
    slot = 0  # the ring slot of the item's first tile; tiles alternate slots across items
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        heads = head_block * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, s_layout))
        m = gl.load(sink_ptr + heads) * _LOG2E
        row_sum = gl.full([BLOCK], 1.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
        partial = gl.zeros([BLOCK, TILE], gl.float32, layout=s_layout)
        acc = gl.zeros([BLOCK, D], gl.float32, layout=o_layout)
        n_tiles = gl.cdiv(n_pos, TILE)
        for i in range(n_tiles - 1):
            m, alpha, row_sum, partial = _ring_tile_softmax(
                q_smem, e_ring, p_smem, kv_ptr, kvc_ptr, idx_ptr, i, (slot + i) % 2, s, b, S, SC, TOPK, WINDOW, n_pos,
                qk_scale, m, row_sum, partial, logits_zero, True, RATIO, TILE, D, rows_layout, s_layout)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            acc = warpgroup_mma(p_smem, e_ring.index((slot + i) % 2), acc)
        last = (slot + n_tiles - 1) % 2
        m, alpha, row_sum, partial = _ring_tile_softmax(
            q_smem, e_ring, p_smem, kv_ptr, kvc_ptr, idx_ptr, n_tiles - 1, last, s, b, S, SC, TOPK, WINDOW, n_pos,
            qk_scale, m, row_sum, partial, logits_zero, False, RATIO, TILE, D, rows_layout, s_layout)
        # Every warp is past the first dot: Q and the other slot take the next item's.
        next_item = item + gl.num_programs(0)
        s_next, head_block_next, b_next = _work_item(gl.minimum(next_item, n_items - 1), B, n_head_blocks, S,
                                                     LATE_FIRST)
        if next_item < n_items:
            _issue_item_start(q_smem, e_ring.index(1 - last), q_ptr, kv_ptr, kvc_ptr, idx_ptr, s_next, head_block_next,
                              b_next, S, H, SC, TOPK, WINDOW, RATIO, BLOCK, TILE, D, rows_layout)
        # The next item's picks load during the second dot; its count is taken after it.
        if RATIO == _CSA_RATIO:
            picks = _read_picks(idx_ptr, b_next, s_next, S, TOPK, RATIO, TOPK_BLOCK, slots_layout)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(p_smem, e_ring.index(last), acc)
        n_pos_next = _entry_count(s_next, TOPK, WINDOW, picks, RATIO, TOPK_BLOCK, slots_layout)
        denom = row_sum + gl.sum(partial, axis=1)
        out = acc / gl.convert_layout(denom, gl.SliceLayout(1, o_layout))[:, None]
        # Every warp is past the last second dot: its slot stages the output.
        _cta_barrier()
        e_ring.index(last).store(out.to(gl.bfloat16))
        _cta_barrier()
        gl.store(o_ptr + _q_offsets(s, head_block * BLOCK, b, S, H, BLOCK, D, rows_layout),
                 e_ring.index(last).load(rows_layout))
        gl.store(lse_ptr + (b * S + s).to(gl.int64) * H + heads, (m + gl.log2(denom)) * _LN2)
        s, head_block, b, n_pos, slot = s_next, head_block_next, b_next, n_pos_next, 1 - last


def fits(config: dict, heads: int) -> str | None:
    """Why ``config`` cannot run this form at ``heads`` (None when it can)."""
    fixed = {"BLOCK_H": BLOCK_H, "TILE_K": TILE_K, "num_warps": NUM_WARPS}
    wrong = [f"{name} {config.get(name)!r} (it needs {value})" for name, value in fixed.items()
             if config.get(name) != value]
    wrong += [f"{name} {config[name]!r} (it needs 0)" for name in ("TAIL_K", "RESCALE_SLACK", "UNCHAINED")
              if config.get(name)]
    if config.get("GLUON") not in MODES:
        wrong.append(f"GLUON {config.get('GLUON')!r} (it is one of {', '.join(map(str, MODES))})")
    if heads % BLOCK_H:
        wrong.append(f"heads {heads} (it needs a multiple of {BLOCK_H})")
    return "; ".join(wrong) or None


def launch_forward(q: Tensor, kv: Tensor, kvc: Tensor, indices: Tensor, sink: Tensor, o: Tensor, lse: Tensor,
                   n_comp: int, topk: int, ratio: int, window: int, qk_scale: float, mode: int, late_first: bool,
                   compile_only: bool) -> None:
    """Fill ``o`` and ``lse`` (``kernels.sparse_attention._forward``'s buffers) on an sm_90 GPU in
    GLUON ``mode`` (see MODES), the last queries' programs first where ``late_first``."""
    batch, seq, heads, dim = q.shape
    constexprs = {"RATIO": ratio, "TOPK_BLOCK": next_pow2(max(topk, 1)), "BLOCK": BLOCK_H,
                  "TILE": TILE_K, "D": dim, "LATE_FIRST": late_first, "num_warps": NUM_WARPS}
    if mode == 5:
        kernel = _sparse_attn_fwd_sm90_persistent_kernel
        grid = (max(1, min(seq * (heads // BLOCK_H) * batch, _sm_count(q.device))),)
        args = (q, kv, kvc, indices, sink, o, lse, batch, seq, heads, n_comp, topk, window, qk_scale)
    else:
        kernel = _sparse_attn_fwd_sm90_kernel
        grid = (seq, heads // BLOCK_H, batch)
        args = (q, kv, kvc, indices, sink, o, lse, seq, heads, n_comp, topk, window, qk_scale)
        constexprs |= {"PARTIAL_SUMS": mode in (2, 4, 6), "OVERLAP": mode == 3, "STATIC_SLOTS": mode in (4, 6),
                       "EARLY_START": mode == 6}
    if compile_only:
        kernel.warmup(*args, grid=grid, **constexprs)
    elif seq and batch:
        kernel[grid](*args, **constexprs)


@functools.cache
def _sm_count(device: torch.device) -> int:
    """The persistent kernel's program count: one 200 KiB program fits an SM (off a GPU, where
    the kernel is only compiled, one)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1

