"""DeepSeek-V4 lightning indexer: causal index scores of the compressed entries, then their top-k.

Per query s and compressed entry t, with indexer queries ``q [B, S, H, D]``, compressed
keys ``k [B, S // r, D]`` (the indexer compressor's output) and head weights ``w [B, S, H]``::

    I[s, t] = sum_h w[s, h] * ReLU(q[s, h] . k[t])       for t < (s + 1) // r, else absent

then the ``topk`` valid entries of each query with the largest I (V4: H = 64, D = 128,
r = 4, topk 512 on Flash and 1024 on Pro). A BF16 proxy of the reference: no Hadamard
rotation and no FP8/FP4 simulation. The indexer's gradient path is frozen here, as
Primus freezes it to measure its kernels: the outputs carry no gradient, and there is no
backward.

Two launches (one with ``SELECT_IN_SCORING``), tuned together as ``indexer_fwd``:

* Scoring (the heavy part). A program takes ``BLOCK_S`` queries of one batch element
  (latest queries first: they see the most entries) and walks the key tiles of
  ``BLOCK_T`` entries they can see: all of them, or with ``KEY_TILES`` > 0 that many, the
  key range being a second grid axis. Scores of different entries share no sum, so
  splitting the range costs nothing but the key tile's reload; it multiplies the programs
  (a one-axis grid at S = 4,096 and 16 queries a program is 256 programs of unequal,
  causal length on 132 SMs). Per key tile it loops over the heads ``BLOCK_H`` at a
  time: one ``tl.dot`` of the ``[BLOCK_S * BLOCK_H, D]`` (query, head) rows against the
  tile, ReLU and the w weighting in registers, and a sum over the heads into a
  ``[BLOCK_S, BLOCK_T]`` fp32 accumulator; or, with ``LATE_HEAD_SUM``, into a
  ``[BLOCK_S * BLOCK_H, BLOCK_T]`` one whose heads are summed once per key tile (no
  cross-lane sums in the head loop, for BLOCK_H times the registers; the H200 sweeps of
  2026-12-02 chose it at every shape). ``KEY_ROWS`` turns the dot around: the key tile's rows
  against the (query, head) rows as its columns, so a query's heads, adjacent columns, are summed
  inside a warp (within each thread, then across lanes) instead of across the warps that hold the
  (query, head) rows; the tile is stored transposed. With ``BLOCK_H`` covering every head, the
  block's q rows are loaded once per program instead of once per key tile (with (query, head)
  rows, 1.5x slower on the H200, the head sum crossing warps at every key tile).
  ``TMA`` loads the q and key tiles through TMA descriptors: one instruction a tile instead of
  per-element addresses (the sm_90 head loop compiles to 214 instructions instead of 255 at 64
  queries x 256 keys on 8 warps, Triton 3.6; on the H200, 14-15% faster at each
  shape's best one-head tiling): ``TMA`` 1 encodes them on the host (37-46 us a call at
  S = 4,096 on the H200), ``TMA`` 2 has each program build them (4-9% more device
  time there).
  ``HEAD_SPLITS`` > 1 spreads the heads over that many programs (a third grid axis), each storing
  its heads' share into its own fp32 buffer, which the selection sums in split order (so the
  result does not depend on which program ran first): at S = 4,096 a grid of 64-query blocks of
  one 128-entry key tile is about 290 programs for the 264 that two 4-warp programs an SM hold
  at once, so a second wave runs nearly empty; halved programs fill it (measured on the H200:
  no gain, the best split config 1.00-1.16x the best unsplit one). The causal mask is
  computed inline from the indices; only visible scores are stored, into fp32 ``[HEAD_SPLITS, B,
  S, S // r]`` buffers (the rest is never written or read). ``GLUON`` 1 runs the scoring as the
  sm_90 Gluon kernel of ``kernels.indexer_sm90`` instead (asynchronous warpgroup MMAs, each
  head's epilogue under the next head's dot; fixed tilings).
* Selection, in Triton. A program holds ``SELECT_ROWS`` score rows (``next_pow2(S // r)``
  values each) in registers, maps every score to an order-preserving uint32 key (-0.0 and
  +0.0 as one) and finds the k-th largest key exactly, a bit at a time from the top (at
  most 32 counting passes; a row stops once exactly k keys lie at or above its threshold,
  so the passes depend on how close its scores are), or with ``SELECT_INTERP`` by
  interpolating the counts between the ends of a bracket (about 6 passes a row on V4-scale
  and on the bench's integer scores, against 15-19: docs/findings.md, Indexer;
  each pass after the fourth also takes the nearest keys to the candidate, two more
  reductions); the entries above it and, of those equal to it, the lowest indices fill the k slots,
  compacted by prefix sums. So ties go to the lower index, and the output lists each
  query's picks in ascending index order (not by score). Queries with fewer than topk
  visible entries take all of them, padded with index -1 (score -inf). A program whose rows
  all see at most a half or a quarter of the padded row works on that much, and one whose
  rows all take every entry they see stores them straight (no threshold, no prefix sum).
  ``SELECT_IN_SCORING`` runs it in the scoring programs instead, each on its own rows once it has
  stored them (whole rows: every key tile and head in one program), ``SELECT_ROWS`` at a time on
  the scoring's warps: no selection launch, and its passes run beside other programs' dots.

Floor to compare against: the causal scoring's FLOPs, ``2 * B * H * D * sum_s min((s + 1)
// r, S // r)``, at the bf16 tensor-core peak (``flops``): 137 GFLOP at S = 8192, about
140 us on an H200 (989 TFLOP/s dense), against about 35-45 us for the bytes that must
move (``bytes_moved``: q, k, w read, indices and scores written) at 4.8 TB/s. So the
scoring is compute-bound; the fp32 score buffer (its visible half, about 34 MB at S =
8192, written and read once) is an implementation cost the floor does not include.

Error bounds: products of bf16 values are exact in fp32, so scores differ from a fp32
reference only by summation order, about 1e-6 of ``sum_h |w| |q . k|``. The selection is
exact for the scores it is given; where two entries' reference scores lie within that
error of each other at the k-th place, the kernel may pick the other one (so parity checks
compare index sets by their reference scores). The registered launch's inputs are small
integers, whose scores are exact in fp32 in any order, so there indices and scores must
match the reference exactly, tie rule included.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import indexer_sm90
from kernels.arch import INTERPRETER_ARCH, current_arch
from kernels.contracts import check_same_device
from kernels.host_math import cdiv, next_pow2
from kernels.launch import check_gluon, ensure_scratch_allocator, launch, tma_usable
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

INDEX_HEADS = 64
INDEX_DIM = 128
INDEX_RATIO = 4
_BF16_BYTES = 2
_FP32_BYTES = 4
_INDEX_BYTES = 4


@triton.jit
def _mma(a, b, UPCAST: tl.constexpr):
    """``a @ b`` in fp32; UPCAST gives the dot fp32 operands (Triton 3.9's CPU interpreter multiplies
    bf16 operands as their raw uint16 bits)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b)


@triton.jit
def _query_rows(q_ref, w_ptr, batch, seq, heads, dim, s0, row_query, row_head, h0, dims, dim_mask,
                BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, DIM_PAD: tl.constexpr, TMA: tl.constexpr):
    """The ``[BLOCK_S * BLOCK_H, DIM_PAD]`` q rows of the block's queries at heads ``h0 + row_head``, and
    their fp32 head weights (zeros past the sequence or the heads).

    With TMA, ``q_ref`` is a descriptor (``_score_operands``): for one head a dot, over
    ``[B * S, H * D]`` with a ``[BLOCK_S, DIM_PAD]`` box at the head's columns; else over
    ``[B, S, H, D]`` seen as ``[B * S, H, D]`` with a ``[BLOCK_S, BLOCK_H, DIM_PAD]`` box (heads past H
    come back as zeros). Rows past the sequence come back as the next batch element's (or zeros),
    and columns past D as the next head's (or zeros): their w is 0 and k's columns past D are
    zeros, so they add nothing.
    """
    head = h0 + row_head
    row_mask = (row_query < seq) & (head < heads)
    q_rows = ((batch * seq + row_query) * heads + head).to(tl.int64)
    if TMA:
        if BLOCK_H == 1:
            q = q_ref.load([batch * seq + s0, h0 * dim])
        else:
            q = q_ref.load([batch * seq + s0, h0, 0]).reshape([BLOCK_S * BLOCK_H, DIM_PAD])
    else:
        q = tl.load(q_ref + q_rows[:, None] * dim + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :],
                    other=0.0)
    return q, tl.load(w_ptr + q_rows, mask=row_mask, other=0.0).to(tl.float32)


@triton.jit
def _device_descriptors(q_ptr, k_ptr, batches, seq, n_keys, heads, dim, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_T: tl.constexpr, DIM_PAD: tl.constexpr):
    """TMA descriptors over q ``[B, S, H, D]`` and k ``[B, S // r, D]`` with ``_score_operands``'s boxes,
    built on the device (TMA 2)."""
    if BLOCK_H == 1:
        q_desc = tl.make_tensor_descriptor(q_ptr, [batches * seq, heads * dim], [heads * dim, 1], [BLOCK_S, DIM_PAD])
    else:
        q_desc = tl.make_tensor_descriptor(q_ptr, [batches * seq, heads, dim], [heads * dim, dim, 1],
                                           [BLOCK_S, BLOCK_H, DIM_PAD])
    return q_desc, tl.make_tensor_descriptor(k_ptr, [batches * n_keys, dim], [dim, 1], [BLOCK_T, DIM_PAD])


@triton.jit
def _head_sum(x, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, KEY_ROWS: tl.constexpr):
    """``x``'s (query, head) rows, or with KEY_ROWS columns, summed over each query's heads."""
    if KEY_ROWS:
        summed = tl.sum(tl.reshape(x, [BLOCK_T, BLOCK_S, BLOCK_H]), axis=2)
    else:
        summed = tl.sum(tl.reshape(x, [BLOCK_S, BLOCK_H, BLOCK_T]), axis=1)
    return summed


@triton.jit
def _add_head_block(acc, scores, w, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                    LATE_HEAD_SUM: tl.constexpr, KEY_ROWS: tl.constexpr):
    """``acc`` plus one head block's ReLU'd, w-weighted dot result ``scores`` (``[BLOCK_S * BLOCK_H,
    BLOCK_T]``, or ``[BLOCK_T, BLOCK_S * BLOCK_H]`` with KEY_ROWS), its heads summed unless
    LATE_HEAD_SUM keeps the (query, head) rows (or the block is one head)."""
    if KEY_ROWS:
        part = tl.maximum(scores, 0.0) * w[None, :]
    else:
        part = tl.maximum(scores, 0.0) * w[:, None]
    if BLOCK_H == 1 or LATE_HEAD_SUM:
        acc += part
    else:
        acc += _head_sum(part, BLOCK_S, BLOCK_H, BLOCK_T, KEY_ROWS)
    return acc


@triton.jit
def _score_kernel(
    q_ref, k_ref, w_ptr, scores_ptr, seq, n_keys, heads, dim, ratio, split_heads, split_stride,
    indices_ptr, top_ptr, topk, pad_score,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, KEY_TILES: tl.constexpr,
    LATE_HEAD_SUM: tl.constexpr, DIM_PAD: tl.constexpr, UPCAST: tl.constexpr, ONE_HEAD_BLOCK: tl.constexpr,
    TMA: tl.constexpr, KEY_ROWS: tl.constexpr, SELECT_IN_SCORING: tl.constexpr, SELECT_ROWS: tl.constexpr,
    KEYS_PAD: tl.constexpr, KEYS_HALF: tl.constexpr, KEYS_QUARTER: tl.constexpr, TOPK_PAD: tl.constexpr,
    SELECT_INTERP: tl.constexpr,
):
    # This program's heads (``split_heads``, a multiple of BLOCK_H, from the third grid axis's split:
    # a head block never straddles two splits) and its split's partial score buffer.
    head_begin = tl.program_id(2) * split_heads
    head_end = tl.minimum(head_begin + split_heads, heads)
    scores_ptr += tl.program_id(2).to(tl.int64) * split_stride
    query_blocks = tl.cdiv(seq, BLOCK_S)
    batch = tl.program_id(0) // query_blocks
    s0 = (query_blocks - 1 - tl.program_id(0) % query_blocks) * BLOCK_S
    if TMA == 2:  # the descriptors ``_score_operands`` encodes on the host for TMA 1, built here
        q_ref, k_ref = _device_descriptors(q_ref, k_ref, tl.num_programs(0) // query_blocks, seq, n_keys, heads, dim,
                                           BLOCK_S, BLOCK_H, BLOCK_T, DIM_PAD)
    queries = s0 + tl.arange(0, BLOCK_S)
    visible = (queries + 1) // ratio  # entries each query sees
    # (query, head) rows of the dot: BLOCK_H heads of each query, head fastest.
    rows = tl.arange(0, BLOCK_S * BLOCK_H)
    row_query = s0 + rows // BLOCK_H
    row_head = rows % BLOCK_H
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < dim
    end = tl.minimum(s0 + BLOCK_S, seq) // ratio  # entries the block's last query sees
    t_begin = 0
    if KEY_TILES > 0:  # this program's KEY_TILES key tiles (none past ``end``: it exits at once)
        t_begin = tl.program_id(1) * KEY_TILES * BLOCK_T
        end = tl.minimum(end, t_begin + KEY_TILES * BLOCK_T)
    if ONE_HEAD_BLOCK:  # every head in one block: the block's q and w are loaded once, not per key tile
        q_all, w_all = _query_rows(q_ref, w_ptr, batch, seq, heads, dim, s0, row_query, row_head, head_begin,
                                   dims, dim_mask, BLOCK_S, BLOCK_H, DIM_PAD, TMA)
    for t0 in range(t_begin, end, BLOCK_T):
        keys = t0 + tl.arange(0, BLOCK_T)
        if TMA:  # keys past ``end`` come back as later keys or zeros; their scores are not stored
            k = k_ref.load([batch * n_keys + t0, 0])
        else:
            k = tl.load(k_ref + (batch * n_keys + keys).to(tl.int64)[:, None] * dim + dims[None, :],
                        mask=(keys < end)[:, None] & dim_mask[None, :], other=0.0)
        # LATE_HEAD_SUM keeps a (query, head) row accumulator over the head loop and sums its heads
        # once per key tile: BLOCK_H times the registers, none of the cross-lane sums per head block.
        if KEY_ROWS:
            acc = tl.zeros([BLOCK_T, BLOCK_S * BLOCK_H if LATE_HEAD_SUM else BLOCK_S], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_S * BLOCK_H if LATE_HEAD_SUM else BLOCK_S, BLOCK_T], dtype=tl.float32)
        for h0 in range(head_begin, head_end, BLOCK_H):
            if ONE_HEAD_BLOCK:
                q = q_all
                w = w_all
            else:
                q, w = _query_rows(q_ref, w_ptr, batch, seq, heads, dim, s0, row_query, row_head, h0, dims, dim_mask,
                                   BLOCK_S, BLOCK_H, DIM_PAD, TMA)
            if KEY_ROWS:  # keys down the dot's rows, the (query, head) pairs across it
                scores = _mma(k, tl.trans(q), UPCAST)
            else:
                scores = _mma(q, tl.trans(k), UPCAST)
            acc = _add_head_block(acc, scores, w, BLOCK_S, BLOCK_H, BLOCK_T, LATE_HEAD_SUM, KEY_ROWS)
        if LATE_HEAD_SUM and BLOCK_H > 1:
            acc = _head_sum(acc, BLOCK_S, BLOCK_H, BLOCK_T, KEY_ROWS)
        offsets = (batch * seq + queries).to(tl.int64)[:, None] * n_keys + keys[None, :]
        mask = (queries < seq)[:, None] & (keys[None, :] < visible[:, None])
        if KEY_ROWS:
            tl.store(scores_ptr + tl.trans(offsets), acc, mask=tl.trans(mask))
        else:
            tl.store(scores_ptr + offsets, acc, mask=mask)
    if SELECT_IN_SCORING:  # the block's rows are whole (every key tile, every head): pick from them here
        tl.debug_barrier()  # the rows this program stored, visible to all its threads
        for r in range(0, BLOCK_S, SELECT_ROWS):
            local = s0 + r + tl.arange(0, SELECT_ROWS)
            _select_rows(scores_ptr, indices_ptr, top_ptr, batch * seq + local, local < seq, seq, n_keys, ratio, topk,
                         pad_score, split_stride, SELECT_ROWS, KEYS_PAD, KEYS_HALF, KEYS_QUARTER, TOPK_PAD,
                         SELECT_INTERP, 1)


# The interpolating search's schedule (``SELECT_INTERP``): passes that only count before the bracket
# also snaps to the nearest keys (ties at the k-th place end only once the bracket holds one key
# value), and passes before it falls back to halving the bracket (a bound on any row's passes).
_SNAP_AFTER = tl.constexpr(4)
_BISECT_AFTER = tl.constexpr(12)


@triton.jit
def _order_key(x):
    """Order-preserving uint32 keys of fp32 ``x`` (negatives' bits all flipped, the others' sign bit
    set; -0.0 joins +0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(x == 0.0, -2147483648, bits ^ ((bits >> 31) | -2147483648)).to(tl.uint32, bitcast=True)


@triton.jit
def _key_value(key):
    """The fp32 value of an order key (``_order_key``'s inverse; +0.0 for the zeros' key)."""
    bits = key.to(tl.int32, bitcast=True)
    return (bits ^ tl.where(bits < 0, -2147483648, -1)).to(tl.float32, bitcast=True)


@triton.jit
def _bisected_threshold(order, n_visible, want, SELECT_ROWS: tl.constexpr):
    """The want-th largest key of each row, a bit at a time from the top: the threshold takes a bit
    when at least ``want`` keys lie at or above it with the bit set. A row is done once exactly
    ``want`` keys lie at or above its threshold (those are its picks); the loop ends when every row is."""
    thr = tl.zeros([SELECT_ROWS], tl.uint32)
    at_or_above = n_visible
    bit = 31
    while (bit >= 0) & (tl.max((at_or_above != want).to(tl.int32), axis=0) > 0):
        candidate = thr | (tl.full([SELECT_ROWS], 1, tl.uint32) << bit)
        n = tl.sum((order >= candidate[:, None]).to(tl.int32), axis=1)
        enough = n >= want
        thr = tl.where(enough, candidate, thr)
        at_or_above = tl.where(enough, n, at_or_above)
        bit -= 1
    return thr


@triton.jit
def _interpolated_threshold(order, n_visible, want):
    """A threshold with the same picks as ``_bisected_threshold``'s, in fewer counting passes.

    Each row keeps a bracket ``lo < hi`` of keys with at least ``want`` keys at or above lo and fewer
    at or above hi. A pass counts the keys at or above a candidate inside it and moves one end
    there, so the bracket holds whatever the candidate. The candidate interpolates the counts
    linearly in score value between the ends (regula falsi, with the Illinois rule: a kept end's
    residual is halved when it is kept twice running). After ``_SNAP_AFTER`` passes the moved end
    snaps to the nearest key (on integer scores, ties at the k-th place end only when one key value
    remains); after ``_BISECT_AFTER`` the candidate is the midpoint. A row stops when exactly
    ``want`` keys lie at or above lo, or when lo is the want-th largest key itself (``hi == lo + 1``).
    """
    no_key = tl.full(order.shape, -1, tl.int32).to(tl.uint32, bitcast=True)  # above every key
    lo = tl.min(tl.where(order > 0, order, no_key), axis=1).to(tl.int64)  # masked-out keys are 0
    hi = tl.max(order, axis=1).to(tl.int64) + 1
    n_lo = n_visible
    res_lo = (n_visible - want).to(tl.float32)  # count at the end minus want: >= 0 at lo, < 0 at hi
    res_hi = -want.to(tl.float32)
    kept = tl.zeros_like(want)  # the end the last pass moved: 1 lo, -1 hi
    active = (n_lo != want) & (hi - lo > 1)
    step = 0
    while tl.max(active.to(tl.int32), axis=0) > 0:
        value_lo = _key_value(lo.to(tl.uint32))
        value_hi = _key_value((hi - 1).to(tl.uint32))
        share = res_lo / tl.where(active, res_lo - res_hi, 1.0)  # in (0, 1) on active rows
        guess = _order_key(value_lo + (value_hi - value_lo) * share).to(tl.int64)
        if step >= _BISECT_AFTER:
            guess = lo + (hi - lo) // 2
        candidate = tl.minimum(tl.maximum(guess, lo + 1), hi - 1)
        at_or_above = order >= candidate.to(tl.uint32)[:, None]
        n = tl.sum(at_or_above.to(tl.int32), axis=1)
        new_lo = candidate
        new_hi = candidate
        if step >= _SNAP_AFTER:
            new_lo = tl.min(tl.where(at_or_above, order, no_key), axis=1).to(tl.int64)
            new_hi = tl.max(tl.where(at_or_above, tl.zeros_like(order), order), axis=1).to(tl.int64) + 1
        up = active & (n >= want)
        down = active & (n < want)
        res_lo = tl.where(up, (n - want).to(tl.float32), tl.where(down & (kept == -1), 0.5 * res_lo, res_lo))
        res_hi = tl.where(down, (n - want).to(tl.float32), tl.where(up & (kept == 1), 0.5 * res_hi, res_hi))
        lo = tl.where(up, new_lo, lo)
        n_lo = tl.where(up, n, n_lo)
        hi = tl.where(down, new_hi, hi)
        kept = tl.where(up, 1, tl.where(down, -1, kept))
        active = (n_lo != want) & (hi - lo > 1)
        step += 1
    return lo.to(tl.uint32)


@triton.jit
def _pick(scores_ptr, indices_ptr, top_ptr, rows, n_visible, want, n_keys, topk, split_stride,
          SELECT_ROWS: tl.constexpr, KEYS: tl.constexpr, SELECT_INTERP: tl.constexpr, HEAD_SPLITS: tl.constexpr):
    """Writes the picks of ``rows`` (int64), each seeing its first ``n_visible <= KEYS`` scores (the sum
    of the HEAD_SPLITS partial rows, in split order): all of them where every row of the program
    takes all it sees (no threshold to find), else the entries above the threshold and, of those
    equal to it, the lowest indices, compacted in index order by a prefix sum."""
    keys = tl.arange(0, KEYS)
    valid = keys[None, :] < n_visible[:, None]
    offsets = rows[:, None] * n_keys + keys[None, :]
    x = tl.load(scores_ptr + offsets, mask=valid, other=0.0)
    for split in tl.static_range(1, HEAD_SPLITS):
        x += tl.load(scores_ptr + split * split_stride + offsets, mask=valid, other=0.0)
    if tl.max(n_visible - want, axis=0) == 0:  # every row takes all it sees, already in index order
        slots = rows[:, None] * topk + keys[None, :]
        tl.store(indices_ptr + slots, tl.broadcast_to(keys[None, :], [SELECT_ROWS, KEYS]), mask=valid)
        tl.store(top_ptr + slots, x, mask=valid)
    else:
        # Masked-out scores take key 0, below every candidate threshold.
        order = tl.where(valid, _order_key(x), 0)
        if SELECT_INTERP:
            thr = _interpolated_threshold(order, n_visible, want)
        else:
            thr = _bisected_threshold(order, n_visible, want, SELECT_ROWS)
        above = valid & (order > thr[:, None])
        at = valid & (order == thr[:, None])
        room = want - tl.sum(above.to(tl.int32), axis=1)
        chosen = above | at
        # Only where more keys tie at the threshold than there is room do the lowest indices among
        # them take the rest (a prefix sum over the row, which untied scores never need).
        if tl.max(tl.sum(at.to(tl.int32), axis=1) - room, axis=0) > 0:
            chosen = above | (at & (tl.cumsum(at.to(tl.int32), axis=1) <= room[:, None]))
        slots = rows[:, None] * topk + tl.cumsum(chosen.to(tl.int32), axis=1) - 1
        tl.store(indices_ptr + slots, tl.broadcast_to(keys[None, :], [SELECT_ROWS, KEYS]), mask=chosen)
        tl.store(top_ptr + slots, x, mask=chosen)


@triton.jit
def _select_kernel(
    scores_ptr, indices_ptr, top_ptr, n_rows, seq, n_keys, ratio, topk, pad_score, split_stride,
    SELECT_ROWS: tl.constexpr, KEYS_PAD: tl.constexpr, KEYS_HALF: tl.constexpr, KEYS_QUARTER: tl.constexpr,
    TOPK_PAD: tl.constexpr, SELECT_INTERP: tl.constexpr, HEAD_SPLITS: tl.constexpr,
):
    rows = tl.program_id(0) * SELECT_ROWS + tl.arange(0, SELECT_ROWS)
    _select_rows(scores_ptr, indices_ptr, top_ptr, rows, rows < n_rows, seq, n_keys, ratio, topk, pad_score,
                 split_stride, SELECT_ROWS, KEYS_PAD, KEYS_HALF, KEYS_QUARTER, TOPK_PAD, SELECT_INTERP, HEAD_SPLITS)


@triton.jit
def _select_rows(
    scores_ptr, indices_ptr, top_ptr, rows, row_mask, seq, n_keys, ratio, topk, pad_score, split_stride,
    SELECT_ROWS: tl.constexpr, KEYS_PAD: tl.constexpr, KEYS_HALF: tl.constexpr, KEYS_QUARTER: tl.constexpr,
    TOPK_PAD: tl.constexpr, SELECT_INTERP: tl.constexpr, HEAD_SPLITS: tl.constexpr,
):
    """The picks and padding of score rows ``rows`` (of ``[B * S]``; ``row_mask`` the real ones)."""
    n_visible = tl.where(row_mask, tl.minimum((rows % seq + 1) // ratio, n_keys), 0)
    want = tl.minimum(n_visible, topk)
    rows = rows.to(tl.int64)
    # A causal row sees a prefix of the padded row: programs whose rows all fit in a half or a
    # quarter of it work on that much (the early half of the queries, at every length).
    widest = tl.max(n_visible, axis=0)
    if widest <= KEYS_QUARTER:
        _pick(scores_ptr, indices_ptr, top_ptr, rows, n_visible, want, n_keys, topk, split_stride, SELECT_ROWS,
              KEYS_QUARTER, SELECT_INTERP, HEAD_SPLITS)
    elif widest <= KEYS_HALF:
        _pick(scores_ptr, indices_ptr, top_ptr, rows, n_visible, want, n_keys, topk, split_stride, SELECT_ROWS,
              KEYS_HALF, SELECT_INTERP, HEAD_SPLITS)
    else:
        _pick(scores_ptr, indices_ptr, top_ptr, rows, n_visible, want, n_keys, topk, split_stride, SELECT_ROWS,
              KEYS_PAD, SELECT_INTERP, HEAD_SPLITS)
    pads = tl.arange(0, TOPK_PAD)
    pad_mask = row_mask[:, None] & (pads[None, :] >= want[:, None]) & (pads[None, :] < topk)
    pad_slots = rows[:, None] * topk + pads[None, :]
    tl.store(indices_ptr + pad_slots, tl.full([SELECT_ROWS, TOPK_PAD], -1, tl.int32), mask=pad_mask)
    tl.store(top_ptr + pad_slots, pad_score + tl.zeros([SELECT_ROWS, TOPK_PAD], tl.float32), mask=pad_mask)


def _score_operands(q: torch.Tensor, k: torch.Tensor, config: Config, dim_pad: int) -> tuple[Any, Any, int]:
    """The scoring's q and k arguments and its TMA mode: the tensors (pointers, or TMA 2, whose
    descriptors each program builds), or with TMA 1 descriptors encoded here (one instruction a tile,
    no per-element addresses; see ``_query_rows`` for their boxes). Tensors TMA cannot address take
    the pointer path."""
    batch, seq, heads, dim = q.shape
    block_s, block_h = config["BLOCK_S"], config["BLOCK_H"]
    if not tma_usable(config, q, k):
        return q, k, 0
    if config["TMA"] == 2:
        ensure_scratch_allocator()  # the kernel's descriptors live in Triton's global scratch
        return q, k, 2
    if block_h == 1:
        q_desc = TensorDescriptor.from_tensor(q.view(batch * seq, heads * dim), [block_s, dim_pad])
    else:
        q_desc = TensorDescriptor.from_tensor(q.view(batch * seq, heads, dim), [block_s, block_h, dim_pad])
    k_desc = TensorDescriptor.from_tensor(k.view(-1, dim), [config["BLOCK_T"], dim_pad])
    return q_desc, k_desc, 1


def _score_rows(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, ratio: int, config: Config,
                compile_only: bool = False, picks: tuple[torch.Tensor, torch.Tensor, int, float] | None = None
                ) -> torch.Tensor:
    """Launch the scoring on contiguous inputs: fp32 ``[HEAD_SPLITS, B, S, S // r]``, each split's heads'
    share of I where visible (their sum in split order is I), undefined elsewhere.

    With SELECT_IN_SCORING, ``picks`` is ``(indices, scores, topk, pad_score)``, which each program
    fills for its own rows after scoring them (``_select``'s outputs, without its launch)."""
    batch, seq, heads, dim = q.shape
    n_keys = k.shape[1]
    splits = config.get("HEAD_SPLITS", 1)  # configs tuned before HEAD_SPLITS existed lack it
    split_heads = cdiv(cdiv(heads, splits), config["BLOCK_H"]) * config["BLOCK_H"]
    rows = torch.empty(splits, batch, seq, n_keys, dtype=torch.float32, device=q.device)
    if config.get("GLUON"):  # configs tuned before GLUON existed lack it
        check_gluon("the indexer's scoring", indexer_sm90.fits(config, dim))
        indexer_sm90.launch_scoring(q, k, w, rows, ratio, config, compile_only)
        return rows
    dim_pad = max(16, next_pow2(dim))
    q_ref, k_ref, tma = _score_operands(q, k, config, dim_pad)
    key_tiles = config.get("KEY_TILES", 0)  # configs tuned before KEY_TILES or LATE_HEAD_SUM existed lack them
    key_groups = cdiv(cdiv(n_keys, config["BLOCK_T"]), key_tiles) if key_tiles else 1
    indices, top, topk, pad_score = picks if picks is not None else (rows, rows, 1, 0.0)  # unread without picks
    launch(
        _score_kernel,
        (batch * cdiv(seq, config["BLOCK_S"]), max(1, key_groups), splits),
        (q_ref, k_ref, w, rows, seq, n_keys, heads, dim, ratio, split_heads, batch * seq * n_keys, indices, top, topk,
         pad_score),
        {"BLOCK_S": config["BLOCK_S"], "BLOCK_H": config["BLOCK_H"], "BLOCK_T": config["BLOCK_T"],
         "KEY_TILES": key_tiles, "LATE_HEAD_SUM": config.get("LATE_HEAD_SUM", 0), "DIM_PAD": dim_pad,
         "UPCAST": current_arch() == INTERPRETER_ARCH, "ONE_HEAD_BLOCK": config["BLOCK_H"] >= split_heads,
         "TMA": tma, "KEY_ROWS": config.get("KEY_ROWS", 0), "SELECT_IN_SCORING": picks is not None,
         **(_selection_constexprs(n_keys, topk, config) if picks is not None else _NO_SELECTION)},
        config,
        compile_only,
    )
    return rows


# The scoring's selection constexprs where it selects nothing: one compiled scoring for every topk.
_NO_SELECTION = {"SELECT_ROWS": 1, "KEYS_PAD": 1, "KEYS_HALF": 1, "KEYS_QUARTER": 1, "TOPK_PAD": 1, "SELECT_INTERP": 0}


def _selection_constexprs(n_keys: int, topk: int, config: Config) -> dict[str, int]:
    """The selection's compile-time sizes and search: rows a step, the padded row and its half and
    quarter, the padded topk."""
    keys_pad = next_pow2(max(1, n_keys))
    return {"SELECT_ROWS": config["SELECT_ROWS"], "KEYS_PAD": keys_pad, "KEYS_HALF": max(1, keys_pad // 2),
            "KEYS_QUARTER": max(1, keys_pad // 4), "TOPK_PAD": next_pow2(topk),
            "SELECT_INTERP": config.get("SELECT_INTERP", 0)}


def _empty_picks(batch: int, seq: int, topk: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection's outputs, unfilled: int32 indices and fp32 scores, ``[B, S, topk]``."""
    return (torch.empty(batch, seq, topk, dtype=torch.int32, device=device),
            torch.empty(batch, seq, topk, dtype=torch.float32, device=device))


def _select(rows: torch.Tensor, topk: int, ratio: int, config: Config, compile_only: bool = False,
            pad_score: float = -float("inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the selection on partial score rows ``[splits, B, S, Sc]`` (summed in split order; only the
    visible prefix of each is read); returns ``(indices, scores)`` ``[B, S, topk]``, padded with -1 and
    ``pad_score``."""
    splits, batch, seq, n_keys = rows.shape
    indices, scores = _empty_picks(batch, seq, topk, rows.device)
    launch(
        _select_kernel,
        (cdiv(batch * seq, config["SELECT_ROWS"]),),
        (rows, indices, scores, batch * seq, seq, n_keys, ratio, topk, pad_score, batch * seq * n_keys),
        {**_selection_constexprs(n_keys, topk, config), "HEAD_SPLITS": splits},
        {**config, "num_warps": config["SELECT_WARPS"], "num_stages": 1},
        compile_only,
    )
    return indices, scores


def _forward(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, topk: int, ratio: int, config: Config,
             compile_only: bool = False, pad_score: float = -float("inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """Scoring, then selection (a launch of its own, or with SELECT_IN_SCORING each scoring program's),
    on contiguous inputs; returns ``(indices, scores)``."""
    if config.get("SELECT_IN_SCORING"):  # configs tuned before SELECT_IN_SCORING existed lack it
        if reason := _select_in_scoring_misfit(config):
            raise ValueError(f"SELECT_IN_SCORING 1 needs {reason}")
        indices, scores = _empty_picks(q.shape[0], q.shape[1], topk, q.device)
        _score_rows(q, k, w, ratio, config, compile_only, (indices, scores, topk, pad_score))
        return indices, scores
    rows = _score_rows(q, k, w, ratio, config, compile_only)
    return _select(rows, topk, ratio, config, compile_only, pad_score)


def _select_in_scoring_misfit(config: Config) -> str | None:
    """What keeps a scoring program from owning whole rows to pick from (None when nothing does)."""
    wrong = [f"{name} 0 (got {config.get(name)!r})" for name in ("KEY_TILES", "GLUON") if config.get(name)]
    if config.get("HEAD_SPLITS", 1) != 1:
        wrong.append(f"HEAD_SPLITS 1 (got {config['HEAD_SPLITS']!r})")
    if config["SELECT_ROWS"] > config["BLOCK_S"]:
        wrong.append(f"SELECT_ROWS at most BLOCK_S {config['BLOCK_S']} (got {config['SELECT_ROWS']})")
    return "; ".join(wrong) or None


def indexer_topk(
    q_i: torch.Tensor, k_i: torch.Tensor, w: torch.Tensor, topk: int, ratio: int = INDEX_RATIO
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k visible compressed entries of each query: ``(indices, scores)``, both ``[B, S, topk]``.

    Contract: ``q_i [B, S, H, D]`` and ``k_i [B, S // ratio, D]`` bf16, ``w [B, S, H]`` bf16 or
    fp32, all on one device, any strides (copied); ``topk`` and ``ratio`` ints >= 1 (a topk past
    the visible entries pads). Query s sees entries ``t < (s + 1) // ratio``. ``indices`` (int32) lists each query's
    picks in ascending index order, then -1 padding where it sees fewer than topk;
    ``scores`` (fp32) holds their index scores, -inf at the padding. Equal scores go to the
    lower index. Not differentiable (the indexer's gradient path is frozen). Launch
    parameters come from ``kernels.tuning.resolve`` (shape ``batch, seq, topk``).
    """
    if q_i.dim() != 4 or k_i.dim() != 3 or w.dim() != 3:
        raise ValueError(f"need q_i [B, S, H, D], k_i [B, Sc, D], w [B, S, H]; got {list(q_i.shape)}, "
                         f"{list(k_i.shape)}, {list(w.shape)}")
    batch, seq, heads, dim = q_i.shape
    if not isinstance(ratio, int) or not isinstance(topk, int) or ratio < 1 or topk < 1:
        raise ValueError(f"ratio and topk must be positive ints, got {ratio!r} and {topk!r}")
    check_same_device(q_i=q_i, k_i=k_i, w=w)
    if tuple(k_i.shape) != (batch, seq // ratio, dim) or tuple(w.shape) != (batch, seq, heads):
        raise ValueError(f"for q_i {list(q_i.shape)} and ratio {ratio}, k_i must be [{batch}, {seq // ratio}, {dim}] "
                         f"and w [{batch}, {seq}, {heads}]; got {list(k_i.shape)} and {list(w.shape)}")
    if q_i.dtype != torch.bfloat16 or k_i.dtype != torch.bfloat16 or w.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"q_i and k_i must be bfloat16 and w bfloat16 or float32; got {q_i.dtype}, {k_i.dtype}, "
                         f"{w.dtype}")
    config, _ = resolve("indexer_fwd", {"batch": batch, "seq": seq, "topk": topk})
    return _forward(q_i.contiguous(), k_i.contiguous(), w.contiguous(), topk, ratio, config)


def index_scores_reference(
    q_i: torch.Tensor, k_i: torch.Tensor, w: torch.Tensor, ratio: int = INDEX_RATIO
) -> torch.Tensor:
    """Eager fp32 ``I [B, S, S // ratio]``, -inf where an entry is not visible; one head at a time
    (an ``[B, S, H, S // ratio]`` intermediate would be 4 GB at S = 8192)."""
    batch, seq, heads, _ = q_i.shape
    keys = k_i.float()
    scores = torch.zeros(batch, seq, k_i.shape[1], dtype=torch.float32, device=q_i.device)
    for h in range(heads):
        scores += w[:, :, h, None].float() * torch.relu(q_i[:, :, h].float() @ keys.transpose(1, 2))
    queries = torch.arange(seq, device=q_i.device)
    visible = torch.arange(k_i.shape[1], device=q_i.device)[None, :] < (queries + 1)[:, None] // ratio
    return scores.masked_fill(~visible, -float("inf"))


def select_topk_reference(scores: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``indexer_topk``'s selection from score rows (-inf = not visible), by a stable sort: the
    largest scores, equal ones by lower index, listed in ascending index order, -1 / -inf padded."""
    n_keys = scores.shape[-1]
    take = min(topk, n_keys)
    ranked = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :take]
    ranked = torch.where(scores.gather(-1, ranked) > -float("inf"), ranked, n_keys).sort(dim=-1).values
    padded = ranked == n_keys
    picked = scores.gather(-1, ranked.masked_fill(padded, 0)).masked_fill(padded, -float("inf"))
    indices = ranked.masked_fill(padded, -1).int()
    return F.pad(indices, (0, topk - take), value=-1), F.pad(picked, (0, topk - take), value=-float("inf"))


def indexer_topk_reference(
    q_i: torch.Tensor, k_i: torch.Tensor, w: torch.Tensor, topk: int, ratio: int = INDEX_RATIO
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager fp32 math of ``indexer_topk``, same output convention."""
    return select_topk_reference(index_scores_reference(q_i, k_i, w, ratio), topk)


# ----- registration -------------------------------------------------------------------


def _make_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    """q, k and w drawn from the nonzero integers -4..4 (bf16), the V4 indexer's sizes.

    Their scores are integers below 2**24, exact in fp32 whatever the summation order, so
    the sweep's element-wise check can demand the reference's indices exactly, tie rule
    included (integer scores tie often). The scoring's time does not depend on the values; the
    selection's passes do, and these rows take about as many as Gaussian ones
    (docs/findings.md, Indexer).
    """
    gen = torch.Generator().manual_seed(seed)
    batch, seq = shape["batch"], shape["seq"]

    def integers(*size: int) -> torch.Tensor:
        magnitude = torch.randint(1, 5, size, generator=gen)
        sign = torch.randint(0, 2, size, generator=gen) * 2 - 1
        return (magnitude * sign).to(torch.bfloat16).to(device)

    return {"q": integers(batch, seq, INDEX_HEADS, INDEX_DIM), "k": integers(batch, seq // INDEX_RATIO, INDEX_DIM),
            "w": integers(batch, seq, INDEX_HEADS), "topk": shape["topk"]}


def _run(inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    # Padding scores 0 instead of -inf: the sweep's output check rejects non-finite values.
    return _forward(inputs["q"], inputs["k"], inputs["w"], inputs["topk"], INDEX_RATIO, config, pad_score=0.0)


def _compile(inputs: Inputs, config: Config) -> None:
    _forward(inputs["q"], inputs["k"], inputs["w"], inputs["topk"], INDEX_RATIO, config, compile_only=True)


def _reference(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    indices, scores = indexer_topk_reference(inputs["q"], inputs["k"], inputs["w"], inputs["topk"], INDEX_RATIO)
    return indices, scores.masked_fill(indices < 0, 0.0)


def _visible_pairs(shape: Shape) -> int:
    """(query, entry) pairs the causal mask lets through."""
    keys = shape["seq"] // INDEX_RATIO
    return shape["batch"] * sum(min(n // INDEX_RATIO, keys) for n in range(1, shape["seq"] + 1))


def _flops(shape: Shape) -> int:
    return 2 * INDEX_HEADS * INDEX_DIM * _visible_pairs(shape)


def _bytes_moved(shape: Shape) -> int:
    """q, k and w (bf16) read; indices and scores written. The fp32 score buffer is excluded."""
    batch, seq, topk = shape["batch"], shape["seq"], shape["topk"]
    reads = batch * (seq * INDEX_HEADS * (INDEX_DIM + 1) + seq // INDEX_RATIO * INDEX_DIM)
    return _BF16_BYTES * reads + batch * seq * topk * (_INDEX_BYTES + _FP32_BYTES)


def _default_config(shape: Shape) -> Config:
    """16 queries x 4 heads (64-row dots) against 128-entry tiles over 4 warps; selection of about
    2048 keys per program (one S = 8192 row, two S = 4096 rows) over 4 warps."""
    keys_pad = next_pow2(max(1, shape["seq"] // INDEX_RATIO))
    return {"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": min(128, max(16, keys_pad)), "KEY_TILES": 0, "LATE_HEAD_SUM": 0,
            "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "KEY_ROWS": 0, "SELECT_IN_SCORING": 0, "SELECT_INTERP": 0, "num_warps": 4,
            "num_stages": 2,
            "SELECT_ROWS": min(16, max(1, 2048 // keys_pad), next_pow2(shape["batch"] * shape["seq"])),
            "SELECT_WARPS": 4}


register(
    TunableKernel(
        name="indexer_fwd",
        shape_fields=("batch", "seq", "topk"),
        exact_fields=("topk",),
        make_inputs=_make_inputs,
        run=_run,
        reference=_reference,
        default_config=_default_config,
        bytes_moved=_bytes_moved,
        compile=_compile,
        flops=_flops,
        atol=1e-6,
        rtol=1e-6,
        presets={
            "v4-flash": [{"batch": 1, "seq": seq, "topk": 512} for seq in (4096, 8192)],
            "v4-pro": [{"batch": 1, "seq": seq, "topk": 1024} for seq in (4096, 8192)],
            # Tails of 2 and 1 tokens; early queries that see fewer than topk entries (all of
            # them, with topk 12 > 9 entries), later ones that see more.
            "small": [{"batch": 2, "seq": 70, "topk": 8}, {"batch": 1, "seq": 37, "topk": 12},
                      {"batch": 2, "seq": 48, "topk": 3}],
        },
    )
)
