"""DeepSeek-V4 sparse single-latent attention with a sink: window, CSA and HCA layers, one kernel family.

Every head of a query attends over one set of entries of a single 512-wide latent that is both
key and value (MQA), with one learned sink logit per head in the softmax denominator::

    l_j = (q_h . e_j) / sqrt(512)
    o_h = sum_j exp(l_j) e_j / (sum_j exp(l_j) + exp(sink_h))

The entries of query s (positions in this order; the kernels walk them in ``TILE_K`` tiles):

* the causal window ``kv[max(0, s - window + 1) .. s]`` (every layer type);
* HCA (``compress_ratio`` 128): every ``kv_compressed[t]`` with ``t < (s + 1) // 128``, counted
  from s in the kernel (no index tensor); any other ratio above 0 except 4 pools the same way
  (the ``tiny`` proxy preset's HCA layers use 16);
* CSA (``compress_ratio`` 4): ``kv_compressed[indices[s, k]]`` for every slot k of the indexer's
  top-k, -1 = padding wherever it stands (V4's public semantics; see ``sparse_attention``). Each
  launch first compacts the rows (``_compact_picks``: picks first, -1 after), so that a query's
  picks end at its first -1 in the kernels.

Forward (``sparse_attn_fwd``): one program per (query, block of ``BLOCK_H`` heads). Each gathered
``[TILE_K, 512]`` entry tile is loaded once for the block's heads: logits = Q @ E^T on tensor cores,
an online softmax in fp32 (exp2, log2 domain) whose running max and denominator start from the sink
(so the sink is folded in, and a tile with every entry masked cannot make a NaN), acc += P @ E.
Window, compressed and mixed tiles go through the same loop: each row of a tile picks its pointer
from kv or kv_compressed. It saves the natural-log LSE (sink included) for the backward.
``TAIL_K`` > 0 takes a query's last partial tile in a tile of that length (an HCA query's 128
window entries and up to 32 compressed ones walk 64 + 64 + 32 positions rather than 3 x 64).
``RESCALE_SLACK`` > 0 rescales the accumulator lazily (see ``_attend_tile``; it lost at every
shape of the 2026-12-02 H200 sweep, and the default rescales every tile). ``UNCHAINED`` passes P
to the second dot through memory, so that the two warpgroups of a 64-head block split ``Q E^T``
instead of each computing all of it (both directions; ``PTX_BARRIER`` lets a multi-stage loop
pipeline its gathers around that hand-off, 1 reading it volatile and 2 plainly: see
``_attend_tile``, ``_cta_barrier`` and ``_ptx_barrier``). ``GLUON`` 1-6 runs the forward on sm_90
as the Gluon kernel of ``kernels.sparse_attention_sm90`` instead, which lays the two dots over the
warpgroups explicitly (one tiling). ``LATE_FIRST`` gives program 0 the last query, so that CSA's
heaviest queries (the full top-k) do not run in the last wave.

Backward (``sparse_attn_bwd``): the same programs recompute P = exp(l - LSE), then
dP = dO @ E^T, dS = P (dP - rowsum(dO * O)), dq = scale dS @ E, and each tile's entry gradient
scale dS^T @ Q + P^T @ dO, which many queries add into the same rows (a kv row gets it from
``window`` queries, an HCA row from up to every query). ``DKV_MODE`` chooses how:

* ``atomic``: fp32 ``tl.atomic_add`` (relaxed) into one ``[kv rows + compressed rows, 512]``
  buffer, cast to bf16 at the end; summation order, so the last bits, vary run to run.
* ``split``: the programs store each slot's gradient (bf16) and its destination row; the slots are
  sorted by destination on the device (no host sync), and a second kernel sums each row's slots in
  a fixed order (deterministic). ``R_CHUNK`` (0 = all) bounds that buffer: the entry positions are
  processed in chunks of R_CHUNK per launch pair, dq accumulating in fp32 across them.

``d sink_h = -sum_s exp(sink_h - LSE(s, h)) rowsum(dO * O)(s, h)``, written per (query, head) and
summed afterwards (deterministic). The backward is registered as one launch, whatever its mode,
so that a sweep compares atomics and the split reduction end to end; the split mode's gather-sum
has fixed launch parameters.

Registered shapes: ``batch, seq, heads, ratio, topk`` (0 unless ratio 4) and ``window`` (128 in
the V4 presets; shorter in the interpreter's small ones, so that it cuts entries off there).

FLOPs (FlashMLA's convention, used for the TFLOP/s of both launches): forward
``2 * sum_queries(entries attended) * heads * (512 + 512)`` where entries attended = window entries
+ compressed entries as the kernel sees them (valid CSA indices only: ``make_inputs`` gives query s
``min(topk, (s + 1) // 4)`` of them, as the indexer does); the backward counts 2.5 times that
(five matmuls of the size of the forward's two).

bf16 error, against the fp32 reference fed the same bf16 inputs, per element relative to the larger
of its row's and its tensor's RMS (unit-scale inputs; measured on the interpreter, whose fp32 ->
bf16 casts truncate, biasing P, dS and O toward zero by ~2^-9; round-to-nearest GPUs do better):

* o: 0.3% mean, 4% worst element (P rounded to bf16 for P @ E);
* dq: 0.4% mean, 7% worst, on rows where dS = P (dP - Delta) cancels (P on one entry) and the
  error of Delta = rowsum(dO * O), taken from the bf16 O as FlashAttention does, shows;
* dkv, dkv_compressed: 0.25% mean, 3% worst with atomics (bf16 dS and P in the entry-gradient
  dots); the split mode's bf16 slot buffer about doubles that;
* dsink: 0.5% mean, 1.5% worst (fp32 terms).

The registered launches are checked against that reference at rtol 2e-2 and atol 1e-2 (forward)
or 1e-1 (backward: entry gradients sum many rounded terms). At full size the tail is longer: the
H200 sweep of 2026-11-30 found single dkv elements off by 0.058-0.078 (of 2.1M; the tensor's RMS
is 1.6 and its largest element 30 on the Flash window shape) in configs of every tiling, which an
atol of 5e-2 had rejected. ``make_inputs`` narrows dO on HCA
so that the most attended entry's gradient stays about unit size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
import triton
import triton.language as tl

from kernels import sparse_attention_sm90
from kernels.arch import INTERPRETER_ARCH, current_arch
from kernels.contracts import check_range, check_same_device
from kernels.host_math import cdiv, next_pow2
from kernels.launch import check_gluon, launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

LATENT_DIM = 512
DEFAULT_WINDOW = 128
CSA_RATIO = 4
HCA_RATIO = 128
COMPRESS_RATIOS = (0, CSA_RATIO, HCA_RATIO)
DKV_MODES = ("atomic", "split")
SOFTMAX_SCALE = LATENT_DIM ** -0.5
_LOG2E = math.log2(math.e)
_D = tl.constexpr(LATENT_DIM)
_LOG2E_C = tl.constexpr(_LOG2E)
_LN2_C = tl.constexpr(math.log(2.0))
_CSA = tl.constexpr(CSA_RATIO)
# PTX_BARRIER's inline-PTX modes (``_ptx_barrier``): the hand-off read volatile, or plainly
_PTX_VOLATILE = tl.constexpr(1)
_PTX_PLAIN = tl.constexpr(2)
# Launch parameters of the split mode's gather-sum (memory-bound; not tuned).
_REDUCE_SLOTS = 16
_REDUCE_WARPS = 4
_BF16_BYTES = 2
_FP32_BYTES = 4
_INT32_BYTES = 4


# --------------------------------------------------------------------------------------------
# Entries of a query
# --------------------------------------------------------------------------------------------


@triton.jit
def _is_pick(t, SC):
    """Which CSA slots hold a pick: a compressed row id; -1 (or any id outside ``[0, SC)``) is padding."""
    return (t >= 0) & (t < SC)


@triton.jit
def _entry_count(idx_ptr, b, s, S, TOPK, WINDOW, RATIO: tl.constexpr, TOPK_BLOCK: tl.constexpr):
    """Entry positions of query s: its window, then its compressed slots. CSA rows come compacted
    (``_compact_picks``: picks first, -1 after), so a query's picks end at its first -1; counting
    them once here lets every tile test its entries by position alone."""
    n = tl.minimum(s + 1, WINDOW)
    if RATIO == _CSA:
        slots = tl.arange(0, TOPK_BLOCK)
        picks = tl.load(idx_ptr + (b * S + s).to(tl.int64) * TOPK + slots, mask=slots < TOPK, other=-1)
        n += tl.min(tl.where(picks < 0, slots, TOPK), axis=0)
    elif RATIO != 0:
        n += (s + 1) // RATIO
    return n


@triton.jit
def _gather_entries(kv_ptr, kvc_ptr, idx_ptr, pos, s, b, S, SC, TOPK, WINDOW, kv_rows, p_end,
                    RATIO: tl.constexpr, UPCAST: tl.constexpr):
    """The ``[TILE_K, 512]`` tile of entry positions ``pos`` of query (b, s), those ``>= p_end`` masked.

    Returns it with its row mask and each row's destination in the entry-gradient buffer (kv rows,
    then ``kv_rows`` on the compressed rows; -1 when masked). Each row picks its pointer from kv
    (window positions) or kv_compressed, so a tile may mix both. A masked row reads the query's
    own kv row rather than nothing: the loads need no predicate, and the callers mask its logits.
    """
    n_win = tl.minimum(s + 1, WINDOW)
    valid = pos < p_end
    in_win = valid & (pos < n_win)
    in_comp = valid & (pos >= n_win)
    c = pos - n_win
    if RATIO == _CSA:
        t = tl.load(idx_ptr + (b * S + s).to(tl.int64) * TOPK + c, mask=in_comp, other=0)
    else:
        t = c
    kv_row = (b * S + tl.where(in_win, s + 1 - n_win + pos, s)).to(tl.int64)
    c_row = (b * SC + t).to(tl.int64)
    ptrs = tl.where(in_comp[:, None], kvc_ptr + c_row[:, None] * _D, kv_ptr + kv_row[:, None] * _D)
    e = tl.load(ptrs + tl.arange(0, _D)[None, :])
    if UPCAST:  # the interpreter's tl.dot multiplies bf16 operands as raw bits (see grouped_gemm._mma)
        e = e.to(tl.float32)
    dest = tl.where(in_win, kv_row, tl.where(in_comp, kv_rows + c_row, -1))
    return e, valid, dest


@triton.jit
def _cta_barrier(token, PTX: tl.constexpr):
    """Wait for every warp of the program; returns an int32 0 whose value depends on the wait.

    With PTX (CUDA, compiled) the wait is ``bar.sync`` as inline assembly: Triton 3.6 does not
    software-pipeline a loop that holds a ``tl.debug_barrier``, but pipelines around this. The
    caller adds the 0 to the addresses it reads after the wait, so that neither the compiler nor
    the pipeliner can issue those reads ahead of it (ptxas does not move loads across bar.sync).
    ``token`` (any scalar) only gives the assembly an operand.
    """
    if PTX:
        return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.u32 $0, 0;", "=r,r", [token], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        tl.debug_barrier()
        return 0


@triton.jit
def _load_after_wait(ptrs, zero, PTX_BARRIER: tl.constexpr):
    """Read hand-off values at ``ptrs`` after ``_cta_barrier`` returned ``zero`` (volatile in mode 1)."""
    return tl.load(ptrs + zero, volatile=PTX_BARRIER == _PTX_VOLATILE)


@triton.jit
def _scratch_tile(scratch, slot, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Pointers of the ``[ROWS, COLS]`` tile ``slot`` of a program's scratch rows (see UNCHAINED)."""
    return scratch + (tl.arange(0, ROWS) + slot * ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]


@triton.jit
def _attend_tile(q, e, valid, m, denom, acc, qk_scale, p_scratch, alpha_scratch, parity,
                 RESCALE_SLACK: tl.constexpr, UNCHAINED: tl.constexpr, PTX_BARRIER: tl.constexpr):
    """One entry tile ``e`` (rows ``valid``) of the forward's online softmax: the new log2-domain
    running max, denominator and ``[BLOCK_H, 512]`` fp32 accumulator of the block's heads.

    RESCALE_SLACK > 0 rescales lazily (FlashAttention-4's trick): the running max, and with it
    the accumulator and denominator, move only once some head's tile max exceeds it by more than
    that many log2 units, so most tiles skip the ``BLOCK_H x 512`` multiply; until then P stays
    below ``2**RESCALE_SLACK``, which bf16 and the fp32 sums hold exactly as well.

    UNCHAINED (RESCALE_SLACK 0 only: with lazy rescaling Triton 3.6 lays the dots out as chained
    again, offline sm_90) hands P and the rescale factor to the second dot through memory:
    ``[2, BLOCK_H, TILE_K]`` bf16 from ``p_scratch`` and ``[2, BLOCK_H]`` fp32 from
    ``alpha_scratch``, the half picked by ``parity``, so that a faster warp's next tile does not
    overwrite what a slower warp still reads (one barrier a tile). Triton lays out a dot whose
    result feeds another dot with all its warps along M, so at 64 heads on 8 warps both
    warpgroups compute the whole ``Q E^T``; through memory the two dots are no longer chained,
    and each warpgroup computes half of the tile's logits.
    """
    logits = tl.dot(q, tl.trans(e)) * qk_scale
    logits = tl.where(valid[None, :], logits, float("-inf"))
    m_new = tl.maximum(m, tl.max(logits, axis=1))
    if RESCALE_SLACK > 0:
        rescale = tl.max(m_new - m, axis=0) > RESCALE_SLACK
        alpha = tl.where(rescale, tl.exp2(m - m_new), 1.0)
        m = tl.where(rescale, m_new, m)
    else:
        alpha = tl.exp2(m - m_new)
        m = m_new
    p = tl.exp2(logits - m[:, None])
    denom = denom * alpha + tl.sum(p, axis=1)
    if UNCHAINED:
        p_tile = _scratch_tile(p_scratch, parity, q.shape[0], e.shape[0])
        alpha_rows = alpha_scratch + parity * q.shape[0] + tl.arange(0, q.shape[0])
        tl.store(p_tile, p.to(tl.bfloat16))
        tl.store(alpha_rows, alpha)
        zero = _cta_barrier(parity, PTX_BARRIER)
        p = _load_after_wait(p_tile, zero, PTX_BARRIER)
        alpha = _load_after_wait(alpha_rows, zero, PTX_BARRIER)
    if RESCALE_SLACK > 0:
        if rescale:
            acc = acc * alpha[:, None]
    else:
        acc = acc * alpha[:, None]
    acc = tl.dot(p.to(tl.bfloat16).to(e.dtype), e, acc)
    return m, denom, acc


@triton.jit
def _head_offsets(b, s, S, H, heads):
    """Offsets of the ``[BLOCK_H, 512]`` rows of heads ``heads`` of query (b, s) in a ``[B, S, H, 512]`` tensor."""
    return ((b * S + s).to(tl.int64) * H + heads)[:, None] * _D + tl.arange(0, _D)[None, :]


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------
# Dot operands are bf16 on the GPU. Under UPCAST (the interpreter) they are fp32 holding the same
# bf16 values: P and dS are rounded to bf16 first (``.to(tl.bfloat16).to(e.dtype)``; a no-op
# pair on the GPU), so the interpreter computes what the GPU does.


@triton.jit
def _sparse_attn_fwd_kernel(
    q_ptr, kv_ptr, kvc_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr,
    S, H, SC, TOPK, WINDOW, qk_scale,
    RATIO: tl.constexpr, BLOCK_H: tl.constexpr, TILE_K: tl.constexpr, TAIL_K: tl.constexpr,
    RESCALE_SLACK: tl.constexpr, UNCHAINED: tl.constexpr, PTX_BARRIER: tl.constexpr, TOPK_BLOCK: tl.constexpr,
    UPCAST: tl.constexpr, LATE_FIRST: tl.constexpr,
):
    s = S - 1 - tl.program_id(0) if LATE_FIRST else tl.program_id(0)
    b = tl.program_id(2)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offsets = _head_offsets(b, s, S, H, heads)
    q = tl.load(q_ptr + offsets, mask=h_mask[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # log2-domain running max and denominator, started from the sink: exp2(sink - m) = 1.
    m = tl.load(sink_ptr + heads, mask=h_mask, other=0.0) * _LOG2E_C
    denom = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, _D], dtype=tl.float32)
    # UNCHAINED's scratch: the program's own o rows, written only at the end (see _attend_tile).
    p_scratch = o_ptr + ((b * S + s).to(tl.int64) * H + tl.program_id(1) * BLOCK_H) * _D
    alpha_scratch = (p_scratch + 2 * BLOCK_H * TILE_K).to(tl.pointer_type(tl.float32))
    n_pos = _entry_count(idx_ptr, b, s, S, TOPK, WINDOW, RATIO, TOPK_BLOCK)
    # With a TAIL_K tile, the TILE_K tiles stop where at most TAIL_K positions remain, and one
    # TAIL_K tile takes those: a query's last partial tile is then at most TAIL_K wide.
    n_main = tl.maximum(n_pos - TAIL_K, 0) if TAIL_K > 0 else n_pos
    for p0 in range(0, n_main, TILE_K):
        e, valid, _ = _gather_entries(kv_ptr, kvc_ptr, idx_ptr, p0 + tl.arange(0, TILE_K), s, b, S, SC, TOPK,
                                      WINDOW, 0, n_pos, RATIO, UPCAST)
        m, denom, acc = _attend_tile(q, e, valid, m, denom, acc, qk_scale, p_scratch, alpha_scratch,
                                     (p0 // TILE_K) % 2, RESCALE_SLACK, UNCHAINED, PTX_BARRIER)
    if TAIL_K > 0:
        tail = tl.cdiv(n_main, TILE_K) * TILE_K
        if tail < n_pos:
            e, valid, _ = _gather_entries(kv_ptr, kvc_ptr, idx_ptr, tail + tl.arange(0, TAIL_K), s, b, S, SC, TOPK,
                                          WINDOW, 0, n_pos, RATIO, UPCAST)
            m, denom, acc = _attend_tile(q, e, valid, m, denom, acc, qk_scale, p_scratch, alpha_scratch,
                                         (tail // TILE_K) % 2, RESCALE_SLACK, UNCHAINED, PTX_BARRIER)
    if UNCHAINED:
        tl.debug_barrier()  # every warp has read its last P before o overwrites the scratch
    tl.store(o_ptr + offsets, (acc / denom[:, None]).to(o_ptr.dtype.element_ty), mask=h_mask[:, None])
    tl.store(lse_ptr + (b * S + s).to(tl.int64) * H + heads, (m + tl.log2(denom)) * _LN2_C, mask=h_mask)


@triton.jit
def _sparse_attn_bwd_kernel(
    q_ptr, kv_ptr, kvc_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr, do_ptr,
    dq_ptr, dsink_ptr, dkv_ptr, dest_ptr,
    S, H, SC, TOPK, WINDOW, kv_rows, qk_scale, sm_scale, p_begin, p_end,
    RATIO: tl.constexpr, BLOCK_H: tl.constexpr, TILE_K: tl.constexpr, SPLIT: tl.constexpr,
    FIRST: tl.constexpr, ACC_DQ: tl.constexpr, DE_TRANSPOSED: tl.constexpr, UNCHAINED: tl.constexpr,
    PTX_BARRIER: tl.constexpr,
    TOPK_BLOCK: tl.constexpr, UPCAST: tl.constexpr,
):
    """dq (+ partial dsink on the FIRST pass) of one (query, head block) over entry positions
    [p_begin, p_end), and the entry gradients of those positions: atomically added to ``dkv_ptr``
    (fp32 rows: kv rows, then compressed rows), or with SPLIT stored as bf16 slots of ``dkv_ptr``
    (one ``[B, S, p_end - p_begin]`` block per head block) with their destination rows in ``dest_ptr``.
    DE_TRANSPOSED computes each tile's entry gradient as its ``[512, TILE_K]`` transpose: the same
    sums, but as dots whose M is 512 rather than TILE_K, which sm_90 runs as wgmma (M >= 64).
    UNCHAINED hands the scaled dS and P to the dots that use them through the program's rows of dq
    (bf16, one pass only; written at the end), as the forward does: otherwise both warpgroups
    compute all of ``Q E^T`` and ``dO E^T`` at 64 heads on 8 warps.
    """
    s = tl.program_id(0)
    hb = tl.program_id(1)
    b = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offsets = _head_offsets(b, s, S, H, heads)
    q = tl.load(q_ptr + offsets, mask=h_mask[:, None], other=0.0)
    do = tl.load(do_ptr + offsets, mask=h_mask[:, None], other=0.0)
    o = tl.load(o_ptr + offsets, mask=h_mask[:, None], other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    stat_offsets = (b * S + s).to(tl.int64) * H + heads
    lse2 = tl.load(lse_ptr + stat_offsets, mask=h_mask, other=0.0) * _LOG2E_C
    if FIRST:
        p_sink = tl.exp2(tl.load(sink_ptr + heads, mask=h_mask, other=0.0) * _LOG2E_C - lse2)
        tl.store(dsink_ptr + stat_offsets, -p_sink * delta, mask=h_mask)
    chunk = p_end - p_begin
    slot_base = (b * S + s).to(tl.int64) * chunk - p_begin
    n_slots = tl.num_programs(2) * S * chunk
    cols = tl.arange(0, _D)[None, :]
    cols_t = tl.arange(0, _D)[:, None]
    dq = tl.zeros([BLOCK_H, _D], dtype=tl.float32)
    scratch = dq_ptr + ((b * S + s).to(tl.int64) * H + hb * BLOCK_H) * _D  # UNCHAINED's, two halves of 2 tiles
    n_pos = tl.minimum(p_end, _entry_count(idx_ptr, b, s, S, TOPK, WINDOW, RATIO, TOPK_BLOCK))
    for p0 in range(p_begin, n_pos, TILE_K):
        pos = p0 + tl.arange(0, TILE_K)
        e, valid, dest = _gather_entries(kv_ptr, kvc_ptr, idx_ptr, pos, s, b, S, SC, TOPK, WINDOW, kv_rows,
                                         n_pos, RATIO, UPCAST)
        p = tl.where(valid[None, :], tl.exp2(tl.dot(q, tl.trans(e)) * qk_scale - lse2[:, None]), 0.0)
        # scaled once, in fp32, for both dq and the entry gradient (the scale is linear in each)
        ds_b = (p * (tl.dot(do, tl.trans(e)) - delta[:, None]) * sm_scale).to(tl.bfloat16)
        p_b = p.to(tl.bfloat16)
        if UNCHAINED:
            half = 2 * (((p0 - p_begin) // TILE_K) % 2)
            tl.store(_scratch_tile(scratch, half, BLOCK_H, TILE_K), ds_b)
            tl.store(_scratch_tile(scratch, half + 1, BLOCK_H, TILE_K), p_b)
            zero = _cta_barrier(half, PTX_BARRIER)
            ds_b = _load_after_wait(_scratch_tile(scratch, half, BLOCK_H, TILE_K), zero, PTX_BARRIER)
            p_b = _load_after_wait(_scratch_tile(scratch, half + 1, BLOCK_H, TILE_K), zero, PTX_BARRIER)
        ds_b = ds_b.to(e.dtype)
        dq = tl.dot(ds_b, e, dq)
        p_b = p_b.to(e.dtype)
        slots = slot_base + pos
        in_chunk = pos < p_end
        if DE_TRANSPOSED:
            # [512, TILE_K]: M is the latent width, so the dots are warpgroup MMAs however few the heads.
            de_t = tl.dot(tl.trans(do), p_b, tl.dot(tl.trans(q), ds_b))
            if SPLIT:
                tl.store(dkv_ptr + (hb * n_slots + slots)[None, :] * _D + cols_t,
                         de_t.to(dkv_ptr.dtype.element_ty), mask=in_chunk[None, :])
            else:
                tl.atomic_add(dkv_ptr + dest[None, :] * _D + cols_t, de_t, mask=valid[None, :], sem="relaxed")
        else:
            de = tl.dot(tl.trans(p_b), do, tl.dot(tl.trans(ds_b), q))
            if SPLIT:
                tl.store(dkv_ptr + (hb * n_slots + slots)[:, None] * _D + cols, de.to(dkv_ptr.dtype.element_ty),
                         mask=in_chunk[:, None])
            else:
                tl.atomic_add(dkv_ptr + dest[:, None] * _D + cols, de, mask=valid[:, None], sem="relaxed")
        if SPLIT and hb == 0:
            tl.store(dest_ptr + slots, dest.to(tl.int32), mask=in_chunk)
    if UNCHAINED:
        tl.debug_barrier()  # every warp has read its last tiles before dq overwrites the scratch
    if ACC_DQ:
        dq += tl.load(dq_ptr + offsets, mask=h_mask[:, None], other=0.0)
    tl.store(dq_ptr + offsets, dq.to(dq_ptr.dtype.element_ty), mask=h_mask[:, None])


@triton.jit
def _compact_picks_kernel(idx_ptr, out_ptr, SC, TOPK, TOPK_BLOCK: tl.constexpr):
    """Index row ``program_id(0)`` of ``idx [rows, TOPK]`` into ``out``: its picks first, in their
    order, then -1 (padding and ids outside ``[0, SC)`` dropped)."""
    row = tl.program_id(0).to(tl.int64) * TOPK
    slots = tl.arange(0, TOPK_BLOCK)
    t = tl.load(idx_ptr + row + slots, mask=slots < TOPK, other=-1)
    pick = _is_pick(t, SC)
    tl.store(out_ptr + row + tl.cumsum(pick.to(tl.int32), axis=0) - 1, t, mask=pick)
    tl.store(out_ptr + row + slots, -1, mask=(slots >= tl.sum(pick.to(tl.int32), axis=0)) & (slots < TOPK))


@triton.jit
def _gather_sum_kernel(slots_ptr, order_ptr, bounds_ptr, out_ptr, n_slots, n_blocks,
                       ACCUMULATE: tl.constexpr, BLOCK_R: tl.constexpr):
    """``out[row] (+)= sum of the slot rows order[bounds[row]:bounds[row + 1]]`` of every head block."""
    row = tl.program_id(0)
    cols = tl.arange(0, _D)[None, :]
    start = tl.load(bounds_ptr + row)
    end = tl.load(bounds_ptr + row + 1)
    acc = tl.zeros([BLOCK_R, _D], dtype=tl.float32)
    for i in range(start, end, BLOCK_R):
        idx = i + tl.arange(0, BLOCK_R)
        mask = idx < end
        slot = tl.load(order_ptr + idx, mask=mask, other=0)
        for hb in range(n_blocks):
            acc += tl.load(slots_ptr + (hb * n_slots + slot)[:, None] * _D + cols, mask=mask[:, None], other=0.0)
    total = tl.sum(acc, axis=0)
    out = out_ptr + row.to(tl.int64) * _D + tl.arange(0, _D)
    if ACCUMULATE:
        total += tl.load(out)
    tl.store(out, total)


# --------------------------------------------------------------------------------------------
# Launch wrappers
# --------------------------------------------------------------------------------------------


def _interpreted() -> bool:
    return current_arch() == INTERPRETER_ARCH


def _ptx_barrier(config: Config) -> int:
    """The config's PTX_BARRIER where compiled for CUDA, else 0 (the interpreter and HIP wait by
    ``tl.debug_barrier`` whatever the knob): 0 ``tl.debug_barrier``; 1 inline PTX, the hand-off
    read ``volatile``; 2 inline PTX, plain reads. Volatile reads compile to scalar system-scope
    loads (LDG.E.STRONG.SYS), with which the forward ran 1.17-1.34x slower than without the
    barrier on the H200; the address dependency on the wait already keeps plain
    reads after it."""
    mode = config.get("PTX_BARRIER") or 0
    if mode not in (0, _PTX_VOLATILE.value, _PTX_PLAIN.value):
        raise ValueError(f"PTX_BARRIER must be 0, {_PTX_VOLATILE.value} or {_PTX_PLAIN.value}, not {mode!r}")
    return mode if not _interpreted() and torch.version.hip is None else 0


def _max_entries(ratio: int, seq: int, topk: int, window: int) -> int:
    """Most entry positions any query has."""
    return min(seq, window) + (0 if ratio == 0 else topk if ratio == CSA_RATIO else seq // ratio)


def _geometry(q: Tensor, kvc: Tensor | None, indices: Tensor | None) -> tuple[int, int, int, int, int]:
    batch, seq, heads, _ = q.shape
    return batch, seq, heads, 0 if kvc is None else kvc.shape[1], 0 if indices is None else indices.shape[2]


def _entry_constexprs(config: Config, heads: int, topk: int) -> dict[str, Any]:
    """The constexprs both directions share: how a tile reaches its second dots, how picks are counted."""
    if config.get("UNCHAINED") and heads % config["BLOCK_H"]:
        raise ValueError(f"UNCHAINED needs BLOCK_H ({config['BLOCK_H']}) to divide the heads ({heads}): "
                         "each program keeps its scratch in its own rows of the output")
    return {"UNCHAINED": bool(config.get("UNCHAINED")), "PTX_BARRIER": _ptx_barrier(config),
            "TOPK_BLOCK": next_pow2(max(topk, 1)), "UPCAST": _interpreted()}


def _forward(q: Tensor, kv: Tensor, kvc: Tensor | None, indices: Tensor | None, sink: Tensor, ratio: int,
             window: int, config: Config, compile_only: bool = False) -> tuple[Tensor, Tensor]:
    """``(o [B, S, H, 512] bf16, lse [B, S, H] fp32)`` of contiguous inputs (CSA rows in any layout)."""
    batch, seq, heads, n_comp, topk = _geometry(q, kvc, indices)
    picks = kv if indices is None else _compact_picks(indices, n_comp, compile_only)
    o = torch.empty_like(q)
    lse = torch.empty(batch, seq, heads, dtype=torch.float32, device=q.device)
    if config.get("GLUON"):
        check_gluon("the forward", sparse_attention_sm90.fits(config, heads))
        sparse_attention_sm90.launch_forward(q, kv, kv if kvc is None else kvc, picks,
                                             sink, o, lse, n_comp, topk, ratio, window, SOFTMAX_SCALE * _LOG2E,
                                             config["GLUON"], bool(config.get("LATE_FIRST")), compile_only)
        return o, lse
    launch(
        _sparse_attn_fwd_kernel,
        (seq, cdiv(heads, config["BLOCK_H"]), batch),
        (q, kv, kv if kvc is None else kvc, picks, sink, o, lse, seq, heads, n_comp, topk, window,
         SOFTMAX_SCALE * _LOG2E),
        {"RATIO": ratio, "BLOCK_H": config["BLOCK_H"], "TILE_K": config["TILE_K"], "TAIL_K": config.get("TAIL_K", 0),
         "RESCALE_SLACK": config.get("RESCALE_SLACK", 0), "LATE_FIRST": bool(config.get("LATE_FIRST")),
         **_entry_constexprs(config, heads, topk)},
        config,
        compile_only,
    )
    return o, lse


def _compact_picks(indices: Tensor, n_comp: int, compile_only: bool = False) -> Tensor:
    """CSA rows ``[B, S, topk]`` with each row's picks first and -1 after: the same entries, so the
    same attention, in the layout every launch reads (a query's picks end at its first -1).

    Why a pass of its own (8 MiB read and written at Flash's 4,096 x 512, each direction, against
    a forward that gathers 2 GiB of entries): masking padding slot by slot inside the tile loops
    made the mask depend on the loaded ids, which costs a layout conversion a tile; offline sm_90
    (Triton 3.6), the CSA loop bodies grew from 758 to 955 instructions (forward) and from 1,471
    to 1,853 (the tuned backward, spills 440 -> 488 B), and in the Gluon forward 3-6 registers a
    thread (mode 6 at 255) and a ptxas crash (mode 3).
    """
    out = torch.empty_like(indices)
    batch, seq, topk = indices.shape
    launch(_compact_picks_kernel, (batch * seq,), (indices, out, n_comp, topk),
           {"TOPK_BLOCK": next_pow2(max(topk, 1))}, {"num_warps": 4}, compile_only)
    return out


def _backward(q: Tensor, kv: Tensor, kvc: Tensor | None, indices: Tensor | None, sink: Tensor, o: Tensor,
              lse: Tensor, do: Tensor, ratio: int, window: int, config: Config,
              compile_only: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """``(dq, dkv, dkv_compressed or None, dsink)`` of contiguous inputs (see the module doc)."""
    batch, seq, heads, n_comp, topk = _geometry(q, kvc, indices)
    picks = kv if indices is None else _compact_picks(indices, n_comp, compile_only)
    kv_rows, rows = batch * seq, batch * (seq + n_comp)
    if config["DKV_MODE"] not in DKV_MODES:
        raise ValueError(f"DKV_MODE must be one of {DKV_MODES}, got {config['DKV_MODE']!r}")
    split = config["DKV_MODE"] == "split"
    head_blocks = cdiv(heads, config["BLOCK_H"])
    positions = _max_entries(ratio, seq, topk, window)
    chunk = max(1, min(config["R_CHUNK"] or positions, positions) if split else positions)
    passes = range(0, positions, chunk)
    shared = _entry_constexprs(config, heads, topk)
    if shared["UNCHAINED"] and len(passes) > 1:
        raise ValueError(f"UNCHAINED needs one pass (R_CHUNK 0), got R_CHUNK {config['R_CHUNK']} over {positions} "
                         "positions: each program keeps its scratch in its own bf16 rows of dq")
    dsink = torch.empty(batch, seq, heads, dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=torch.float32 if len(passes) > 1 else q.dtype, device=q.device)
    grads = (torch.empty if split else torch.zeros)(rows, LATENT_DIM, dtype=torch.float32, device=q.device)
    if split:
        slots = torch.empty(head_blocks * kv_rows * chunk, LATENT_DIM, dtype=q.dtype, device=q.device)
        dest = torch.empty(kv_rows * chunk, dtype=torch.int32, device=q.device)
    for p_begin in passes:
        if split:
            dest.fill_(-1)
        launch(
            _sparse_attn_bwd_kernel,
            (seq, head_blocks, batch),
            (q, kv, kv if kvc is None else kvc, picks, sink, o, lse, do, dq, dsink, slots if split else grads, dest if split else grads,
             seq, heads, n_comp, topk, window, kv_rows, SOFTMAX_SCALE * _LOG2E, SOFTMAX_SCALE,
             p_begin, p_begin + chunk),
            {"RATIO": ratio, "BLOCK_H": config["BLOCK_H"], "TILE_K": config["TILE_K"], "SPLIT": split,
             "FIRST": p_begin == 0, "ACC_DQ": p_begin > 0, "DE_TRANSPOSED": bool(config.get("DE_TRANSPOSED")),
             **shared},
            config,
            compile_only,
        )
        if split:
            _sum_slots(slots, dest, grads, head_blocks, accumulate=p_begin > 0, compile_only=compile_only)
    grads = grads.to(q.dtype)
    dkv = grads[:kv_rows].view(batch, seq, LATENT_DIM)
    dkvc = None if kvc is None else grads[kv_rows:].view(batch, n_comp, LATENT_DIM)
    return dq.to(q.dtype), dkv, dkvc, dsink.sum((0, 1))


def _sum_slots(slots: Tensor, dest: Tensor, out: Tensor, head_blocks: int, accumulate: bool,
               compile_only: bool) -> None:
    """``out[r] (+)= sum of every slot whose dest is r``: sort the slots by row, then gather-sum."""
    order = torch.argsort(dest, stable=True)
    counts = torch.zeros(out.shape[0] + 1, dtype=torch.int64, device=dest.device)
    counts.index_add_(0, dest.long() + 1, torch.ones_like(order))  # bucket 0: slots without an entry
    bounds = counts.cumsum(0)  # row r's slots are order[bounds[r]:bounds[r + 1]]
    launch(
        _gather_sum_kernel,
        (out.shape[0],),
        (slots, order, bounds, out, dest.numel(), head_blocks),
        {"ACCUMULATE": accumulate, "BLOCK_R": _REDUCE_SLOTS},
        {"num_warps": _REDUCE_WARPS},
        compile_only,
    )


# --------------------------------------------------------------------------------------------
# Eager reference
# --------------------------------------------------------------------------------------------


def _reference_entries(ratio: int, seq: int, window: int, n_comp: int, indices: Tensor | None,
                       device: torch.device) -> tuple[Tensor, Tensor]:
    """Per query, the rows of ``cat([kv, kv_compressed])`` it attends and which are real: ``[B|1, S, P]``.

    Straight from the definitions: window offsets 0..window-1 back from s, then every compressed
    entry with its causal test (HCA) or every slot of the query's index row (CSA), a slot outside
    ``[0, n_comp)`` (-1) being padding on its own, a pick listed twice attended twice.
    """
    s = torch.arange(seq, device=device)[:, None]
    back = s - torch.arange(window, device=device)[None, :]
    rows, valid = [back.clamp(min=0)], [back >= 0]
    if ratio not in (0, CSA_RATIO):
        t = torch.arange(n_comp, device=device)[None, :]
        rows.append((seq + t).expand(seq, n_comp))
        valid.append(t < (s + 1) // ratio)
    rows_t, valid_t = torch.cat(rows, 1)[None], torch.cat(valid, 1)[None]
    if ratio == CSA_RATIO:
        picks = (indices >= 0) & (indices < n_comp)
        rows_t = torch.cat([rows_t.expand(indices.shape[0], -1, -1), torch.where(picks, seq + indices.long(), 0)], 2)
        valid_t = torch.cat([valid_t.expand(indices.shape[0], -1, -1), picks], 2)
    return rows_t, valid_t


def _attend(q: Tensor, table: Tensor, sink: Tensor, rows: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 ``(o, lse)`` of queries ``q [B, C, H, D]`` over ``table [B, R, D]`` rows ``rows [B|1, C, P]``."""
    batch, n_q, heads, _ = q.shape
    rows = rows.expand(batch, -1, -1)
    entries = table[torch.arange(batch, device=q.device)[:, None, None], rows]  # [B, C, P, D]
    logits = torch.einsum("bchd,bcpd->bchp", q.float(), entries) * SOFTMAX_SCALE
    logits = logits.masked_fill(~valid.expand(batch, -1, -1)[:, :, None, :], float("-inf"))
    with_sink = torch.cat([logits, sink.float().view(1, 1, heads, 1).expand(batch, n_q, heads, 1)], -1)
    probs = torch.softmax(with_sink, -1)[..., :-1]
    return torch.einsum("bchp,bcpd->bchd", probs, entries), torch.logsumexp(with_sink, -1)


def _query_chunks(q: Tensor, entries: int) -> list[slice]:
    """Query slices whose gathered entries and logits take about 1 GiB in fp32."""
    batch, seq, heads, dim = q.shape
    per_query = batch * entries * (dim + 3 * heads) * _FP32_BYTES
    size = max(1, (1 << 30) // per_query)
    return [slice(i, min(i + size, seq)) for i in range(0, seq, size)]


def _reference(q: Tensor, kv: Tensor, sink: Tensor, ratio: int, kvc: Tensor | None, indices: Tensor | None,
               window: int, do: Tensor | None = None) -> tuple[Tensor, ...]:
    """fp32 ``(o, lse)``, or with ``do`` the gradients ``(dq, dkv, dkv_compressed or None, dsink)``.

    Queries go in chunks, each differentiated on its own, so memory stays bounded at V4 sizes.
    """
    seq = q.shape[1]
    n_comp = 0 if kvc is None else kvc.shape[1]
    rows, valid = _reference_entries(ratio, seq, window, n_comp, indices, q.device)
    leaves = [t.detach().float().requires_grad_(do is not None) for t in (kv, sink, *([] if kvc is None else [kvc]))]
    grads = [torch.zeros_like(t) for t in leaves]
    outputs = []
    for chunk in _query_chunks(q, rows.shape[2]):
        with torch.set_grad_enabled(do is not None):
            q_c = q[:, chunk].detach().float().requires_grad_(do is not None)
            table = torch.cat([leaves[0], *leaves[2:]], 1)
            o, lse = _attend(q_c, table, leaves[1], rows[:, chunk], valid[:, chunk])
        if do is None:
            outputs.append((o, lse))
            continue
        chunk_grads = torch.autograd.grad(o, [q_c, *leaves], do[:, chunk].float())
        outputs.append((chunk_grads[0],))
        for total, g in zip(grads, chunk_grads[1:]):
            total += g
    if do is None:
        return torch.cat([o for o, _ in outputs], 1), torch.cat([lse for _, lse in outputs], 1)
    dq = torch.cat([g for (g,) in outputs], 1)
    return dq, grads[0], grads[2] if kvc is not None else None, grads[1]


def sparse_attention_reference(q: Tensor, kv: Tensor, sink: Tensor, compress_ratio: int,
                               kv_compressed: Tensor | None = None, indices: Tensor | None = None,
                               window: int = DEFAULT_WINDOW) -> Tensor:
    """Eager fp32 math of ``sparse_attention`` (differentiable, any float dtypes), returned in q's dtype."""
    _check_shapes(q, kv, sink, compress_ratio, kv_compressed, indices, window)
    rows, valid = _reference_entries(compress_ratio, q.shape[1], window,
                                     0 if kv_compressed is None else kv_compressed.shape[1], indices, q.device)
    table = kv.float() if kv_compressed is None else torch.cat([kv.float(), kv_compressed.float()], 1)
    return _attend(q, table, sink, rows, valid)[0].to(q.dtype)


# --------------------------------------------------------------------------------------------
# Public op
# --------------------------------------------------------------------------------------------


def _check_shapes(q: Tensor, kv: Tensor, sink: Tensor, ratio: int, kvc: Tensor | None, indices: Tensor | None,
                  window: int) -> None:
    """ValueError naming the first argument whose shape (or the ratio, window, index values) does not
    fit the others: the contract of ``sparse_attention`` and its reference alike."""
    if q.dim() != 4 or q.shape[-1] != LATENT_DIM:
        raise ValueError(f"q must be [B, S, H, {LATENT_DIM}], got {list(q.shape)}")
    batch, seq, heads, _ = q.shape
    if not isinstance(ratio, int) or ratio < 0:
        raise ValueError(f"compress_ratio must be 0 (window), 4 (CSA) or another positive ratio (HCA), got {ratio!r}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int of at least 1, got {window!r}")
    expected = {"kv": (kv, [batch, seq, LATENT_DIM]), "sink": (sink, [heads])}
    if ratio:
        if kvc is None:
            raise ValueError(f"compress_ratio {ratio} needs kv_compressed")
        expected["kv_compressed"] = (kvc, [batch, seq // ratio, LATENT_DIM])
    elif kvc is not None:
        raise ValueError("kv_compressed is only for a compress_ratio above 0")
    if ratio == CSA_RATIO:
        if indices is None or indices.dim() != 3:
            raise ValueError(f"compress_ratio 4 needs indices [B, S, topk], got {None if indices is None else list(indices.shape)}")
        expected["indices"] = (indices, [batch, seq, indices.shape[2]])
        if indices.dtype != torch.int32:
            raise ValueError(f"indices must be int32, got {indices.dtype}")
    elif indices is not None:
        raise ValueError("indices are only for compress_ratio 4")
    for name, (tensor, shape) in expected.items():
        if list(tensor.shape) != shape:
            raise ValueError(f"{name} must be {shape} for q {list(q.shape)}, got {list(tensor.shape)}")
    if indices is not None:
        check_range("indices", indices, -1, seq // CSA_RATIO, "-1 (padding) or rows of kv_compressed")


def _check_dtypes(q: Tensor, kv: Tensor, sink: Tensor, kvc: Tensor | None) -> None:
    for name, tensor in (("q", q), ("kv", kv), ("kv_compressed", kvc)):
        if tensor is not None and tensor.dtype != torch.bfloat16:
            raise ValueError(f"{name} must be bfloat16, got {tensor.dtype}")
    if sink.dtype != torch.float32:
        raise ValueError(f"sink must be float32, got {sink.dtype}")


def _shape(q: Tensor, ratio: int, indices: Tensor | None, window: int) -> Shape:
    batch, seq, heads, _ = q.shape
    return {"batch": batch, "seq": seq, "heads": heads, "ratio": ratio,
            "topk": 0 if indices is None else indices.shape[2], "window": window}


class _SparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, sink, kvc, indices, ratio, window):
        shape = _shape(q, ratio, indices, window)
        o, lse = _forward(q, kv, kvc, indices, sink, ratio, window, resolve("sparse_attn_fwd", shape)[0])
        ctx.save_for_backward(q, kv, kvc, indices, sink, o, lse)
        ctx.ratio, ctx.window = ratio, window
        return o

    @staticmethod
    def backward(ctx, do):
        q, kv, kvc, indices, sink, o, lse = ctx.saved_tensors
        config, _ = resolve("sparse_attn_bwd", _shape(q, ctx.ratio, indices, ctx.window))
        dq, dkv, dkvc, dsink = _backward(q, kv, kvc, indices, sink, o, lse, do.contiguous(), ctx.ratio,
                                         ctx.window, config)
        return dq, dkv, dsink, dkvc, None, None, None


def sparse_attention(q: Tensor, kv: Tensor, sink: Tensor, compress_ratio: int,
                     kv_compressed: Tensor | None = None, indices: Tensor | None = None,
                     window: int = DEFAULT_WINDOW) -> Tensor:
    """``o [B, S, H, 512]`` bf16 of V4's window (ratio 0), CSA (4) or HCA (other ratios > 0) attention with a sink.

    Contract (``kernels.contracts`` says when value checks run):

    * ``q [B, S, H, 512]`` and ``kv [B, S, 512]`` bf16 (kv is key and value), ``sink [H]`` fp32;
      HCA and CSA also take ``kv_compressed [B, S // ratio, 512]`` bf16 (a trailing partial
      group has no row). All on one device; any strides (copied to contiguous).
    * ``window >= 1``: query s attends ``kv[max(0, s - window + 1) .. s]``.
    * CSA's ``indices [B, S, topk]`` int32 (any topk >= 0): each slot names one compressed row
      ``0 <= t < S // 4`` that query s attends, or is -1 (padding). As in V4's public reference,
      each -1 is skipped on its own, wherever it stands, and every slot is read (a pick listed
      twice counts twice). Picks are not tested for causality (``t < (s + 1) // 4``): the caller's
      indexer owns that, as the project's does. A value outside ``[-1, S // 4)`` is refused where
      values are checked; unchecked, the kernels skip it as padding (they never read out of
      bounds). Cost: each launch first compacts the rows in one pass over ``indices``
      (``_compact_picks``), then a query walks its window and its picks alone.

    Differentiable in q, kv, sink and kv_compressed. Launch parameters come from
    ``kernels.tuning.resolve``.
    """
    _check_shapes(q, kv, sink, compress_ratio, kv_compressed, indices, window)
    _check_dtypes(q, kv, sink, kv_compressed)
    check_same_device(q=q, kv=kv, sink=sink, kv_compressed=kv_compressed, indices=indices)
    contiguous = [None if t is None else t.contiguous() for t in (q, kv, sink, kv_compressed, indices)]
    return _SparseAttention.apply(*contiguous, compress_ratio, window)


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


def entries_attended(shape: Shape) -> int:
    """Entries all queries of the registered inputs attend (CSA: ``make_inputs`` gives query s
    ``min(topk, (s + 1) // 4)`` picks)."""
    s = torch.arange(1, shape["seq"] + 1)  # s + 1
    count = s.clamp(max=shape["window"])
    if shape["ratio"] == CSA_RATIO:
        count = count + (s // CSA_RATIO).clamp(max=shape["topk"])
    elif shape["ratio"]:
        count = count + s // shape["ratio"]
    return shape["batch"] * int(count.sum())


def _flops_fwd(shape: Shape) -> int:
    return 2 * entries_attended(shape) * shape["heads"] * (LATENT_DIM + LATENT_DIM)


def _flops_bwd(shape: Shape) -> int:
    return 5 * _flops_fwd(shape) // 2


def _tensor_bytes(shape: Shape) -> dict[str, int]:
    """Bytes of each tensor a launch must read or write once, by name."""
    batch, seq, heads, ratio = shape["batch"], shape["seq"], shape["heads"], shape["ratio"]
    per_head = _BF16_BYTES * batch * seq * heads * LATENT_DIM
    latent = _BF16_BYTES * batch * seq * LATENT_DIM
    compressed = _BF16_BYTES * batch * (seq // ratio if ratio else 0) * LATENT_DIM
    stats = _FP32_BYTES * batch * seq * heads
    return {"q": per_head, "o": per_head, "do": per_head, "dq": per_head, "kv": latent, "dkv": latent,
            "kv_compressed": compressed, "dkv_compressed": compressed, "lse": stats,
            "indices": _INT32_BYTES * batch * seq * shape["topk"], "sink": _FP32_BYTES * heads,
            "dsink": _FP32_BYTES * heads}


def _bytes_fwd(shape: Shape) -> int:
    sizes = _tensor_bytes(shape)
    return sum(sizes[n] for n in ("q", "kv", "kv_compressed", "indices", "sink", "o", "lse"))


def _bytes_bwd(shape: Shape) -> int:
    sizes = _tensor_bytes(shape)
    return sum(sizes[n] for n in ("q", "kv", "kv_compressed", "indices", "sink", "o", "lse", "do", "dq", "dkv",
                                  "dkv_compressed", "dsink"))


def _random_indices(batch: int, seq: int, topk: int, gen: torch.Generator, device: torch.device) -> Tensor:
    """CSA picks ``[B, S, topk]`` int32: ``min(topk, (s + 1) // 4)`` distinct causal entries in random
    order in the first slots, -1 after (the layout the indexer writes; the kernels read any)."""
    n_comp = seq // CSA_RATIO
    s = torch.arange(seq, device=device)[:, None]
    scores = torch.rand(batch, seq, max(n_comp, topk), generator=gen, device=device)
    causal = torch.arange(scores.shape[2], device=device)[None, :] < (s + 1) // CSA_RATIO
    scores = scores.masked_fill(~causal, -1.0)
    top, picks = scores.topk(topk, dim=-1)
    picks = torch.where(top >= 0, picks, -1)
    keys = torch.rand(batch, seq, topk, generator=gen, device=device) + (picks < 0)  # padding sorts last
    return picks.gather(-1, keys.argsort(-1)).int()


def _make_fwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    """Unit-scale bf16 q, kv and kv_compressed, a unit-scale fp32 sink, random valid CSA picks."""
    gen = torch.Generator(device=device).manual_seed(seed)
    batch, seq, heads, ratio = shape["batch"], shape["seq"], shape["heads"], shape["ratio"]

    def randn(*size: int) -> Tensor:
        return torch.randn(*size, generator=gen, device=device).to(torch.bfloat16)

    inputs: Inputs = {"q": randn(batch, seq, heads, LATENT_DIM), "kv": randn(batch, seq, LATENT_DIM),
                      "sink": torch.randn(heads, generator=gen, device=device)}
    if ratio:
        inputs["kv_compressed"] = randn(batch, seq // ratio, LATENT_DIM)
    if ratio == CSA_RATIO:
        inputs["indices"] = _random_indices(batch, seq, shape["topk"], gen, device)
    return {**inputs, "ratio": ratio, "window": shape["window"]}


def _make_bwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    """The forward's inputs, its o (bf16) and LSE from the reference, and dO.

    dO is unit-scale, narrowed on HCA so that the gradient of the most attended entry (the first
    compressed row: every query from 127 on, against ``window`` for a kv row) stays about unit size.
    """
    inputs = _make_fwd_inputs(shape, device, seed)
    o, lse = _reference_of(inputs)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    fan_in = shape["seq"] if shape["ratio"] not in (0, CSA_RATIO) else shape["window"]
    scale = min(1.0, math.sqrt(shape["window"] / fan_in))
    do = torch.randn(o.shape, generator=gen, device=device).mul_(scale).to(torch.bfloat16)
    return {**inputs, "o": o.to(torch.bfloat16), "lse": lse, "do": do}


def _args(inputs: Inputs) -> tuple[Any, ...]:
    return (inputs["q"], inputs["kv"], inputs.get("kv_compressed"), inputs.get("indices"), inputs["sink"])


def _run_fwd(inputs: Inputs, config: Config, compile_only: bool = False) -> tuple[Tensor, Tensor]:
    return _forward(*_args(inputs), inputs["ratio"], inputs["window"], config, compile_only)


def _run_bwd(inputs: Inputs, config: Config, compile_only: bool = False) -> tuple[Tensor, ...]:
    grads = _backward(*_args(inputs), inputs["o"], inputs["lse"], inputs["do"], inputs["ratio"], inputs["window"],
                      config, compile_only)
    return tuple(g for g in grads if g is not None)


def _reference_of(inputs: Inputs, do: Tensor | None = None) -> tuple[Tensor, ...]:
    q, kv, kvc, indices, sink = _args(inputs)
    return _reference(q, kv, sink, inputs["ratio"], kvc, indices, inputs["window"], do)


def _reference_fwd(inputs: Inputs) -> tuple[Tensor, Tensor]:
    o, lse = _reference_of(inputs)
    return o.to(torch.bfloat16), lse


def _reference_bwd(inputs: Inputs) -> tuple[Tensor, ...]:
    dq, dkv, dkvc, dsink = _reference_of(inputs, inputs["do"])
    return tuple(g.to(dtype) for g, dtype in ((dq, torch.bfloat16), (dkv, torch.bfloat16),
                                              (dkvc, torch.bfloat16), (dsink, torch.float32)) if g is not None)


def _default_fwd_config(shape: Shape) -> Config:
    """Up to 64 heads a program (one block for V4-Flash) on eight warps, which hold the 64 x 512
    fp32 accumulator at 128 registers a thread; 32-entry tiles, 16 for queries of fewer entries;
    the accumulator rescaled every tile."""
    block_h = min(64, max(16, next_pow2(shape["heads"])))
    entries = _max_entries(shape["ratio"], shape["seq"], shape["topk"], shape["window"])
    return {"BLOCK_H": block_h, "TILE_K": 32 if entries > 16 else 16, "num_warps": 8 if block_h == 64 else 4,
            "num_stages": 2, "TAIL_K": 0, "RESCALE_SLACK": 0, "UNCHAINED": 0, "PTX_BARRIER": 0, "GLUON": 0,
            "LATE_FIRST": 0}


def _default_bwd_config(shape: Shape) -> Config:
    """32 heads and 16 entries a program on eight warps (255 registers, no spills on sm_90), atomics."""
    block_h = 32 if shape["heads"] > 16 else 16
    return {"BLOCK_H": block_h, "TILE_K": 16, "num_warps": 8 if block_h == 32 else 4, "num_stages": 1,
            "DKV_MODE": "atomic", "R_CHUNK": 0, "DE_TRANSPOSED": 0, "UNCHAINED": 0, "PTX_BARRIER": 0}


_SHAPE_FIELDS = ("batch", "seq", "heads", "ratio", "topk", "window")
_EXACT_FIELDS = ("heads", "ratio", "window")  # batch, seq and topk: nearest


def _v4_presets(heads: int, topk: int) -> list[Shape]:
    return [{"batch": 1, "seq": seq, "heads": heads, "ratio": ratio, "topk": topk if ratio == CSA_RATIO else 0,
             "window": DEFAULT_WINDOW} for ratio in COMPRESS_RATIOS for seq in (4096, 8192)]


_PRESETS = {
    "v4-flash": _v4_presets(64, 512),
    "v4-pro": _v4_presets(128, 1024),
    # Interpreter sizes: windows shorter than the sequence, seq not a multiple of 4 or 128,
    # heads not a multiple of 16 (20: two blocks of 16, the second mostly masked); CSA queries
    # 0-2 have only -1 picks, queries under 35 fewer than topk; HCA has two compressed rows
    # (queries from 127 see one, from 255 two).
    "small": [{"batch": 2, "seq": 37, "heads": 3, "ratio": 0, "topk": 0, "window": 8},
              {"batch": 2, "seq": 70, "heads": 20, "ratio": CSA_RATIO, "topk": 8, "window": 16},
              {"batch": 1, "seq": 258, "heads": 2, "ratio": HCA_RATIO, "topk": 0, "window": 8}],
}



def _compile_fwd(inputs: Inputs, config: Config) -> None:
    _run_fwd(inputs, config, compile_only=True)


def _compile_bwd(inputs: Inputs, config: Config) -> None:
    _run_bwd(inputs, config, compile_only=True)


register(
    TunableKernel(
        name="sparse_attn_fwd",
        shape_fields=_SHAPE_FIELDS,
        exact_fields=_EXACT_FIELDS,
        make_inputs=_make_fwd_inputs,
        run=_run_fwd,
        reference=_reference_fwd,
        default_config=_default_fwd_config,
        bytes_moved=_bytes_fwd,
        compile=_compile_fwd,
        flops=_flops_fwd,
        atol=1e-2,
        rtol=2e-2,
        presets=_PRESETS,
    )
)
register(
    TunableKernel(
        name="sparse_attn_bwd",
        shape_fields=_SHAPE_FIELDS,
        exact_fields=_EXACT_FIELDS,
        make_inputs=_make_bwd_inputs,
        run=_run_bwd,
        reference=_reference_bwd,
        default_config=_default_bwd_config,
        bytes_moved=_bytes_bwd,
        compile=_compile_bwd,
        flops=_flops_bwd,
        atol=1e-1,
        rtol=2e-2,
        presets=_PRESETS,
    )
)
