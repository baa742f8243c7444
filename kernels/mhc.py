"""mHC (DeepSeek-V4 manifold-constrained hyper-connections): the per-token glue around each sub-layer.

The residual holds four streams, ``h [tokens, 4, D]``. Around every sub-layer:

* ``mhc_glue``: project each token's flattened streams onto 24 logits, the RMS folded in
  after the matmul, and gate them: ``pre`` (4), ``post`` (4) and the 4x4 ``comb`` logits
  that ``kernels.sinkhorn`` turns into the mixing matrix C.
* ``mhc_collapse``: ``u = sum_j pre_j * h_j``, the sub-layer's input.
* ``mhc_expand``: ``h'_k = post_k * f + sum_j C[j, k] * h_j``, with f the sub-layer's output
  (C applied transposed, as in the V4 reference).
* ``mhc_enter``: the glue and the collapse as one op, whose backward gives h one gradient: the
  collapse backward computes dpre alone, and the glue backward adds ``pre_j du`` and the expand's
  gradient of h (h goes to the expand through this op) to its dh. As three ops each wrote a
  ``[tokens, 4, D]`` dh and autograd added them: two bf16 additions a sub-layer, which led the rest
  of the replayed proxy step's device time (27 ms, H100).

Glue forward: each program takes ``BLOCK_N`` tokens and walks the 4D axis in ``BLOCK_K``
chunks, accumulating the ``[BLOCK_N, 32]`` projection (24 rows padded for ``tl.dot``) and the
sum of squares from the same loads, so h is read once. With ``SPLIT_K`` > 1 the 4D axis is
split over that many programs per token block too (4096 tokens are only 64-128 token blocks for
132 SMs): they write fp32 partial sums (33 floats a token per split, under 2% of h's bytes at
SPLIT_K 8, D 4096) that a second launch adds in a fixed order before the gates, ``GATES_BLOCK_N``
tokens a program (0: ``BLOCK_N``; 64-token blocks are 64 programs for 132 SMs at 4,096 tokens); with
``FUSED_GATES`` the last of a token block's split programs to finish does that instead (an
arrival counter a block, zeroed by the fn split's launch), one launch fewer, but 4% slower on
the H200 at 4,096 tokens than the launch it saves. The matmul keeps fp32 accuracy on
bf16 tensor cores (``_dot_split``): fp32 operands are split into bf16 high and low parts
(fn once a call, before the launch, so that no program converts it), and bf16 h is exact as
it is. The fp32 projection m and rstd are saved for the backward
(100 bytes a token, next to 8D bytes of bf16 h).

Glue backward, three launches. A token-local first pass turns the saved m and rstd and the gates'
gradients into the projection's gradient d_proj (split into bf16 high and low parts, 128 bytes a
token) and rstd's factor, and writes per-block sums for dbase and dscale. Then dh is token-local,
but dfn sums over every token: the grid is (token slab, 4D chunk), and each program keeps one
chunk of fn and of its dfn accumulator in registers and walks the tokens of its slab. Each chunk
reads d_proj's two bf16 tiles a token; recomputing the gates in every chunk instead read four
fp32 tiles a token, as many bytes as h's chunk at 16-token steps. It writes its fp32 piece of a
``[slabs, 24, 4D]`` partial buffer, as rmsnorm does for dweight: the summation order is fixed
for a config (deterministic), and ``SLABS`` bounds the buffer: 16 slabs write 9% of the bytes
the kernel must move at 4096 tokens x 4096 hidden (2% at 16384). A closing launch sums it,
and the first pass's dbase and dscale rows, once.

Collapse and expand: each program takes ``BLOCK_T`` tokens and walks D in ``BLOCK_D`` chunks.
A stream is a ``[BLOCK_T, BLOCK_D]`` tile, and the four are combined by a static loop in
registers, so no ``[tokens, 4, D]`` temporary exists; sums over D (dpre, dpost, dC) stay in
fp32 registers across chunks.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.arch import INTERPRETER_ARCH, current_arch
from kernels.contracts import check_same_device
from kernels.grouped_gemm import _mma
from kernels.host_math import cdiv, next_pow2
from kernels.launch import ensure_scratch_allocator, launch, tma_usable
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.rmsnorm import _tile
from kernels.tuning import resolve
from kernels.zero_at_rest import last_to_arrive

STREAMS = 4
DEFAULT_EPS = 1e-6
_N_LOGITS = 24  # 4 pre + 4 post + 16 comb
_N_PAD = 32  # the logits padded to a tile width tl.dot accepts
_GROUPS = ((0, 4), (4, 4), (8, 16))  # (first column, width) of pre, post, comb among the 24 logits
_BF16_BYTES = 2
_FP32_BYTES = 4
_BWD_GATES_TOKENS = 64  # tokens per program of the backward's token-local first pass (fixed: it is small)
_SPLIT_FN_BLOCK = 4096  # fn elements per program of the split (fixed: a 1.5-2.6 MB elementwise pass)
_SUMS_BLOCK = 1024  # dfn elements per program of the backward's closing sums (fixed: one read of the partials)
_SUMS_GATE_ROWS = 64  # token blocks' dbase / dscale rows a step of those sums reads
_S = tl.constexpr(STREAMS)
_LOGITS = tl.constexpr(_N_LOGITS)
_LOGITS_PAD = tl.constexpr(_N_PAD)


# --------------------------------------------------------------------------------------------
# Glue: projection, RMS and gates
# --------------------------------------------------------------------------------------------


@triton.jit
def _bf16_low(x, high):
    """The bf16 rounding of what ``high`` (x's bf16 rounding) leaves of fp32 ``x``: high + low is
    within 2^-18 of x relative (2^-16 on the interpreter, which truncates)."""
    return (x - high.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _dot_split(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` at about fp32 accuracy from bf16 products.

    An fp32 operand is split into its bf16 rounding and the bf16 rounding of the remainder,
    together within 2^-18 relative (2^-16 on the interpreter, which truncates); a bf16 operand
    is exact and has no low part. The low-by-low product, as small, is dropped. ``UPCAST`` is
    ``_mma``'s work-around for the CPU interpreter (the same bf16 values, as fp32 operands).
    """
    a_hi = a.to(tl.bfloat16)
    b_hi = b.to(tl.bfloat16)
    acc = _mma(a_hi, b_hi, acc, UPCAST)
    if b.dtype != tl.bfloat16:
        acc = _mma(a_hi, _bf16_low(b, b_hi), acc, UPCAST)
    if a.dtype != tl.bfloat16:
        acc = _mma(_bf16_low(a, a_hi), b_hi, acc, UPCAST)
    return acc


@triton.jit
def _group_tile(tokens, logits, n_tokens, FIRST: tl.constexpr, WIDTH: tl.constexpr):
    """Offsets and mask of logit columns ``[FIRST, FIRST + WIDTH)`` of a ``[tokens, 32]`` tile
    in their own row-major ``[n_tokens, WIDTH]`` tensor (pre, post, comb, or all 24 of m)."""
    cols = logits - FIRST
    offsets = tokens.to(tl.int64)[:, None] * WIDTH + cols[None, :]
    mask = (tokens < n_tokens)[:, None] & ((cols >= 0) & (cols < WIDTH))[None, :]
    return offsets, mask


@triton.jit
def _store_group(ptr, values, tokens, logits, n_tokens, FIRST: tl.constexpr, WIDTH: tl.constexpr):
    offsets, mask = _group_tile(tokens, logits, n_tokens, FIRST, WIDTH)
    tl.store(ptr + offsets, values, mask=mask)


@triton.jit
def _load_group(ptr, tokens, logits, n_tokens, FIRST: tl.constexpr, WIDTH: tl.constexpr):
    offsets, mask = _group_tile(tokens, logits, n_tokens, FIRST, WIDTH)
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _gate_params(base_ptr, scale_ptr, logits):
    """Per logit column, as ``[1, 32]`` rows: its base and its group's scale (pre, post, comb)."""
    group = (logits >= 4).to(tl.int32) + (logits >= 8).to(tl.int32)
    valid = logits < _LOGITS
    base = tl.load(base_ptr + logits, mask=valid, other=0.0)
    scale = tl.load(scale_ptr + group, mask=valid, other=0.0)
    return base[None, :], scale[None, :]


@triton.jit
def _glue_project(h_ptr, fn_ptr, tokens, logits, n_tokens, width, k_begin, k_end,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """The ``[BLOCK_N, 32]`` projection and the ``[BLOCK_N]`` sum of squares of h over 4D columns
    ``[k_begin, k_end)``, from one read of each h chunk. ``fn_ptr`` holds fn split into bf16 high
    and low parts (``_split_fn``), so a bf16 chunk costs two bf16 MMAs and no conversion of fn."""
    ks = tl.arange(0, BLOCK_K)
    proj = tl.zeros([BLOCK_N, _LOGITS_PAD], dtype=tl.float32)
    sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
    token_rows = tokens.to(tl.int64)[:, None] * width
    logit_rows = logits.to(tl.int64)[:, None] * width
    low_part = _LOGITS * width
    for k0 in range(k_begin, k_end, BLOCK_K):
        cols = k0 + ks
        in_range = (cols < k_end)[None, :]
        x = tl.load(h_ptr + token_rows + cols[None, :], mask=(tokens < n_tokens)[:, None] & in_range, other=0.0)
        w_mask = (logits < _LOGITS)[:, None] & in_range
        w_hi = tl.load(fn_ptr + logit_rows + cols[None, :], mask=w_mask, other=0.0)
        w_lo = tl.load(fn_ptr + low_part + logit_rows + cols[None, :], mask=w_mask, other=0.0)
        proj = _dot_split(x, tl.trans(w_hi), proj, UPCAST)  # one MMA each for bf16 h, two for fp32
        proj = _dot_split(x, tl.trans(w_lo), proj, UPCAST)
        xf = x.to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=1)
    return proj, sum_sq


@triton.jit
def _glue_gates(proj, sum_sq, tokens, logits, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, m_ptr, rstd_ptr,
                n_tokens, width, eps):
    """From the whole projection and sum of squares: rstd and m (saved for the backward), the gates."""
    rstd = tl.rsqrt(sum_sq / width + eps)
    tl.store(rstd_ptr + tokens, rstd, mask=tokens < n_tokens)
    m = proj * rstd[:, None]
    _store_group(m_ptr, m, tokens, logits, n_tokens, 0, _LOGITS)
    base, scale = _gate_params(base_ptr, scale_ptr, logits)
    z = m * scale + base
    gate = tl.sigmoid(z)
    cols = logits[None, :]
    out = tl.where(cols < 4, gate + eps, tl.where(cols < 8, 2.0 * gate, z))
    _store_group(pre_ptr, out, tokens, logits, n_tokens, 0, 4)
    _store_group(post_ptr, out, tokens, logits, n_tokens, 4, 4)
    _store_group(comb_ptr, out, tokens, logits, n_tokens, 8, 16)


@triton.jit
def _sum_partials(part_ptr, tokens, logits, n_tokens, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                  L2_ONLY: tl.constexpr):
    """A token block's ``SPLIT_K`` partial projections and sums of squares, added in a fixed order
    (deterministic). L2_ONLY bypasses the SM's L1, which may hold a line of these rows from before
    another program of the same launch wrote it (rows of neighbouring token blocks share lines)."""
    mask = tokens < n_tokens
    proj = tl.zeros([BLOCK_N, _LOGITS_PAD], dtype=tl.float32)
    sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        rows = (split * n_tokens + tokens).to(tl.int64) * (_LOGITS_PAD + 1)
        if L2_ONLY:
            proj += tl.load(part_ptr + rows[:, None] + logits[None, :], mask=mask[:, None], other=0.0,
                            cache_modifier=".cg")
            sum_sq += tl.load(part_ptr + rows + _LOGITS_PAD, mask=mask, other=0.0, cache_modifier=".cg")
        else:
            proj += tl.load(part_ptr + rows[:, None] + logits[None, :], mask=mask[:, None], other=0.0)
            sum_sq += tl.load(part_ptr + rows + _LOGITS_PAD, mask=mask, other=0.0)
    return proj, sum_sq


@triton.jit
def _glue_fwd_kernel(
    h_ptr, fn_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, m_ptr, rstd_ptr, part_ptr, arrivals_ptr,
    n_tokens, width, eps, k_chunk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    FUSED_GATES: tl.constexpr, UPCAST: tl.constexpr,
):
    """SPLIT_K 1: the whole 4D axis, then the gates. Otherwise program (i, j) writes the projection and
    sum of squares of columns ``[j * k_chunk, (j + 1) * k_chunk)`` as row block i of slab j of the
    ``[SPLIT_K, tokens, 33]`` fp32 ``part_ptr``, and ``_glue_gates_kernel`` adds the slabs; with
    FUSED_GATES the last of the block's programs to finish does, counted in ``arrivals_ptr`` (zeroed by
    ``_split_fn_kernel``), which saves that launch."""
    tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    logits = tl.arange(0, _LOGITS_PAD)
    split = tl.program_id(1)
    k_begin = split * k_chunk
    proj, sum_sq = _glue_project(h_ptr, fn_ptr, tokens, logits, n_tokens, width, k_begin,
                                 tl.minimum(k_begin + k_chunk, width), BLOCK_N, BLOCK_K, UPCAST)
    if SPLIT_K == 1:
        _glue_gates(proj, sum_sq, tokens, logits, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, m_ptr, rstd_ptr,
                    n_tokens, width, eps)
    else:
        rows = (split * n_tokens + tokens).to(tl.int64) * (_LOGITS_PAD + 1)
        mask = tokens < n_tokens
        tl.store(part_ptr + rows[:, None] + logits[None, :], proj, mask=mask[:, None])
        tl.store(part_ptr + rows + _LOGITS_PAD, sum_sq, mask=mask)
        if FUSED_GATES:
            if last_to_arrive(arrivals_ptr, tl.program_id(0), SPLIT_K):
                total, total_sq = _sum_partials(part_ptr, tokens, logits, n_tokens, BLOCK_N, SPLIT_K, True)
                _glue_gates(total, total_sq, tokens, logits, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
                            m_ptr, rstd_ptr, n_tokens, width, eps)


@triton.jit
def _glue_gates_kernel(
    part_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, m_ptr, rstd_ptr, n_tokens, width, eps,
    BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """The split forward's second pass: ``_sum_partials``, then ``_glue_gates``."""
    tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    logits = tl.arange(0, _LOGITS_PAD)
    proj, sum_sq = _sum_partials(part_ptr, tokens, logits, n_tokens, BLOCK_N, SPLIT_K, False)
    _glue_gates(proj, sum_sq, tokens, logits, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, m_ptr, rstd_ptr,
                n_tokens, width, eps)


@triton.jit
def _glue_bwd_gates_kernel(
    base_ptr, scale_ptr, m_ptr, rstd_ptr, dpre_ptr, dpost_ptr, dcomb_ptr, dproj_ptr, drstd_ptr, dgate_partial_ptr,
    n_tokens, width, BLOCK_N: tl.constexpr,
):
    """The backward's token-local first pass: from the saved m and rstd and the gates' gradients,
    the projection's gradient ``d_proj [tokens, 32]`` (stored split into bf16 high and low parts,
    ``[2, tokens, 32]``) and rstd's factor ``d_rstd [tokens]``, and this token block's sums for
    dbase and dscale (one ``[2, 32]`` row per block, summed afterwards: deterministic)."""
    tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    logits = tl.arange(0, _LOGITS_PAD)
    cols = logits[None, :]
    base, scale = _gate_params(base_ptr, scale_ptr, logits)
    m = _load_group(m_ptr, tokens, logits, n_tokens, 0, _LOGITS)
    grad = (
        _load_group(dpre_ptr, tokens, logits, n_tokens, 0, 4)
        + _load_group(dpost_ptr, tokens, logits, n_tokens, 4, 4)
        + _load_group(dcomb_ptr, tokens, logits, n_tokens, 8, 16)
    )
    rstd = tl.load(rstd_ptr + tokens, mask=tokens < n_tokens, other=0.0)
    gate = tl.sigmoid(m * scale + base)
    slope = gate * (1.0 - gate)
    dz = grad * tl.where(cols < 4, slope, tl.where(cols < 8, 2.0 * slope, 1.0))
    dm = dz * scale
    # m = (x @ fn.T) * rstd(x): the matmul's gradient, and rstd's along x.
    d_proj = dm * rstd[:, None]
    d_rstd = rstd * rstd / width * tl.sum(dm * m, axis=1)
    high = d_proj.to(tl.bfloat16)
    offsets, mask = _tile(tokens, logits, n_tokens, _LOGITS_PAD)
    tl.store(dproj_ptr + offsets, high, mask=mask)
    tl.store(dproj_ptr + n_tokens * _LOGITS_PAD + offsets, _bf16_low(d_proj, high), mask=mask)
    tl.store(drstd_ptr + tokens, d_rstd, mask=tokens < n_tokens)
    row = dgate_partial_ptr + tl.program_id(0) * 2 * _LOGITS_PAD
    tl.store(row + logits, tl.sum(dz, axis=0))
    tl.store(row + _LOGITS_PAD + logits, tl.sum(dz * m, axis=0))


@triton.jit
def _glue_bwd_kernel(
    h_ref, fn_ptr, dproj_ref, drstd_ptr, dh_ref, dfn_partial_ptr, pre_ptr, du_ptr, dh_in_ptr, n_tokens, width,
    tokens_per_slab, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DFN_TRANSPOSED: tl.constexpr, TMA: tl.constexpr,
    UPCAST: tl.constexpr, COLLAPSE: tl.constexpr,
):
    """dh of one 4D chunk over the tokens of one slab, and that slab's dfn for the chunk, from the
    first pass's split d_proj: two bf16 tiles and one float a token, where recomputing the gates
    read four fp32 tiles a token for every chunk. DFN_TRANSPOSED accumulates dfn as its
    ``[BLOCK_K, 32]`` transpose: the same sums, as dots whose M is BLOCK_K rather than the 32
    logit rows, which sm_90 runs as wgmma (M >= 64). With TMA, the h, d_proj and dh tiles move by the
    tensor-memory accelerator, past the tokens zero-filled on load and clipped on store, where
    pointers cost per-element addresses and masks in the L1 path (the kernel's limit under Nsight
    Compute): TMA 1 takes descriptors encoded on the host (``_glue_bwd_operands``; 38 us
    a call at 4,096 tokens on the H200), TMA 2 the tensors, and each program builds
    the descriptors on the device. d_proj's ``[2, tokens, 32]`` descriptor reads one part at a time,
    so the high part's rows past the tokens are zeros, not the low part's. COLLAPSE (``mhc_enter``):
    dh also takes the collapse's gradient ``pre_j du`` from fp32 ``pre [tokens, 4]`` and
    ``du [tokens, D]``, and the rest of h's gradient, ``dh_in [tokens, 4D]`` (the expand's), which
    autograd would otherwise add to it."""
    slab = tl.program_id(0)
    if TMA == 2:
        h_ref = tl.make_tensor_descriptor(h_ref, [n_tokens, width], [width, 1], [BLOCK_N, BLOCK_K])
        dh_ref = tl.make_tensor_descriptor(dh_ref, [n_tokens, width], [width, 1], [BLOCK_N, BLOCK_K])
        dproj_ref = tl.make_tensor_descriptor(dproj_ref, [2, n_tokens, _LOGITS_PAD],
                                              [n_tokens * _LOGITS_PAD, _LOGITS_PAD, 1], [1, BLOCK_N, _LOGITS_PAD])
    logits = tl.arange(0, _LOGITS_PAD)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    w_offsets, w_mask = _tile(logits, ks, _LOGITS, width)
    w = tl.load(fn_ptr + w_offsets, mask=w_mask, other=0.0)
    w_hi = w.to(tl.bfloat16)
    w_lo = _bf16_low(w, w_hi)
    if DFN_TRANSPOSED:
        dfn = tl.zeros([BLOCK_K, _LOGITS_PAD], dtype=tl.float32)
    else:
        dfn = tl.zeros([_LOGITS_PAD, BLOCK_K], dtype=tl.float32)
    first_token = slab * tokens_per_slab
    last_token = tl.minimum(first_token + tokens_per_slab, n_tokens)
    # Every slab holds a token, so the loop runs at least once; written so that ptxas can see it:
    # with a loop that may run no step, Triton 3.6's ptxas serialized all 14 of its wgmmas (C7515,
    # offline sm_90 compile of the tuned 4,096-token config; ``kernels.grouped_gemm``'s weight
    # gradients had the same).
    for step in range(0, tl.maximum(1, tl.cdiv(last_token - first_token, BLOCK_N))):
        t0 = first_token + step * BLOCK_N
        tokens = t0 + tl.arange(0, BLOCK_N)
        d_rstd = tl.load(drstd_ptr + tokens, mask=tokens < n_tokens, other=0.0)
        x_offsets, x_mask = _tile(tokens, ks, n_tokens, width)
        if TMA:
            dp_hi = dproj_ref.load([0, t0, 0]).reshape([BLOCK_N, _LOGITS_PAD])
            dp_lo = dproj_ref.load([1, t0, 0]).reshape([BLOCK_N, _LOGITS_PAD])
            x = h_ref.load([t0, tl.program_id(1) * BLOCK_K])
        else:
            p_offsets, p_mask = _tile(tokens, logits, n_tokens, _LOGITS_PAD)
            dp_hi = tl.load(dproj_ref + p_offsets, mask=p_mask, other=0.0)
            dp_lo = tl.load(dproj_ref + n_tokens * _LOGITS_PAD + p_offsets, mask=p_mask, other=0.0)
            x = tl.load(h_ref + x_offsets, mask=x_mask, other=0.0)
        # dx = d_proj @ fn at about fp32 accuracy: the three products above the low-by-low one.
        dx = _mma(dp_hi, w_hi, tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32), UPCAST)
        dx = _mma(dp_hi, w_lo, dx, UPCAST)
        dx = _mma(dp_lo, w_hi, dx, UPCAST)
        dx -= d_rstd[:, None] * x.to(tl.float32)
        if COLLAPSE:
            hidden = width // _S
            stream = ks // hidden
            pre_j = tl.load(pre_ptr + tokens.to(tl.int64)[:, None] * _S + stream[None, :], mask=x_mask, other=0.0)
            du = tl.load(du_ptr + tokens.to(tl.int64)[:, None] * hidden + (ks - stream * hidden)[None, :],
                         mask=x_mask, other=0.0)
            dx += pre_j * du.to(tl.float32)
            dx += tl.load(dh_in_ptr + x_offsets, mask=x_mask, other=0.0).to(tl.float32)
        if TMA:
            dh_ref.store([t0, tl.program_id(1) * BLOCK_K], dx.to(dh_ref.dtype))
        else:
            tl.store(dh_ref + x_offsets, dx.to(dh_ref.dtype.element_ty), mask=x_mask)
        if DFN_TRANSPOSED:
            dfn = _dot_split(tl.trans(x), dp_lo, _dot_split(tl.trans(x), dp_hi, dfn, UPCAST), UPCAST)
        else:
            dfn = _dot_split(tl.trans(dp_hi), x, dfn, UPCAST)  # one MMA each for bf16 h, two for fp32
            dfn = _dot_split(tl.trans(dp_lo), x, dfn, UPCAST)
    if DFN_TRANSPOSED:
        dfn = tl.trans(dfn)
    tl.store(dfn_partial_ptr + slab.to(tl.int64) * _LOGITS * width + w_offsets, dfn, mask=w_mask)


@triton.jit
def _glue_bwd_sums_kernel(
    dfn_partial_ptr, dgate_partial_ptr, dfn_ptr, dbase_ptr, dscale_ptr, slabs, gate_blocks, n_dfn,
    BLOCK: tl.constexpr, GATE_ROWS: tl.constexpr,
):
    """The backward's closing sums in one launch, each in a fixed order (deterministic): dfn
    over the slabs' partials, ``BLOCK`` entries a program, and in program 0 dbase and the three
    dscale groups over the token blocks' ``[2, 32]`` rows. Six torch reductions did this before,
    a fifth of the whole backward's device time at 4096 tokens x 4096 hidden (Nsight Compute,
    2026-12-02)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_dfn
    dfn = tl.zeros([BLOCK], dtype=tl.float32)
    for slab in range(slabs):
        dfn += tl.load(dfn_partial_ptr + slab * n_dfn + offsets, mask=mask, other=0.0)
    tl.store(dfn_ptr + offsets, dfn, mask=mask)
    if tl.program_id(0) == 0:
        logits = tl.arange(0, _LOGITS_PAD)
        dbase = tl.zeros([_LOGITS_PAD], dtype=tl.float32)
        dscale_cols = tl.zeros([_LOGITS_PAD], dtype=tl.float32)
        for first in range(0, gate_blocks, GATE_ROWS):
            rows = first + tl.arange(0, GATE_ROWS)
            row_offsets = rows[:, None] * 2 * _LOGITS_PAD + logits[None, :]
            row_mask = (rows < gate_blocks)[:, None]
            dbase += tl.sum(tl.load(dgate_partial_ptr + row_offsets, mask=row_mask, other=0.0), axis=0)
            dscale_cols += tl.sum(
                tl.load(dgate_partial_ptr + _LOGITS_PAD + row_offsets, mask=row_mask, other=0.0), axis=0)
        tl.store(dbase_ptr + logits, dbase, mask=logits < _LOGITS)
        group = (logits >= 4).to(tl.int32) + (logits >= 8).to(tl.int32)  # pre, post, comb (_GROUPS)
        for g in tl.static_range(3):
            tl.store(dscale_ptr + g, tl.sum(tl.where((group == g) & (logits < _LOGITS), dscale_cols, 0.0)))


@triton.jit
def _split_fn_kernel(fn_ptr, out_ptr, n, arrivals_ptr, n_arrivals, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    w = tl.load(fn_ptr + offsets, mask=mask, other=0.0)
    high = w.to(tl.bfloat16)
    tl.store(out_ptr + offsets, high, mask=mask)
    tl.store(out_ptr + n + offsets, _bf16_low(w, high), mask=mask)
    tl.store(arrivals_ptr + offsets, tl.zeros([BLOCK], dtype=tl.int32), mask=offsets < n_arrivals)


def _split_fn(fn: torch.Tensor, compile_only: bool, arrivals: torch.Tensor | None = None) -> torch.Tensor:
    """``[2, 24, 4D]`` bf16: fn's bf16 rounding, then the bf16 rounding of the remainder (``_dot_split``'s
    split, done once a call rather than in every program: 1.5 MB of fp32 at D 4096, against the
    forward's 134 MB of h at 4,096 tokens). One launch: as five torch ops it took 9 us of device
    time, a sixth of the whole forward at 4,096 tokens (docs/findings.md, mHC). It also zeroes
    the int32 ``arrivals`` counters of a FUSED_GATES forward, which runs after it on the stream."""
    out = torch.empty((2, *fn.shape), dtype=torch.bfloat16, device=fn.device)
    n_arrivals = 0 if arrivals is None else arrivals.numel()  # none: ``out`` stands in, nothing is stored
    launch(_split_fn_kernel, (cdiv(max(fn.numel(), n_arrivals), _SPLIT_FN_BLOCK),),
           (fn, out, fn.numel(), out if arrivals is None else arrivals, n_arrivals),
           {"BLOCK": _SPLIT_FN_BLOCK}, {"num_warps": 4}, compile_only)
    return out


def _glue_forward(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float, config: Config,
    compile_only: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Launch the forward on contiguous ``h [tokens, 4D]``; returns ``(pre, post, comb, m, rstd)``."""
    n_tokens, width = h.shape
    fp32 = {"dtype": torch.float32, "device": h.device}
    pre, post = torch.empty(n_tokens, STREAMS, **fp32), torch.empty(n_tokens, STREAMS, **fp32)
    comb = torch.empty(n_tokens, STREAMS, STREAMS, **fp32)
    m, rstd = torch.empty(n_tokens, _N_LOGITS, **fp32), torch.empty(n_tokens, **fp32)
    block_n, block_k = config["BLOCK_N"], config["BLOCK_K"]
    split = config.get("SPLIT_K", 1)
    # Whole BLOCK_K steps per split; a split past the end of 4D adds zeros.
    k_chunk = cdiv(cdiv(width, split), block_k) * block_k
    part = torch.empty(split, n_tokens, _N_PAD + 1, **fp32) if split > 1 else m
    blocks = cdiv(n_tokens, block_n)
    fused_gates = split > 1 and bool(config.get("FUSED_GATES"))  # configs tuned before FUSED_GATES lack it
    arrivals = torch.empty(blocks, dtype=torch.int32, device=h.device) if fused_gates else None
    interpreted = current_arch() == INTERPRETER_ARCH
    launch(
        _glue_fwd_kernel,
        (blocks, split),
        (h, _split_fn(fn, compile_only, arrivals), base, scale, pre, post, comb, m, rstd, part,
         m if arrivals is None else arrivals, n_tokens, width, eps, k_chunk),  # m: unread without FUSED_GATES
        {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "FUSED_GATES": fused_gates, "UPCAST": interpreted},
        config,
        compile_only,
    )
    if split > 1 and not fused_gates:
        gates_block = config.get("GATES_BLOCK_N") or block_n  # 0 (or a config from before it): BLOCK_N
        launch(
            _glue_gates_kernel,
            (cdiv(n_tokens, gates_block),),
            (part, base, scale, pre, post, comb, m, rstd, n_tokens, width, eps),
            {"BLOCK_N": gates_block, "SPLIT_K": split},
            {"num_warps": 4},
            compile_only,
        )
    return pre, post, comb, m, rstd


def _glue_bwd_operands(h: torch.Tensor, dproj: torch.Tensor, dh: torch.Tensor,
                       config: Config) -> tuple[Any, Any, Any, int]:
    """The main backward kernel's h, d_proj and dh arguments and its TMA mode: the tensors (pointers, or
    TMA 2, whose descriptors the kernel builds), or with TMA 1 host-encoded descriptors over them (h and
    dh ``[tokens, 4D]`` in ``[BLOCK_N, BLOCK_K]`` boxes; d_proj ``[2, tokens, 32]`` in one part's
    ``[1, BLOCK_N, 32]`` box). Tensors TMA cannot address take the pointer path."""
    if not tma_usable(config, h, dproj, dh):
        return h, dproj, dh, 0
    if config["TMA"] == 2:
        ensure_scratch_allocator()  # the kernel's descriptors live in Triton's global scratch
        return h, dproj, dh, 2
    box = [config["BLOCK_N"], config["BLOCK_K"]]
    return (TensorDescriptor.from_tensor(h, box), TensorDescriptor.from_tensor(dproj, [1, config["BLOCK_N"], _N_PAD]),
            TensorDescriptor.from_tensor(dh, box), 1)


def _glue_backward(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, m: torch.Tensor,
    rstd: torch.Tensor, dpre: torch.Tensor, dpost: torch.Tensor, dcomb: torch.Tensor, config: Config,
    compile_only: bool = False, collapse: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Launch the backward on contiguous tensors (fp32 gradients); returns ``(dh, dfn, dbase, dscale)``.
    ``collapse`` (``mhc_enter``): the collapse's fp32 ``pre [tokens, 4]`` and ``du [tokens, D]``, and the
    rest of h's gradient ``dh_in [tokens, 4D]``, contiguous, which dh then includes with ``pre_j du``."""
    n_tokens, width = h.shape
    block_n = config["BLOCK_N"]
    token_blocks = cdiv(n_tokens, block_n)
    tokens_per_slab = max(1, cdiv(token_blocks, max(1, min(config["SLABS"], token_blocks)))) * block_n
    slabs = cdiv(n_tokens, tokens_per_slab)
    dh = torch.empty_like(h)
    dfn_partial = torch.empty(slabs, _N_LOGITS, width, dtype=torch.float32, device=h.device)
    dproj = torch.empty(2, n_tokens, _N_PAD, dtype=torch.bfloat16, device=h.device)
    drstd = torch.empty(n_tokens, dtype=torch.float32, device=h.device)
    gate_blocks = cdiv(n_tokens, _BWD_GATES_TOKENS)
    dgate_partial = torch.empty(gate_blocks, 2, _N_PAD, dtype=torch.float32, device=h.device)
    launch(
        _glue_bwd_gates_kernel,
        (gate_blocks,),
        (base, scale, m, rstd, dpre, dpost, dcomb, dproj, drstd, dgate_partial, n_tokens, width),
        {"BLOCK_N": _BWD_GATES_TOKENS},
        {"num_warps": 4},
        compile_only,
    )
    h_ref, dproj_ref, dh_ref, tma = _glue_bwd_operands(h, dproj, dh, config)
    launch(
        _glue_bwd_kernel,
        (slabs, cdiv(width, config["BLOCK_K"])),
        (h_ref, fn, dproj_ref, drstd, dh_ref, dfn_partial, *(collapse or (drstd,) * 3), n_tokens, width,
         tokens_per_slab),  # drstd: never read without COLLAPSE
        {"BLOCK_N": block_n, "BLOCK_K": config["BLOCK_K"], "DFN_TRANSPOSED": bool(config.get("DFN_TRANSPOSED")),  # older configs lack it
         "TMA": tma, "UPCAST": current_arch() == INTERPRETER_ARCH, "COLLAPSE": collapse is not None},
        config,
        compile_only,
    )
    dfn = torch.empty(_N_LOGITS, width, dtype=torch.float32, device=h.device)
    dbase = torch.empty(_N_LOGITS, dtype=torch.float32, device=h.device)
    dscale = torch.empty(len(_GROUPS), dtype=torch.float32, device=h.device)
    launch(
        _glue_bwd_sums_kernel,
        (cdiv(dfn.numel(), _SUMS_BLOCK),),
        (dfn_partial, dgate_partial, dfn, dbase, dscale, slabs, gate_blocks, dfn.numel()),
        {"BLOCK": _SUMS_BLOCK, "GATE_ROWS": _SUMS_GATE_ROWS},
        {"num_warps": 4},
        compile_only,
    )
    return dh, dfn, dbase, dscale


def _resolved(kernel: str, n_tokens: int, hidden: int) -> Config:
    config, _ = resolve(kernel, {"tokens": n_tokens, "hidden": hidden})
    return config


def _check_residual(h: torch.Tensor) -> None:
    if h.dim() < 2 or h.shape[-2] != STREAMS or h.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"h must be [..., {STREAMS}, D] in bfloat16 or float32, got {list(h.shape)} {h.dtype}")


def _check_fp32(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape or tensor.dtype != torch.float32:
        raise ValueError(f"{name} must be {list(shape)} float32, got {list(tensor.shape)} {tensor.dtype}")


class _Glue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float):
        flat = h.reshape(-1, fn.shape[1]).contiguous()
        pre, post, comb, m, rstd = _glue_forward(
            flat, fn, base, scale, eps, _resolved("mhc_glue_fwd", flat.shape[0], h.shape[-1])
        )
        ctx.save_for_backward(flat, fn, base, scale, m, rstd)
        ctx.h_shape = h.shape
        lead = h.shape[:-2]
        return pre.view(*lead, STREAMS), post.view(*lead, STREAMS), comb.view(*lead, STREAMS, STREAMS)

    @staticmethod
    def backward(ctx, dpre: torch.Tensor, dpost: torch.Tensor, dcomb: torch.Tensor):
        flat, fn, base, scale, m, rstd = ctx.saved_tensors
        n_tokens = flat.shape[0]
        grads = (g.reshape(n_tokens, -1).float().contiguous() for g in (dpre, dpost, dcomb))
        dh, dfn, dbase, dscale = _glue_backward(
            flat, fn, base, scale, m, rstd, *grads, _resolved("mhc_glue_bwd", n_tokens, ctx.h_shape[-1])
        )
        return dh.view(ctx.h_shape), dfn, dbase, dscale, None


def mhc_glue(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gates of one mHC sub-layer from the residual ``h [..., 4, D]`` (bf16 or fp32).

    Contract: ``h [..., 4, D]`` bf16 or fp32, any strides (copied); ``fn [24, 4D]``, ``base [24]``
    and ``scale [3]`` fp32; all on one device. Returns fp32 ``pre [..., 4]``,
    ``post [..., 4]`` and the Sinkhorn logits ``comb [..., 4, 4]``; differentiable in h and in
    every parameter. Launch parameters come from ``kernels.tuning.resolve``.
    """
    _check_glue_inputs(h, fn, base, scale)
    return _Glue.apply(h, fn.contiguous(), base.contiguous(), scale.contiguous(), eps)


def _check_glue_inputs(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor) -> None:
    _check_residual(h)
    check_same_device(h=h, fn=fn, base=base, scale=scale)
    _check_fp32("fn", fn, (_N_LOGITS, STREAMS * h.shape[-1]))
    _check_fp32("base", base, (_N_LOGITS,))
    _check_fp32("scale", scale, (3,))


def mhc_glue_reference(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager (differentiable) fp32 math of ``mhc_glue``, as the V4 reference writes it."""
    xf = h.flatten(-2).float()
    m = (xf @ fn.T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    pre = torch.sigmoid(m[..., :4] * scale[0] + base[:4]) + eps
    post = 2 * torch.sigmoid(m[..., 4:8] * scale[1] + base[4:8])
    comb = m[..., 8:] * scale[2] + base[8:]
    return pre, post, comb.unflatten(-1, (STREAMS, STREAMS))


# --------------------------------------------------------------------------------------------
# Collapse and expand: mixing the four streams
# --------------------------------------------------------------------------------------------


@triton.jit
def _stream_tile(tokens, cols, n_tokens, hidden, stream):
    """Offsets and mask of one stream's ``[tokens, cols]`` tile of a ``[n_tokens, 4, hidden]`` tensor."""
    return _tile(tokens * _S + stream, cols, n_tokens * _S, hidden)


@triton.jit
def _streams_tile(tokens, cols, n_tokens, hidden):
    """Offsets and mask of the ``[tokens, 4, cols]`` tile of a ``[n_tokens, 4, hidden]`` tensor."""
    rows = tokens[:, None] * _S + tl.arange(0, _S)[None, :]
    offsets = rows.to(tl.int64)[:, :, None] * hidden + cols[None, None, :]
    mask = (tokens < n_tokens)[:, None, None] & (cols < hidden)[None, None, :]
    return offsets, mask


@triton.jit
def _load_stream(ptr, tokens, cols, n_tokens, hidden, stream):
    offsets, mask = _stream_tile(tokens, cols, n_tokens, hidden, stream)
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _stream_weight(ptr, tokens, n_tokens, stream):
    """Column ``stream`` of a per-token ``[n_tokens, 4]`` fp32 weight (pre or post), as ``[tokens]``."""
    return tl.load(ptr + tokens.to(tl.int64) * _S + stream, mask=tokens < n_tokens, other=0.0)


@triton.jit
def _load_small(ptr, tokens, cols, n_tokens, n_cols):
    """The ``[tokens, cols]`` tile of a small per-token fp32 tensor ``[n_tokens, n_cols]``."""
    offsets, mask = _tile(tokens, cols, n_tokens, n_cols)
    return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _collapse_fwd_kernel(h_ptr, pre_ptr, u_ptr, n_tokens, hidden, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    for d0 in range(0, hidden, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        u = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(_S):
            u += _stream_weight(pre_ptr, tokens, n_tokens, j)[:, None] * _load_stream(
                h_ptr, tokens, cols, n_tokens, hidden, j
            )
        offsets, mask = _tile(tokens, cols, n_tokens, hidden)
        tl.store(u_ptr + offsets, u.to(u_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _collapse_bwd_kernel(
    h_ptr, pre_ptr, du_ptr, dh_ptr, dpre_ptr, n_tokens, hidden, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    STORE_DH: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    streams = tl.arange(0, _S)
    dpre = tl.zeros([BLOCK_T, _S], dtype=tl.float32)
    for d0 in range(0, hidden, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        offsets, mask = _tile(tokens, cols, n_tokens, hidden)
        du = tl.load(du_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        for j in tl.static_range(_S):
            h_offsets, h_mask = _stream_tile(tokens, cols, n_tokens, hidden, j)
            h_j = tl.load(h_ptr + h_offsets, mask=h_mask, other=0.0).to(tl.float32)
            if STORE_DH:  # without it, the glue backward adds pre_j du to its dh (``mhc_enter``)
                dh_j = _stream_weight(pre_ptr, tokens, n_tokens, j)[:, None] * du
                tl.store(dh_ptr + h_offsets, dh_j.to(dh_ptr.dtype.element_ty), mask=h_mask)
            dpre += tl.where(streams[None, :] == j, tl.sum(du * h_j, axis=1)[:, None], 0.0)
    offsets, mask = _tile(tokens, streams, n_tokens, _S)
    tl.store(dpre_ptr + offsets, dpre, mask=mask)


@triton.jit
def _expand_fwd_kernel(
    f_ptr, h_ptr, post_ptr, comb_ptr, out_ptr, n_tokens, hidden, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    streams = tl.arange(0, _S)
    post = _load_small(post_ptr, tokens, streams, n_tokens, _S)
    for d0 in range(0, hidden, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        offsets, mask = _tile(tokens, cols, n_tokens, hidden)
        f = tl.load(f_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        out = post[:, :, None] * f[:, None, :]
        for j in tl.static_range(_S):
            comb_j = _load_small(comb_ptr, tokens, streams + j * _S, n_tokens, _S * _S)  # C[t, j, :]
            out += comb_j[:, :, None] * _load_stream(h_ptr, tokens, cols, n_tokens, hidden, j)[:, None, :]
        offsets, mask = _streams_tile(tokens, cols, n_tokens, hidden)
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _expand_bwd_kernel(
    f_ptr, h_ptr, post_ptr, comb_ptr, dout_ptr, df_ptr, dh_ptr, dpost_ptr, dcomb_ptr, n_tokens, hidden,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    streams = tl.arange(0, _S)
    dpost = tl.zeros([BLOCK_T, _S], dtype=tl.float32)
    dcomb = tl.zeros([BLOCK_T, _S, _S], dtype=tl.float32)  # [t, j, k]
    for d0 in range(0, hidden, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        offsets, mask = _tile(tokens, cols, n_tokens, hidden)
        f = tl.load(f_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        h_offsets, h_mask = _streams_tile(tokens, cols, n_tokens, hidden)
        h = tl.load(h_ptr + h_offsets, mask=h_mask, other=0.0).to(tl.float32)
        df = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        dh = tl.zeros([BLOCK_T, _S, BLOCK_D], dtype=tl.float32)
        for k in tl.static_range(_S):
            grad = _load_stream(dout_ptr, tokens, cols, n_tokens, hidden, k)
            df += _stream_weight(post_ptr, tokens, n_tokens, k)[:, None] * grad
            comb_k = _load_small(comb_ptr, tokens, streams * _S + k, n_tokens, _S * _S)  # C[t, :, k]
            dh += comb_k[:, :, None] * grad[:, None, :]
            dpost += tl.where(streams[None, :] == k, tl.sum(grad * f, axis=1)[:, None], 0.0)
            dcomb += tl.where(streams[None, None, :] == k, tl.sum(h * grad[:, None, :], axis=2)[:, :, None], 0.0)
        tl.store(df_ptr + offsets, df.to(df_ptr.dtype.element_ty), mask=mask)
        tl.store(dh_ptr + h_offsets, dh.to(dh_ptr.dtype.element_ty), mask=h_mask)
    offsets, mask = _tile(tokens, streams, n_tokens, _S)
    tl.store(dpost_ptr + offsets, dpost, mask=mask)
    offsets, mask = _streams_tile(tokens, streams, n_tokens, _S)
    tl.store(dcomb_ptr + offsets, dcomb, mask=mask)


def _launch_streams(kernel, args: tuple, n_tokens: int, hidden: int, config: Config, compile_only: bool,
                    **flags: bool) -> None:
    """Launch a collapse/expand kernel: ``BLOCK_T`` tokens a program, D walked in ``BLOCK_D`` chunks;
    ``flags``: the kernel's own constexprs."""
    launch(
        kernel,
        (cdiv(n_tokens, config["BLOCK_T"]),),
        (*args, n_tokens, hidden),
        {"BLOCK_T": config["BLOCK_T"], "BLOCK_D": min(config["BLOCK_D"], next_pow2(hidden)), **flags},
        config,
        compile_only,
    )


def _collapse_forward(h: torch.Tensor, pre: torch.Tensor, config: Config, compile_only: bool = False) -> torch.Tensor:
    """Launch on contiguous ``h [tokens, 4, D]`` and fp32 ``pre [tokens, 4]``; returns ``u [tokens, D]``."""
    n_tokens, _, hidden = h.shape
    u = h.new_empty(n_tokens, hidden)
    _launch_streams(_collapse_fwd_kernel, (h, pre, u), n_tokens, hidden, config, compile_only)
    return u


def _collapse_backward(
    h: torch.Tensor, pre: torch.Tensor, du: torch.Tensor, config: Config, compile_only: bool = False,
    store_dh: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Launch on contiguous tensors; returns ``(dh, dpre)``, dh None without ``store_dh`` (``mhc_enter``:
    the glue backward adds it to its own)."""
    n_tokens, _, hidden = h.shape
    dh, dpre = torch.empty_like(h) if store_dh else None, torch.empty_like(pre)
    _launch_streams(_collapse_bwd_kernel, (h, pre, du, h if dh is None else dh, dpre), n_tokens, hidden, config,
                    compile_only, STORE_DH=store_dh)  # h: never written without STORE_DH
    return dh, dpre


def _expand_forward(
    f: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, config: Config,
    compile_only: bool = False,
) -> torch.Tensor:
    """Launch on contiguous ``f [tokens, D]``, ``h [tokens, 4, D]``, fp32 ``post`` and ``comb``; returns h'."""
    n_tokens, _, hidden = h.shape
    out = torch.empty_like(h)
    _launch_streams(_expand_fwd_kernel, (f, h, post, comb, out), n_tokens, hidden, config, compile_only)
    return out


def _expand_backward(
    f: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, dout: torch.Tensor, config: Config,
    compile_only: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Launch on contiguous tensors; returns ``(df, dh, dpost, dcomb)``."""
    n_tokens, _, hidden = h.shape
    df, dh, dpost, dcomb = (torch.empty_like(t) for t in (f, h, post, comb))
    _launch_streams(
        _expand_bwd_kernel, (f, h, post, comb, dout, df, dh, dpost, dcomb), n_tokens, hidden, config, compile_only
    )
    return df, dh, dpost, dcomb


def _token_major(t: torch.Tensor, *tail: int) -> torch.Tensor:
    """``t`` as a contiguous ``[tokens, *tail]`` tensor."""
    return t.reshape(-1, *tail).contiguous()


class _Collapse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        hidden = h.shape[-1]
        h3, pre2 = _token_major(h, STREAMS, hidden), _token_major(pre, STREAMS)
        u = _collapse_forward(h3, pre2, _resolved("mhc_collapse_fwd", h3.shape[0], hidden))
        ctx.save_for_backward(h3, pre2)
        ctx.shapes = h.shape, pre.shape
        return u.view(*h.shape[:-2], hidden)

    @staticmethod
    def backward(ctx, du: torch.Tensor):
        h3, pre2 = ctx.saved_tensors
        n_tokens, _, hidden = h3.shape
        dh, dpre = _collapse_backward(
            h3, pre2, _token_major(du, hidden), _resolved("mhc_collapse_bwd", n_tokens, hidden)
        )
        h_shape, pre_shape = ctx.shapes
        return dh.view(h_shape), dpre.view(pre_shape)


class _Expand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, f: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        hidden = h.shape[-1]
        flat = (_token_major(f, hidden), _token_major(h, STREAMS, hidden), _token_major(post, STREAMS),
                _token_major(comb, STREAMS, STREAMS))
        out = _expand_forward(*flat, _resolved("mhc_expand_fwd", flat[0].shape[0], hidden))
        ctx.save_for_backward(*flat)
        ctx.shapes = tuple(t.shape for t in (f, h, post, comb))
        return out.view(h.shape)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        f, h, post, comb = ctx.saved_tensors
        n_tokens, _, hidden = h.shape
        grads = _expand_backward(
            f, h, post, comb, _token_major(dout, STREAMS, hidden), _resolved("mhc_expand_bwd", n_tokens, hidden)
        )
        return tuple(g.view(shape) for g, shape in zip(grads, ctx.shapes))


def mhc_collapse(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``u = sum_j pre_j * h_j``: the sub-layer input from ``h [..., 4, D]`` and fp32 ``pre [..., 4]``.

    Contract: ``h [..., 4, D]`` bf16 or fp32, ``pre [..., 4]`` fp32 on h's device, any strides
    (copied). u has h's dtype, accumulated in fp32; differentiable in h and pre.
    """
    _check_residual(h)
    check_same_device(h=h, pre=pre)
    _check_fp32("pre", pre, (*h.shape[:-1],))
    return _Collapse.apply(h, pre)


def mhc_expand(f: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """``h'_k = post_k * f + sum_j comb[j, k] * h_j``: the residual after a sub-layer.

    Contract: ``h [..., 4, D]`` bf16 or fp32; ``f [..., D]``, the sub-layer's output, in h's
    dtype; ``post [..., 4]`` and the Sinkhorn matrix ``comb [..., 4, 4]`` fp32; all on one
    device, any strides (copied). h' has h's shape and dtype, accumulated in fp32;
    differentiable in every input.
    """
    _check_residual(h)
    check_same_device(f=f, h=h, post=post, comb=comb)
    if f.shape != h.shape[:-2] + h.shape[-1:] or f.dtype != h.dtype:
        raise ValueError(f"f must be {list(h.shape[:-2] + h.shape[-1:])} {h.dtype}, got {list(f.shape)} {f.dtype}")
    _check_fp32("post", post, (*h.shape[:-1],))
    _check_fp32("comb", comb, (*h.shape[:-1], STREAMS))
    return _Expand.apply(f, h, post, comb)


class _Entry(torch.autograd.Function):
    """The glue and the collapse of one sub-layer's entry as one op, for one dh in the backward: the
    collapse backward computes dpre alone and the glue backward adds ``pre_j du`` to its dh, where
    two ops left autograd to add their two ``[tokens, 4, D]`` gradients (and the collapse to write one).
    It also returns h itself (a view), for the sub-layer's expand: the expand's gradient of h comes
    back through this op, and the glue backward adds it too, where autograd added a third."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float):
        hidden = h.shape[-1]
        flat = h.reshape(-1, STREAMS * hidden).contiguous()
        n_tokens = flat.shape[0]
        pre, post, comb, m, rstd = _glue_forward(flat, fn, base, scale, eps, _resolved("mhc_glue_fwd", n_tokens, hidden))
        u = _collapse_forward(flat.view(n_tokens, STREAMS, hidden), pre, _resolved("mhc_collapse_fwd", n_tokens, hidden))
        ctx.save_for_backward(flat, fn, base, scale, m, rstd, pre)
        ctx.h_shape = h.shape
        lead = h.shape[:-2]
        return u.view(*lead, hidden), post.view(*lead, STREAMS), comb.view(*lead, STREAMS, STREAMS), h.view_as(h)

    @staticmethod
    def backward(ctx, du: torch.Tensor, dpost: torch.Tensor, dcomb: torch.Tensor, dh_through: torch.Tensor):
        flat, fn, base, scale, m, rstd, pre = ctx.saved_tensors
        n_tokens, hidden = flat.shape[0], ctx.h_shape[-1]
        du, dh_through = _token_major(du, hidden), _token_major(dh_through, STREAMS * hidden)
        _, dpre = _collapse_backward(flat.view(n_tokens, STREAMS, hidden), pre, du,
                                     _resolved("mhc_collapse_bwd", n_tokens, hidden), store_dh=False)
        gates = (g.reshape(n_tokens, -1).float().contiguous() for g in (dpost, dcomb))  # materialized: never None
        dh, dfn, dbase, dscale = _glue_backward(flat, fn, base, scale, m, rstd, dpre, *gates,
                                                _resolved("mhc_glue_bwd", n_tokens, hidden),
                                                collapse=(pre, du, dh_through))
        return dh.view(ctx.h_shape), dfn, dbase, dscale, None


def mhc_enter(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sub-layer's entry: ``mhc_glue`` and then ``mhc_collapse`` with its ``pre``, as one op.

    Contract: as ``mhc_glue``'s (``h [..., 4, D]`` bf16 or fp32, any strides, copied; ``fn [24, 4D]``,
    ``base [24]`` and ``scale [3]`` fp32; one device). Returns ``u [..., D]`` in h's dtype (the
    sub-layer's input before its norm), fp32 ``post [..., 4]``, the Sinkhorn logits ``comb [..., 4, 4]``
    and h itself, to hand to ``mhc_expand`` in h's place; differentiable in h and every parameter,
    with one dh for all of h's uses (``_Entry``).
    """
    _check_glue_inputs(h, fn, base, scale)
    return _Entry.apply(h, fn.contiguous(), base.contiguous(), scale.contiguous(), eps)


def mhc_enter_reference(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager (differentiable) math of ``mhc_enter``: the references of the glue and the collapse, and h."""
    pre, post, comb = mhc_glue_reference(h, fn, base, scale, eps)
    return mhc_collapse_reference(h, pre), post, comb, h


def mhc_collapse_reference(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Eager (differentiable) math of ``mhc_collapse``, in fp32, returned in h's dtype."""
    return (pre.float()[..., None] * h.float()).sum(-2).to(h.dtype)


def mhc_expand_reference(f: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Eager (differentiable) math of ``mhc_expand``, in fp32, returned in h's dtype."""
    mixed = torch.einsum("...jk,...jd->...kd", comb.float(), h.float())
    return (post.float()[..., None] * f.float()[..., None, :] + mixed).to(h.dtype)


# --------------------------------------------------------------------------------------------
# Registration: inputs, references, heuristic defaults, bytes
# --------------------------------------------------------------------------------------------


def _random_glue(shape: Shape, seed: int, backward: bool) -> dict[str, torch.Tensor]:
    """CPU tensors of the bf16 glue problem; with ``backward``, the saved m and rstd and fp32 gradients."""
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden = shape["tokens"], shape["hidden"]
    width = STREAMS * hidden
    h = torch.randn(tokens, STREAMS, hidden, generator=gen).to(torch.bfloat16)
    inputs = {
        "h": h,
        "fn": torch.randn(_N_LOGITS, width, generator=gen) / width**0.5,  # keeps m near unit scale
        "base": 0.5 * torch.randn(_N_LOGITS, generator=gen),
        "scale": 1.0 + 0.25 * torch.randn(3, generator=gen),
    }
    if backward:
        xf = h.flatten(-2).float()
        rstd = torch.rsqrt(xf.square().mean(-1) + DEFAULT_EPS)
        inputs |= {
            "m": (xf @ inputs["fn"].T) * rstd[:, None],
            "rstd": rstd,
            "dpre": torch.randn(tokens, STREAMS, generator=gen),
            "dpost": torch.randn(tokens, STREAMS, generator=gen),
            "dcomb": torch.randn(tokens, STREAMS, STREAMS, generator=gen),
        }
    return inputs


def _random_streams(shape: Shape, seed: int, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """CPU tensors ``names`` of a bf16 collapse/expand problem: gates in their real ranges."""
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden = shape["tokens"], shape["hidden"]
    makers = {
        "h": lambda: torch.randn(tokens, STREAMS, hidden, generator=gen).to(torch.bfloat16),
        "f": lambda: torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16),
        "pre": lambda: torch.sigmoid(torch.randn(tokens, STREAMS, generator=gen)) + DEFAULT_EPS,
        "post": lambda: 2 * torch.sigmoid(torch.randn(tokens, STREAMS, generator=gen)),
        "comb": lambda: torch.softmax(torch.randn(tokens, STREAMS, STREAMS, generator=gen), -1),
        "du": lambda: torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16),
        "dout": lambda: torch.randn(tokens, STREAMS, hidden, generator=gen).to(torch.bfloat16),
    }
    return {name: makers[name]() for name in names}


def _reference_grads(function, inputs: Inputs, primals: tuple[str, ...], cotangents: tuple[str, ...]):
    """Gradients of ``function(*primals)`` given the cotangents, by autograd through the eager math."""
    with torch.enable_grad():
        leaves = [inputs[name].detach().requires_grad_() for name in primals]
        outputs = function(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return torch.autograd.grad(outputs, leaves, [inputs[name] for name in cotangents])


_FILL_PROGRAMS = 512  # about four programs per SM of a 132-SM H200


def _glue_default(shape: Shape, backward: bool) -> Config:
    """Forward: 32 tokens a program up to 8192 tokens, then 64 (wgmma); every program reads all of
    fn from L2, so wider token tiles read less of it. Fewer token blocks than ``_FILL_PROGRAMS`` split
    the 4D axis too (``SPLIT_K``, at least 512 columns a split): 4096 tokens are 128 blocks alone.
    Backward: 32-token steps over 128-wide chunks, 16 slabs once there are 16 token blocks."""
    tokens = shape["tokens"]
    block_n = max(16, min(32 if backward or tokens <= 8192 else 64, next_pow2(tokens)))
    if not backward:
        blocks = cdiv(tokens, block_n)
        split = min(next_pow2(cdiv(_FILL_PROGRAMS, blocks)), max(1, 4 * shape["hidden"] // 512))
        # FUSED_GATES 0: 4% slower than the gates launch at 4,096 tokens (H200 grid); the
        # gates launch over 16-token blocks, 256 programs at 4,096 tokens (1.4-1.6% faster there)
        return {"BLOCK_N": block_n, "BLOCK_K": 64, "SPLIT_K": split, "FUSED_GATES": 0,
                "GATES_BLOCK_N": 16 if split > 1 else 0, "num_warps": 4, "num_stages": 3}
    slabs = 16 if cdiv(tokens, block_n) >= 16 else 8
    return {"BLOCK_N": block_n, "BLOCK_K": 128, "SLABS": slabs, "DFN_TRANSPOSED": 0, "TMA": 0, "num_warps": 8,
            "num_stages": 2}


def _streams_default(shape: Shape, backward: bool) -> Config:
    """About 2048 values a stream tile forward, one token backward (where four streams of h and
    dh live at once), at about 8 values a thread."""
    block_d = min(1024, max(256, next_pow2(shape["hidden"])))
    block_t = 1 if backward else max(1, min(8, 2048 // block_d, next_pow2(shape["tokens"])))
    width = block_t * min(block_d, next_pow2(shape["hidden"]))
    return {"BLOCK_T": block_t, "BLOCK_D": block_d, "num_warps": max(1, min(8, width // 256)), "num_stages": 1}


def _glue_bytes(shape: Shape, backward: bool) -> int:
    """h once (and dh), fn once (and dfn), the 24 fp32 gate values a token (and their gradients);
    the forward's saved m and rstd are not counted, as rmsnorm does not count rstd."""
    tokens, width = shape["tokens"], STREAMS * shape["hidden"]
    params = _FP32_BYTES * (_N_LOGITS * width + _N_LOGITS + 3)
    gates = _FP32_BYTES * _N_LOGITS * tokens
    if not backward:
        return _BF16_BYTES * tokens * width + params + gates
    saved = _FP32_BYTES * (_N_LOGITS + 1) * tokens
    return 2 * (_BF16_BYTES * tokens * width + params) + gates + saved


def _glue_flops(shape: Shape, backward: bool) -> int:
    """The projection's multiply-adds (the backward has two: dh and dfn)."""
    return (2 if backward else 1) * 2 * shape["tokens"] * STREAMS * shape["hidden"] * _N_LOGITS


def _bytes_per_token(residuals: int, rows: int, small_fp32: int):
    """Bytes of a streams kernel touching ``residuals`` [4, D] and ``rows`` [D] bf16 tensors and
    ``small_fp32`` fp32 values a token."""

    def bytes_moved(shape: Shape) -> int:
        per_token = _BF16_BYTES * shape["hidden"] * (STREAMS * residuals + rows) + _FP32_BYTES * small_fp32
        return shape["tokens"] * per_token

    return bytes_moved


_SHAPE_FIELDS = ("tokens", "hidden")
_PRESETS = {
    "v4-flash": [{"tokens": t, "hidden": 4096} for t in (4096, 16384)],
    "v4-pro": [{"tokens": t, "hidden": 7168} for t in (4096, 16384)],
    "small": [{"tokens": 37, "hidden": 96}, {"tokens": 5, "hidden": 40}],
}


def _launch_glue_fwd(inputs: Inputs, config: Config, compile_only: bool) -> tuple[torch.Tensor, ...]:
    h = inputs["h"]
    flat = h.view(h.shape[0], -1)
    return _glue_forward(flat, inputs["fn"], inputs["base"], inputs["scale"], DEFAULT_EPS, config, compile_only)[:3]


def _launch_glue_bwd(inputs: Inputs, config: Config, compile_only: bool) -> tuple[torch.Tensor, ...]:
    h = inputs["h"]
    saved_and_grads = (inputs[name] for name in ("fn", "base", "scale", "m", "rstd", "dpre", "dpost", "dcomb"))
    dh, *param_grads = _glue_backward(h.view(h.shape[0], -1), *saved_and_grads, config, compile_only)
    return (dh.view(h.shape), *param_grads)


def _launcher(function, names: tuple[str, ...]):
    """``launcher(inputs, config, compile_only)`` calling ``function(*inputs[names], config, compile_only)``."""
    return lambda inputs, config, compile_only: function(*(inputs[n] for n in names), config, compile_only)


def _register(name: str, launcher, make_inputs, **fields) -> None:
    """Register ``name``; ``launcher(inputs, config, compile_only)`` launches it or only compiles it."""

    def compile_config(inputs: Inputs, config: Config) -> None:
        launcher(inputs, config, True)

    register(
        TunableKernel(
            name=name,
            shape_fields=_SHAPE_FIELDS,
            exact_fields=("hidden",),
            make_inputs=lambda shape, device, seed: {n: t.to(device) for n, t in make_inputs(shape, seed).items()},
            run=lambda inputs, config: launcher(inputs, config, False),
            compile=compile_config,
            presets=_PRESETS,
            **fields,
        )
    )


_GLUE_PARAMS = ("h", "fn", "base", "scale")
_GLUE_GRADS = ("dpre", "dpost", "dcomb")

_register(
    "mhc_glue_fwd",
    _launch_glue_fwd,
    lambda shape, seed: _random_glue(shape, seed, backward=False),
    reference=lambda i: mhc_glue_reference(*(i[n] for n in _GLUE_PARAMS)),
    default_config=lambda shape: _glue_default(shape, backward=False),
    bytes_moved=lambda shape: _glue_bytes(shape, backward=False),
    flops=lambda shape: _glue_flops(shape, backward=False),
    # fp32 gates: summation order and the 2^-18 split of fn differ; the error grows with the
    # 4 x hidden terms of the projection (worst 1.7e-4 at V4-Pro's 28,672 on the H200).
    atol=2.5e-4,
    rtol=1e-4,
)
_register(
    "mhc_glue_bwd",
    _launch_glue_bwd,
    lambda shape, seed: _random_glue(shape, seed, backward=True),
    reference=lambda i: _reference_grads(mhc_glue_reference, i, _GLUE_PARAMS, _GLUE_GRADS),
    default_config=lambda shape: _glue_default(shape, backward=True),
    bytes_moved=lambda shape: _glue_bytes(shape, backward=True),
    flops=lambda shape: _glue_flops(shape, backward=True),
)
_register(
    "mhc_collapse_fwd",
    _launcher(_collapse_forward, ("h", "pre")),
    lambda shape, seed: _random_streams(shape, seed, ("h", "pre")),
    reference=lambda i: mhc_collapse_reference(i["h"], i["pre"]),
    default_config=lambda shape: _streams_default(shape, backward=False),
    bytes_moved=_bytes_per_token(residuals=1, rows=1, small_fp32=STREAMS),
)
_register(
    "mhc_collapse_bwd",
    _launcher(_collapse_backward, ("h", "pre", "du")),
    lambda shape, seed: _random_streams(shape, seed, ("h", "pre", "du")),
    reference=lambda i: _reference_grads(mhc_collapse_reference, i, ("h", "pre"), ("du",)),
    default_config=lambda shape: _streams_default(shape, backward=True),
    bytes_moved=_bytes_per_token(residuals=2, rows=1, small_fp32=2 * STREAMS),
)
_EXPAND_INPUTS = ("f", "h", "post", "comb")
_register(
    "mhc_expand_fwd",
    _launcher(_expand_forward, _EXPAND_INPUTS),
    lambda shape, seed: _random_streams(shape, seed, _EXPAND_INPUTS),
    reference=lambda i: mhc_expand_reference(*(i[n] for n in _EXPAND_INPUTS)),
    default_config=lambda shape: _streams_default(shape, backward=False),
    bytes_moved=_bytes_per_token(residuals=2, rows=1, small_fp32=STREAMS + STREAMS * STREAMS),
)
_register(
    "mhc_expand_bwd",
    _launcher(_expand_backward, _EXPAND_INPUTS + ("dout",)),
    lambda shape, seed: _random_streams(shape, seed, _EXPAND_INPUTS + ("dout",)),
    reference=lambda i: _reference_grads(mhc_expand_reference, i, _EXPAND_INPUTS, ("dout",)),
    default_config=lambda shape: _streams_default(shape, backward=True),
    bytes_moved=_bytes_per_token(residuals=3, rows=2, small_fp32=2 * (STREAMS + STREAMS * STREAMS)),
)
