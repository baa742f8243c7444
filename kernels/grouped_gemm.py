"""Grouped expert GEMMs of a DeepSeek-V4 MoE layer, with the clamped SwiGLU fused in.

Tokens arrive sorted by expert: expert e owns rows ``expert_offsets[e]:expert_offsets[e+1]``
of ``x [T, D]`` (``expert_offsets[0] == 0``, ``expert_offsets[-1] == T``, empty experts
allowed; not checked, since checking would sync with the host). Weights are bf16:
``W13 [E, 2F, D]`` holds W1 (gate) in rows ``:F`` and W3 (up) in rows ``F:``, and
``W2 [E, D, F]``. Per token t of expert e, with routing weight ``w_t``::

    g, u = x_t @ W1_e^T, x_t @ W3_e^T
    a    = silu(min(g, 10)) * clamp(u, -10, 10)
    y_t  = w_t * (a @ W2_e^T)

Launches (each a registered tunable kernel):

* ``expert_up_fwd``: ``a [T, F]`` and ``gu [T, 2F]`` (g then u, rounded to bf16). ``a`` is
  computed from the rounded g and u, so the backward's clamp masks and derivatives are
  exactly those of the forward. Keeping g and u costs a ``[T, 2F]`` write but no GEMM is
  recomputed in the backward.
* ``expert_down_fwd``: ``y [T, D]``, the routing weight applied in the epilogue.
* ``expert_down_bwd_dx``: ``dA = w * (dy @ W2_e)`` and ``dw_t = sum_f a * (dy @ W2_e)``
  (equal to ``sum_d dy * (a @ W2_e^T)``), with the SwiGLU backward fused into the epilogue:
  it returns ``dgu = [dg, du] [T, 2F]`` (clamp masks inclusive of +-10, as torch.clamp) and
  never writes dA. So the SwiGLU backward runs once per element, and the up launches
  below are plain GEMMs over the concatenated ``2F``.
* ``expert_up_bwd_dx``: ``dx = dgu @ W13_e = dg @ W1_e + du @ W3_e``.
* ``expert_down_bwd_dw`` / ``expert_up_bwd_dw``: ``dW2_e (+)= dy^T @ (w a)`` and
  ``dW13_e (+)= dgu^T @ x`` over the expert's tokens, added to a given fp32 or bf16
  gradient buffer by the kernel itself (read, add, write: in place when the output is the
  buffer, as ``expert_mlp`` uses it; the registered kernels write to a fresh tensor, so
  that the sweep's repeated runs all start from the same buffer). ``w * a`` is rounded
  to bf16 before the MMA: the routing weight scales the MMA's B operand, which Triton stages
  in shared memory anyway, since an A operand scaled in registers made Triton wait after each
  of the loop's MMAs (4 waits a step at the default tile, offline sm_90 compile).

Scheduling of the token-row launches: one launch covers every expert. A tile table built on
the device from ``expert_offsets`` by a launch of its own (``_tile_table_kernel``: per-expert tile
counts, their cumulative sum, and each tile's expert; no host sync) maps each row-tile index to
(expert, first row, row end).
The grid is sized by the bound ``T // BLOCK_M + min(E, T)`` on the number of row tiles;
programs past the last real tile return at once, and an empty expert has no tiles. The
program id is swizzled over groups of ``GROUP_M`` row tiles so that consecutive programs
share weight tiles in L2. The weight-gradient launches have one program per tile of every
expert's gradient (each must be written, even for an expert without tokens) and reduce
over the expert's tokens in ``BLOCK_K`` steps, by masked pointer loads or (``TMA``) through
descriptors each program builds over its own expert's rows, which TMA zero-fills past the
expert's end. K and N edges are masked, so no block size has to divide D or F.

Tolerances (TunableKernel atol = rtol = 2e-2, per element against a fp32 reference fed
the same bf16 inputs): bf16 outputs (a, gu, y, dgu, dx) are rounded once, 2**-9 relative;
fp32 outputs (dweights, the weight gradients) differ by summation order, plus, for dW2,
the rounding of ``w * a`` (about 1e-3 of its size, up to ~5e-3 at the extremes of a large
buffer). ``make_inputs`` scales the inputs so that the weight gradients are of unit size,
where atol 2e-2 leaves a 4x margin.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.arch import INTERPRETER_ARCH, current_arch
from kernels.contracts import check_integer, check_same_device, values_checked
from kernels.host_math import cdiv, next_pow2
from kernels.launch import ensure_scratch_allocator, launch, tma_usable
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

SWIGLU_CLAMP = 10.0
_CLAMP = tl.constexpr(SWIGLU_CLAMP)
_BF16_BYTES = 2
_FP32_BYTES = 4


@triton.jit
def _swizzle(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of ``pid``: column-major within groups of GROUP_M row tiles."""
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def _swiglu(g, u):
    gc = tl.minimum(g, _CLAMP)
    return gc * tl.sigmoid(gc) * tl.minimum(tl.maximum(u, -_CLAMP), _CLAMP)


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b``; UPCAST gives the dot fp32 operands (Triton 3.9's CPU interpreter multiplies
    bf16 operands as their raw uint16 bits)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def _load_a(a_ref, rows, row_mask, first_row, k0, K, BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """The ``[BLOCK_M, BLOCK_K]`` A tile at K offset k0: by the tensor-memory accelerator from a
    ``[T, K]`` descriptor (rows past the tile's expert and the K edge come back as the next
    expert's rows or zeros; the epilogue masks those rows), else by masked pointer loads."""
    if TMA:  # constexpr branches, each with its own value: Triton compiles code after a constexpr return
        a = a_ref.load([first_row, k0])
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ref + rows[:, None] * K + ks[None, :], mask=row_mask[:, None] & (ks < K)[None, :], other=0.0)
    return a


@triton.jit
def _load_b(b_ref, expert, n0, k0, K, N, stride_be, stride_bk, stride_bn,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr, B_KMAJOR: tl.constexpr):
    """The ``[BLOCK_K, BLOCK_N]`` tile of ``B_e`` at (k0, n0): by TMA from the weight's own 3-D descriptor
    (``[E, N, K]`` when B_KMAJOR, else ``[E, K, N]``; its edges are zero-filled per expert), else by
    masked pointer loads from the ``[E, K, N]`` strides."""
    if TMA:
        if B_KMAJOR:
            b = tl.trans(b_ref.load([expert, n0, k0]).reshape([BLOCK_N, BLOCK_K]))
        else:
            b = b_ref.load([expert, k0, n0]).reshape([BLOCK_K, BLOCK_N])
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        cols = n0 + tl.arange(0, BLOCK_N)
        ptrs = b_ref + expert.to(tl.int64) * stride_be + ks[:, None] * stride_bk + cols[None, :] * stride_bn
        b = tl.load(ptrs, mask=(ks < K)[:, None] & (cols < N)[None, :], other=0.0)
    return b


@triton.jit
def _swiglu_bwd_store(acc, weight, rows, row_mask, cols, N, gu_ptr, out_ptr):
    """Store dgu = [dg, du] for ``acc`` = dy @ W2_e at ``cols`` of ``rows`` (da = weight * acc), and return
    the rows' routing-weight gradient over these columns, ``sum(a * acc)``."""
    mask = row_mask[:, None] & (cols < N)[None, :]
    gu_offsets = rows[:, None] * (2 * N) + cols[None, :]  # gate columns of a [T, 2N] tensor; up ones at +N
    g = tl.load(gu_ptr + gu_offsets, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + gu_offsets + N, mask=mask, other=0.0).to(tl.float32)
    dw = tl.sum(_swiglu(g, u) * acc, axis=1)
    da = acc * weight[:, None]
    gc = tl.minimum(g, _CLAMP)
    sig = tl.sigmoid(gc)
    du = tl.where((u >= -_CLAMP) & (u <= _CLAMP), da * gc * sig, 0.0)
    uc = tl.minimum(tl.maximum(u, -_CLAMP), _CLAMP)
    dg = tl.where(g <= _CLAMP, da * uc * sig * (1.0 + gc * (1.0 - sig)), 0.0)
    tl.store(out_ptr + gu_offsets, dg.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + gu_offsets + N, du.to(out_ptr.dtype.element_ty), mask=mask)
    return dw


@triton.jit
def _grouped_gemm_kernel(
    a_ref, b_ref, table_ptr, out_ptr, scale_ptr, gu_ptr, partial_ptr,
    tiles_m, N, K, stride_be, stride_bk, stride_bn,
    EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, TMA: tl.constexpr, B_KMAJOR: tl.constexpr, UPCAST: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, EPILOGUE_HALVES: tl.constexpr,
):
    """``acc = A[rows] @ B_e[:, cols]`` for one tile of one expert's rows, then EPILOGUE.

    A is ``[T, K]`` row-major; ``B_e[k, n]`` is at ``b + e*stride_be + k*stride_bk + n*stride_bn``
    (with TMA, ``a_ref`` and ``b_ref`` are descriptors instead, see ``_load_a`` / ``_load_b``).
    EPILOGUE: "swiglu" (also multiplies by the up half of B, columns N..2N; stores a and gu),
    "scale" (rows times scale), "swiglu_bwd" (stores dgu and dw partials), "plain".
    WARP_SPECIALIZE (with TMA): Triton's Hopper warp specialization of the K loop, TMA loads in a
    producer warp and the MMAs in the consumer warpgroup. EPILOGUE_HALVES ("swiglu_bwd"): the epilogue
    runs over the tile's two column halves in turn, holding g, u and their derivatives for half the
    columns at a time (at 128 x 128 the whole tile's spill on sm_90).
    """
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _swizzle(tl.program_id(0), tiles_m, tiles_n, GROUP_M)
    expert = tl.load(table_ptr + pid_m)
    if WARP_SPECIALIZE:  # Triton 3.6's warp specialization pass asserts on an early return's branch
        k_end = tl.where(expert < 0, 0, K)  # a tile past the last one: no step, every store masked
    else:
        if expert < 0:
            return
        k_end = K
    first_row = tl.load(table_ptr + tiles_m + pid_m)
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < tl.load(table_ptr + 2 * tiles_m + pid_m)
    rows = rows.to(tl.int64)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if EPILOGUE == "swiglu":
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, k_end, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        a = _load_a(a_ref, rows, row_mask, first_row, k0, K, BLOCK_K, TMA)
        b = _load_b(b_ref, expert, n0, k0, K, N, stride_be, stride_bk, stride_bn, BLOCK_N, BLOCK_K, TMA, B_KMAJOR)
        acc = _mma(a, b, acc, UPCAST)
        if EPILOGUE == "swiglu":
            b_up = _load_b(b_ref, expert, N + n0, k0, K, 2 * N, stride_be, stride_bk, stride_bn, BLOCK_N, BLOCK_K,
                           TMA, B_KMAJOR)
            acc_up = _mma(a, b_up, acc_up, UPCAST)

    mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * N + cols[None, :]
    gu_offsets = rows[:, None] * (2 * N) + cols[None, :]  # gate columns of a [T, 2N] tensor; up ones at +N
    if EPILOGUE == "swiglu":
        g = acc.to(gu_ptr.dtype.element_ty)
        u = acc_up.to(gu_ptr.dtype.element_ty)
        tl.store(gu_ptr + gu_offsets, g, mask=mask)
        tl.store(gu_ptr + gu_offsets + N, u, mask=mask)
        tl.store(out_ptr + offsets, _swiglu(g.to(tl.float32), u.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)
    elif EPILOGUE == "scale":
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
        tl.store(out_ptr + offsets, (acc * scale[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
    elif EPILOGUE == "swiglu_bwd":
        # acc = dy @ W2_e over this tile's ffn columns; weight = the rows' routing weights.
        weight = tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
        if EPILOGUE_HALVES:
            # the accumulator's two column halves, one after the other: half the epilogue's registers
            lo, hi = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N // 2]), [0, 2, 1]))
            half = n0 + tl.arange(0, BLOCK_N // 2)
            dw = _swiglu_bwd_store(lo, weight, rows, row_mask, half, N, gu_ptr, out_ptr)
            dw += _swiglu_bwd_store(hi, weight, rows, row_mask, half + BLOCK_N // 2, N, gu_ptr, out_ptr)
        else:
            dw = _swiglu_bwd_store(acc, weight, rows, row_mask, cols, N, gu_ptr, out_ptr)
        tl.store(partial_ptr + rows * tiles_n + pid_n, dw, mask=row_mask)
    else:
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_wgrad_kernel(
    a_ptr, b_ptr, offsets_ptr, scale_ptr, grad_in_ptr, grad_out_ptr, M, N,
    HAS_SCALE: tl.constexpr, ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
    PREFETCH_GRAD: tl.constexpr,
):
    """``grad_out[e] = (grad_in[e] +) sum over e's tokens t of A[t, :]^T (scale_t B[t, :])``, one tile.

    PREFETCH_GRAD (with ACCUMULATE): the gradient tile is loaded before the reduction, not after it, so
    that its read overlaps the MMAs. An expert's few hundred tokens make a short reduction, and the tile's
    fp32 read and write (8 bytes an element, for 2 x tokens FLOPs) are a large part of its time.

    TMA: the A and B token tiles come through descriptors the program builds over its expert's rows
    alone (``[end - start, M]`` and ``[end - start, N]``), so TMA zero-fills the rows past the expert's
    end and the columns past M and N, and no load is masked. An expert without tokens gets one-row
    descriptors read from row 1: zeros, as its masked pointer loads give.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    expert = pid // (tiles_m * tiles_n)
    pid_m, pid_n = _swizzle(pid % (tiles_m * tiles_n), tiles_m, tiles_n, GROUP_M)
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = ms < M
    n_mask = ns < N
    if TMA:
        first = start.to(tl.int64)
        held = tl.maximum(end - start, 1)
        past_empty = (end == start).to(tl.int32)  # row 1 of a one-row view: zeros
        a_desc = tl.make_tensor_descriptor(a_ptr + first * M, [held, M], [M, 1], [BLOCK_K, BLOCK_M])
        b_desc = tl.make_tensor_descriptor(b_ptr + first * N, [held, N], [N, 1], [BLOCK_K, BLOCK_N])
    offsets = expert.to(tl.int64) * M * N + ms[:, None] * N + ns[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if ACCUMULATE and PREFETCH_GRAD:
        grad_in = tl.load(grad_in_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # At least one step, all masked for an expert without tokens: with a loop that may run no step,
    # the accumulator's zeros reach the final wgmma wait on a path past the loop, and Triton 3.6's
    # ptxas then serializes every wgmma of the loop (warning C7515: 4 waits a step at BLOCK_K 64).
    for step in range(0, tl.maximum(1, tl.cdiv(end - start, BLOCK_K))):
        ts = start + step * BLOCK_K + tl.arange(0, BLOCK_K)
        t_mask = ts < end
        ts = ts.to(tl.int64)
        if TMA:
            a = tl.trans(a_desc.load([step * BLOCK_K + past_empty, pid_m * BLOCK_M]))
            b = b_desc.load([step * BLOCK_K + past_empty, pid_n * BLOCK_N])
        else:
            a = tl.load(a_ptr + ts[None, :] * M + ms[:, None], mask=m_mask[:, None] & t_mask[None, :], other=0.0)
            b = tl.load(b_ptr + ts[:, None] * N + ns[None, :], mask=t_mask[:, None] & n_mask[None, :], other=0.0)
        if HAS_SCALE:
            scale = tl.load(scale_ptr + ts, mask=t_mask, other=0.0)
            b = (b.to(tl.float32) * scale[:, None]).to(b_ptr.dtype.element_ty)
        acc = _mma(a, b, acc, UPCAST)
    if ACCUMULATE:
        if PREFETCH_GRAD:
            acc += grad_in
        else:
            acc += tl.load(grad_in_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(grad_out_ptr + offsets, acc.to(grad_out_ptr.dtype.element_ty), mask=mask)


_TILE_IDS = 64  # row tiles a program of ``_tile_table_kernel`` fills


@triton.jit
def _tile_table_kernel(offsets_ptr, table_ptr, n_experts, tiles, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    """Rows ``[pid * BLOCK_T, + BLOCK_T)`` of the tile table (``tile_table_reference``); every program reads
    every expert's offsets (``BLOCK_E`` >= the expert count) and counts their tiles itself."""
    ids = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, BLOCK_E)
    in_e = e < n_experts
    start = tl.load(offsets_ptr + e, mask=in_e, other=0)
    stop = tl.load(offsets_ptr + e + 1, mask=in_e, other=0)
    per_expert = (stop - start + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(per_expert, axis=0)
    # searchsorted(ends, ids, right=True): the experts whose tiles all end at or before each id
    expert = tl.sum(((ends[None, :] <= ids[:, None]) & in_e[None, :]).to(tl.int32), axis=1)
    valid = expert < n_experts
    expert = tl.minimum(expert, n_experts - 1)
    first_tile = tl.sum(tl.where(e[None, :] == expert[:, None], (ends - per_expert)[None, :], 0), axis=1)
    first_row = tl.load(offsets_ptr + expert) + (ids - first_tile) * BLOCK_M
    row_end = tl.where(valid, tl.load(offsets_ptr + expert + 1), 0)
    in_t = ids < tiles
    tl.store(table_ptr + ids, tl.where(valid, expert, -1), mask=in_t)
    tl.store(table_ptr + tiles + ids, first_row, mask=in_t)
    tl.store(table_ptr + 2 * tiles + ids, row_end, mask=in_t)


def _tile_bound(n_experts: int, n_rows: int, block_m: int) -> int:
    """Row tiles at most: every expert's last tile may be partial, and an empty expert has none."""
    return n_rows // block_m + min(n_experts, n_rows)


def tile_table_reference(offsets: Tensor, block_m: int, n_rows: int) -> Tensor:
    """Eager form of the tile table: int32 ``[3, tiles]`` (expert or -1, first row, row end) per row tile."""
    n_experts = offsets.numel() - 1
    tiles = _tile_bound(n_experts, n_rows, block_m)
    per_expert = (offsets[1:] - offsets[:-1]).long().add(block_m - 1).div(block_m, rounding_mode="floor")
    ends = per_expert.cumsum(0)
    ids = torch.arange(tiles, device=offsets.device)
    expert = torch.searchsorted(ends, ids, right=True)
    valid = expert < n_experts
    expert = expert.clamp(max=n_experts - 1)
    first_row = offsets[expert] + (ids - ends[expert] + per_expert[expert]) * block_m
    row_end = torch.where(valid, offsets[expert + 1], 0)
    return torch.stack([torch.where(valid, expert, -1), first_row, row_end]).int()


def _tile_table(offsets: Tensor, block_m: int, n_rows: int, compile_only: bool = False) -> tuple[Tensor, int]:
    """int32 ``[3, tiles]`` (expert or -1, first row, row end) per row tile, and the bound ``tiles``, in one
    launch: the eager form's dozen small ops cost a token-row launch about 0.3 ms of host time (the sweeps'
    ``host_ms``), which an un-replayed step waits on. ``offsets``: int32 ``[E + 1]``, contiguous."""
    n_experts = offsets.numel() - 1
    tiles = _tile_bound(n_experts, n_rows, block_m)
    table = torch.empty(3, tiles, dtype=torch.int32, device=offsets.device)
    launch(_tile_table_kernel, (cdiv(tiles, _TILE_IDS),), (offsets, table, n_experts, tiles),
           {"BLOCK_M": block_m, "BLOCK_E": max(16, next_pow2(n_experts)), "BLOCK_T": _TILE_IDS},
           {"num_warps": 4, "num_stages": 1}, compile_only)
    return table, tiles


def _tile_constexprs(config: Config) -> dict[str, Any]:
    return {**{p: config[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
            "UPCAST": current_arch() == INTERPRETER_ARCH}


def _operands(a: Tensor, b: Tensor, config: Config) -> tuple[Any, Any, dict[str, Any]]:
    """The A and B arguments of ``_grouped_gemm_kernel`` and its TMA constexprs.

    With ``TMA`` set (and tensors TMA can address; otherwise the pointer path runs), A gets a
    ``[T, K]`` descriptor and B one over the weight tensor itself, ``[E, N, K]`` (K-major, e.g.
    W13 seen as ``[E, D, 2F]``) or ``[E, K, N]``, so that each expert's edges are zero-filled.
    """
    weight = b.transpose(1, 2) if b.stride(1) == 1 else b
    kmajor = weight is not b
    if not tma_usable(config, a, weight):
        return a, b, {"TMA": False, "B_KMAJOR": kmajor}
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    b_block = [1, block_n, block_k] if kmajor else [1, block_k, block_n]
    return (TensorDescriptor.from_tensor(a, [block_m, block_k]), TensorDescriptor.from_tensor(weight, b_block),
            {"TMA": True, "B_KMAJOR": kmajor})


def _gemm(
    a: Tensor,
    b: Tensor,
    offsets: Tensor,
    out: Tensor,
    epilogue: str,
    config: Config,
    compile_only: bool,
    scale: Tensor | None = None,
    gu: Tensor | None = None,
    partial: Tensor | None = None,
) -> None:
    """``out[rows of e] = epilogue(a[rows of e] @ b[e])`` for every expert e; ``b`` is a ``[E, K, N]`` view."""
    n_rows, k = a.shape
    n = b.shape[2] // 2 if epilogue == "swiglu" else b.shape[2]
    table, tiles_m = _tile_table(offsets, config["BLOCK_M"], n_rows, compile_only)
    a_ref, b_ref, tma = _operands(a, b, config)
    launch(
        _grouped_gemm_kernel,
        (tiles_m * cdiv(n, config["BLOCK_N"]),),
        (a_ref, b_ref, table, out, out if scale is None else scale, out if gu is None else gu,
         out if partial is None else partial, tiles_m, n, k, *b.stride()),
        {"EPILOGUE": epilogue, **_tile_constexprs(config), **tma,
         "WARP_SPECIALIZE": tma["TMA"] and bool(config.get("WARP_SPECIALIZE", 0)),
         "EPILOGUE_HALVES": epilogue == "swiglu_bwd" and bool(config.get("EPILOGUE_HALVES", 0))},
        config,
        compile_only,
    )


def _wgrad(
    a: Tensor,
    b: Tensor,
    offsets: Tensor,
    scale: Tensor | None,
    grad: Tensor | None,
    out: Tensor | None,
    config: Config,
    compile_only: bool,
) -> Tensor:
    """``out[e] = grad[e] + (scale a[e's rows])^T @ b[e's rows]``; out defaults to a new tensor like grad.

    ``out`` may be ``grad`` itself (in place); without ``grad`` nothing is added.
    """
    out = torch.empty_like(grad) if out is None else out
    n_experts, m, n = out.shape
    tma = tma_usable(config, a, b)
    if tma:
        ensure_scratch_allocator()  # the kernel's descriptors live in Triton's global scratch
    launch(
        _grouped_wgrad_kernel,
        (n_experts * cdiv(m, config["BLOCK_M"]) * cdiv(n, config["BLOCK_N"]),),
        (a, b, offsets, a if scale is None else scale, out if grad is None else grad, out, m, n),
        {"HAS_SCALE": scale is not None, "ACCUMULATE": grad is not None, **_tile_constexprs(config), "TMA": tma,
         "PREFETCH_GRAD": bool(config.get("PREFETCH_GRAD", 0))},
        config,
        compile_only,
    )
    return out


def _up_fwd(x: Tensor, offsets: Tensor, w13: Tensor, config: Config,
            compile_only: bool = False) -> tuple[Tensor, Tensor]:
    """``(a, gu)`` of the up projection and clamped SwiGLU."""
    ffn = w13.shape[1] // 2
    a = x.new_empty(x.shape[0], ffn)
    gu = x.new_empty(x.shape[0], 2 * ffn)
    _gemm(x, w13.transpose(1, 2), offsets, a, "swiglu", config, compile_only, gu=gu)
    return a, gu


def _down_fwd(a: Tensor, offsets: Tensor, weights: Tensor, w2: Tensor, config: Config,
              compile_only: bool = False) -> Tensor:
    """``y = weights * (a @ W2_e^T)``."""
    y = a.new_empty(a.shape[0], w2.shape[1])
    _gemm(a, w2.transpose(1, 2), offsets, y, "scale", config, compile_only, scale=weights)
    return y


def _down_bwd_dx(dy: Tensor, offsets: Tensor, weights: Tensor, gu: Tensor, w2: Tensor, config: Config,
                 compile_only: bool = False) -> tuple[Tensor, Tensor]:
    """``(dgu, dweights)``: the SwiGLU input gradient and the routing-weight gradient."""
    dgu = torch.empty_like(gu)
    partial = torch.empty(dy.shape[0], cdiv(w2.shape[2], config["BLOCK_N"]), dtype=torch.float32,
                          device=dy.device)
    _gemm(dy, w2, offsets, dgu, "swiglu_bwd", config, compile_only, scale=weights, gu=gu, partial=partial)
    return dgu, partial.sum(1)


def _up_bwd_dx(dgu: Tensor, offsets: Tensor, w13: Tensor, config: Config, compile_only: bool = False) -> Tensor:
    """``dx = dgu @ W13_e``."""
    dx = dgu.new_empty(dgu.shape[0], w13.shape[2])
    _gemm(dgu, w13, offsets, dx, "plain", config, compile_only)
    return dx


def _down_bwd_dw(dy: Tensor, a: Tensor, offsets: Tensor, weights: Tensor, grad: Tensor | None, config: Config,
                 compile_only: bool = False, out: Tensor | None = None) -> Tensor:
    """``grad + dy^T @ (weights a)`` per expert, into ``out`` (a new tensor by default; may be ``grad``).

    ``PRESCALE``: ``weights a`` is formed first, rounded to bf16 as the kernel rounds it, by one elementwise
    op, and the kernel runs unscaled: its B tiles then go from TMA or the loads to the MMAs without a pass
    through registers. Otherwise the kernel scales each B tile itself."""
    if config.get("PRESCALE"):
        scaled = a if compile_only else (a.float() * weights[:, None]).to(a.dtype)
        return _wgrad(dy, scaled, offsets, None, grad, out, config, compile_only)
    return _wgrad(dy, a, offsets, weights, grad, out, config, compile_only)


def _up_bwd_dw(dgu: Tensor, x: Tensor, offsets: Tensor, grad: Tensor | None, config: Config,
               compile_only: bool = False, out: Tensor | None = None) -> Tensor:
    """``grad + dgu^T @ x`` per expert, into ``out`` (a new tensor by default; may be ``grad``)."""
    return _wgrad(dgu, x, offsets, None, grad, out, config, compile_only)


def _resolved(kernel: str, x: Tensor, w2: Tensor) -> Config:
    n_experts, hidden, ffn = w2.shape
    # The expert loads are only known on the device; asking for their skew would sync, so the
    # layer asks for the balanced-load entry (the sweeps also tune skewed loads, to show the cost).
    config, _ = resolve(kernel, {"tokens": x.shape[0], "experts": n_experts, "hidden": hidden, "ffn": ffn, "skew": 0})
    return config


class _ExpertMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offsets, weights, w13, w2, grad_w13, grad_w2):
        a, gu = _up_fwd(x, offsets, w13, _resolved("expert_up_fwd", x, w2))
        y = _down_fwd(a, offsets, weights, w2, _resolved("expert_down_fwd", x, w2))
        ctx.save_for_backward(x, offsets, weights, w13, w2, a, gu)
        ctx.grad_buffers = grad_w13, grad_w2
        return y

    @staticmethod
    def backward(ctx, dy):
        x, offsets, weights, w13, w2, a, gu = ctx.saved_tensors
        grad_w13, grad_w2 = ctx.grad_buffers
        dy = dy.contiguous()
        dgu, dweights = _down_bwd_dx(dy, offsets, weights, gu, w2, _resolved("expert_down_bwd_dx", x, w2))
        dx = _up_bwd_dx(dgu, offsets, w13, _resolved("expert_up_bwd_dx", x, w2))
        # With buffers, gradients are added to them in place and autograd gets none.
        dw2 = _down_bwd_dw(dy, a, offsets, weights, grad_w2, _resolved("expert_down_bwd_dw", x, w2),
                           out=torch.empty_like(w2) if grad_w2 is None else grad_w2)
        dw13 = _up_bwd_dw(dgu, x, offsets, grad_w13, _resolved("expert_up_bwd_dw", x, w2),
                          out=torch.empty_like(w13) if grad_w13 is None else grad_w13)
        return dx, None, dweights, dw13 if grad_w13 is None else None, dw2 if grad_w2 is None else None, None, None


def expert_mlp(
    x_sorted: Tensor,
    expert_offsets: Tensor,
    weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    grad_buffers: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``y [T, D]`` bf16: each token's routed expert MLP (clamped SwiGLU) times its routing weight.

    Contract: ``x_sorted [T, D]`` bf16 sorted by expert; ``expert_offsets [E+1]`` int32 or int64,
    expert e's rows ``offsets[e] .. offsets[e+1]``: ``offsets[0] == 0``, non-decreasing,
    ``offsets[E] == T`` (an expert may have no rows; the kernels walk rows by these bounds, so
    they are checked where ``kernels.contracts`` checks values); ``weights [T]`` float (fp32
    used); ``w13 [E, 2F, D]`` (gate rows, then up rows) and ``w2 [E, D, F]`` bf16; all on one
    device, any strides (copied). Differentiable in x, weights, w13 and w2. With
    ``grad_buffers = (dW13, dW2)`` (contiguous fp32 or bf16, shaped like the weights) the
    weight gradients are added to those buffers in place (as to Megatron's ``main_grad``) and
    w13/w2 get no ``.grad``. Launch parameters come from ``kernels.tuning.resolve``.
    """
    n_experts, two_ffn, hidden = w13.shape
    n_rows = x_sorted.shape[0]
    expected = {
        "x_sorted": (x_sorted, (n_rows, hidden)),
        "expert_offsets": (expert_offsets, (n_experts + 1,)),
        "weights": (weights, (n_rows,)),
        "w2": (w2, (n_experts, hidden, two_ffn // 2)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} for w13 {list(w13.shape)}, got {list(tensor.shape)}")
    if x_sorted.dtype != torch.bfloat16 or w13.dtype != torch.bfloat16 or w2.dtype != torch.bfloat16:
        raise ValueError(f"x, w13 and w2 must be bfloat16, got {x_sorted.dtype}, {w13.dtype}, {w2.dtype}")
    if not weights.is_floating_point():
        raise ValueError(f"weights must be a float tensor, got {weights.dtype}")
    check_integer("expert_offsets", expert_offsets)
    grad_w13, grad_w2 = grad_buffers or (None, None)
    check_same_device(x_sorted=x_sorted, expert_offsets=expert_offsets, weights=weights, w13=w13, w2=w2,
                      grad_w13=grad_w13, grad_w2=grad_w2)
    _check_offsets(expert_offsets, n_rows)
    for buffer, weight in ((grad_w13, w13), (grad_w2, w2)):
        if buffer is not None and (buffer.shape != weight.shape or buffer.dtype not in (torch.float32, torch.bfloat16)
                                   or not buffer.is_contiguous()):
            raise ValueError(f"a gradient buffer must be a contiguous fp32/bf16 {list(weight.shape)}, "
                             f"got {list(buffer.shape)} {buffer.dtype}")
    return _ExpertMLP.apply(x_sorted.contiguous(), expert_offsets.int().contiguous(), weights.float().contiguous(),
                            w13.contiguous(), w2.contiguous(), grad_w13, grad_w2)


def _check_offsets(offsets: Tensor, n_rows: int) -> None:
    """ValueError unless ``offsets`` start at 0, never decrease and end at ``n_rows`` (where values are checked)."""
    if not values_checked(offsets):
        return
    bounds = offsets.tolist()
    if bounds[0] != 0 or bounds[-1] != n_rows or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"expert_offsets must rise from 0 to the {n_rows} rows of x_sorted without decreasing, "
                         f"got {bounds}")


# ----- eager references ---------------------------------------------------------------


def _expert_rows(offsets: Tensor) -> list[tuple[int, slice]]:
    bounds = offsets.tolist()
    return [(e, slice(bounds[e], bounds[e + 1])) for e in range(len(bounds) - 1)]


def _swiglu_reference(gu: Tensor) -> Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g.clamp(max=SWIGLU_CLAMP)) * u.clamp(-SWIGLU_CLAMP, SWIGLU_CLAMP)


def expert_mlp_reference(
    x_sorted: Tensor, expert_offsets: Tensor, weights: Tensor, w13: Tensor, w2: Tensor
) -> Tensor:
    """Eager fp32 math of ``expert_mlp`` (differentiable), a loop over experts, in x's dtype.

    g and u are rounded to bf16 as the kernel keeps them, so that the clamp masks fall on
    the same elements; everything else stays fp32.
    """
    rows = []
    for e, r in _expert_rows(expert_offsets):
        gu = (x_sorted[r].float() @ w13[e].float().T).to(torch.bfloat16).float()
        rows.append(weights[r, None].float() * (_swiglu_reference(gu) @ w2[e].float().T))
    return torch.cat(rows).to(x_sorted.dtype)


def _per_expert(offsets: Tensor, out: Tensor, fn: Callable[[int, slice], Tensor]) -> Tensor:
    """``out`` with the rows of each expert e set to ``fn(e, rows)``."""
    for e, r in _expert_rows(offsets):
        out[r] = fn(e, r)
    return out


def _up_fwd_reference(x, offsets, w13) -> tuple[Tensor, Tensor]:
    gu = _per_expert(offsets, x.new_empty(x.shape[0], w13.shape[1]), lambda e, r: x[r].float() @ w13[e].float().T)
    return _swiglu_reference(gu.float()).to(x.dtype), gu


def _down_fwd_reference(a, offsets, weights, w2) -> Tensor:
    return _per_expert(offsets, a.new_empty(a.shape[0], w2.shape[1]),
                       lambda e, r: weights[r, None] * (a[r].float() @ w2[e].float().T))


def _down_bwd_dx_reference(dy, offsets, weights, gu, w2) -> tuple[Tensor, Tensor]:
    """dgu by autograd through the eager SwiGLU; dweights from its definition ``sum(dy * (a @ W2^T))``."""
    a = _swiglu_reference(gu.float())
    with torch.enable_grad():
        gu_leaf = gu.float().requires_grad_()
        da = _per_expert(offsets, torch.empty_like(a), lambda e, r: weights[r, None] * (dy[r].float() @ w2[e].float()))
        (dgu,) = torch.autograd.grad(_swiglu_reference(gu_leaf), gu_leaf, da)
    down = _per_expert(offsets, torch.empty_like(dy, dtype=torch.float32), lambda e, r: a[r] @ w2[e].float().T)
    return dgu.to(gu.dtype), (dy.float() * down).sum(-1)


def _up_bwd_dx_reference(dgu, offsets, w13) -> Tensor:
    return _per_expert(offsets, dgu.new_empty(dgu.shape[0], w13.shape[2]), lambda e, r: dgu[r].float() @ w13[e].float())


def _wgrad_reference(a, b, offsets, scale, grad) -> Tensor:
    out = grad.float().clone()
    for e, r in _expert_rows(offsets):
        lhs = a[r].float() if scale is None else a[r].float() * scale[r, None]
        out[e] += lhs.T @ b[r].float()
    return out.to(grad.dtype)


def _down_bwd_dw_reference(dy, a, offsets, weights, grad) -> Tensor:
    return _wgrad_reference(dy, a, offsets, weights, grad)


def _up_bwd_dw_reference(dgu, x, offsets, grad) -> Tensor:
    return _wgrad_reference(dgu, x, offsets, None, grad)


# ----- registration -------------------------------------------------------------------


def expert_loads(tokens: int, experts: int, skew: int, gen: torch.Generator) -> Tensor:
    """Rows per expert: as equal as integers allow for ``skew`` 0, else Zipf-like, the i-th
    busiest expert's share proportional to ``i ** (-skew / 100)``; experts in a seeded random order.

    ``skew`` 50 (the skewed presets) gives the busiest of 32 experts 3.2x the mean load and
    the idlest 0.57x; of 256 experts, 8.4x and 0.52x.
    """
    share = torch.arange(1, experts + 1, dtype=torch.float64) ** (-skew / 100)
    share = share / share.sum() * tokens
    counts = share.floor().long()
    largest_remainders = torch.argsort(share - counts, descending=True, stable=True)
    counts[largest_remainders[: tokens - int(counts.sum())]] += 1
    return counts[torch.randperm(experts, generator=gen, device=gen.device).cpu()]


def _dims(shape: Shape) -> tuple[int, int, int, int]:
    return shape["tokens"], shape["experts"], shape["hidden"], shape["ffn"]


def _tensor_bytes(shape: Shape) -> dict[str, int]:
    """Bytes of every tensor a launch reads or writes, by input/output name."""
    t, e, d, f = _dims(shape)
    return {
        "x": _BF16_BYTES * t * d, "dy": _BF16_BYTES * t * d, "y": _BF16_BYTES * t * d, "dx": _BF16_BYTES * t * d,
        "a": _BF16_BYTES * t * f, "gu": _BF16_BYTES * t * 2 * f, "dgu": _BF16_BYTES * t * 2 * f,
        "weights": _FP32_BYTES * t, "dweights": _FP32_BYTES * t, "offsets": _FP32_BYTES * (e + 1),
        "w13": _BF16_BYTES * e * 2 * f * d, "w2": _BF16_BYTES * e * d * f,
        "dw13": _FP32_BYTES * e * 2 * f * d, "dw2": _FP32_BYTES * e * d * f,
    }


def _make_inputs(names: tuple[str, ...], shape: Shape, device: torch.device, seed: int) -> Inputs:
    """Random inputs ``names`` of ``shape`` on ``device``: the shape's expert loads, unit-size outputs.

    Loads come from :func:`expert_loads` (balanced, or skewed by the shape's ``skew``; with
    fewer tokens than experts some experts are empty). Weights are scaled by 1/sqrt(fan-in) and the
    weight-gradient operands by 1/sqrt(tokens per expert), so every output is about unit
    size; g and u are drawn 4x wider than that, so the +-10 clamp is active in the checks.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    t, e, d, f = _dims(shape)
    per_expert = max(1.0, t / e)

    def randn(*size: int, std: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=dtype).mul_(std)

    def offsets() -> Tensor:
        counts = expert_loads(t, e, shape["skew"], gen).to(device).cumsum(0)
        return torch.cat([counts.new_zeros(1), counts]).int()

    factories: dict[str, Callable[[], Tensor]] = {
        "x": lambda: randn(t, d),
        "offsets": offsets,
        "weights": lambda: 0.1 + torch.rand(t, generator=gen, device=device),
        "w13": lambda: randn(e, 2 * f, d, std=d ** -0.5),
        "w2": lambda: randn(e, d, f, std=f ** -0.5),
        "a": lambda: randn(t, f),
        "gu": lambda: randn(t, 2 * f, std=4.0),
        "dy": lambda: randn(t, d, std=(per_expert if "dw2" in names else d / f) ** -0.5),
        "dgu": lambda: randn(t, 2 * f, std=(per_expert if "dw13" in names else 2 * f / d) ** -0.5),
        "dw2": lambda: randn(e, d, f, dtype=torch.float32),
        "dw13": lambda: randn(e, 2 * f, d, dtype=torch.float32),
    }
    return {name: factories[name]() for name in names}


def _default_gemm_config(shape: Shape, block_n: int = 128) -> Config:
    """Row tiles about one expert's load (64-128 rows at the V4 presets), 64-deep K steps."""
    t, e, _, _ = _dims(shape)
    block_m = min(128, max(32, next_pow2(cdiv(t, e))))
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 0, "WARP_SPECIALIZE": 0,
            "num_warps": 8 if block_m == 128 else 4, "num_stages": 3}


def _default_swiglu_bwd_config(shape: Shape) -> Config:
    """Half-width column tiles: the SwiGLU-backward epilogue spills registers at 128 x 128 (unless it runs
    over the tile's halves, ``EPILOGUE_HALVES``)."""
    return {**_default_gemm_config(shape, block_n=64), "EPILOGUE_HALVES": 0}


def _default_wgrad_config(shape: Shape) -> Config:
    """128 x 128 gradient tiles; token steps of 64, shorter for experts of fewer tokens."""
    t, e, _, _ = _dims(shape)
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": min(64, max(16, next_pow2(cdiv(t, e)))),
            "GROUP_M": 8, "TMA": 0, "PREFETCH_GRAD": 0, "num_warps": 8, "num_stages": 3}


def _default_down_wgrad_config(shape: Shape) -> Config:
    """As the up GEMM's, the routing weight applied inside the kernel."""
    return {**_default_wgrad_config(shape), "PRESCALE": 0}


_SHAPE_FIELDS = ("tokens", "experts", "hidden", "ffn", "skew")
_EXACT_FIELDS = ("experts", "hidden", "ffn")
# Rows on one rank for micro-batches of 4,096 and 16,384 tokens, 6 picks each: at EP=8 the
# all-to-all brings each rank 1/8 of the 8 ranks' picks, so both EP=1 and EP=8 see tokens x 6
# rows, over 256 or 32 local experts (Flash), 48 at EP=8 (Pro); balanced and skewed loads.
# Pro at EP=1 (384 experts, W13 34 GB bf16, its fp32 gradient 68 GB) does not fit a sweep on
# one H200. A sweep holds the fp32 dW13 input, a run's output, the reference and the
# comparison's temporaries: about 6 x 17 GB at Flash EP=1.
_PRESETS = {
    "v4-flash": [{"tokens": 6 * mb, "experts": e, "hidden": 4096, "ffn": 2048, "skew": skew}
                 for mb in (4096, 16384) for e in (32, 256) for skew in (0, 50)],
    "v4-pro": [{"tokens": 6 * mb, "experts": 48, "hidden": 7168, "ffn": 3072, "skew": skew}
               for mb in (4096, 16384) for skew in (0, 50)],
    # Ragged loads with rows, D and F not multiples of 16; 5 tokens over 8 experts leave 3 empty.
    "small": [{"tokens": 22, "experts": 3, "hidden": 64, "ffn": 48, "skew": 0},
              {"tokens": 5, "experts": 8, "hidden": 40, "ffn": 24, "skew": 0},
              {"tokens": 37, "experts": 5, "hidden": 40, "ffn": 24, "skew": 150}],
}


def _register_launch(
    name: str,
    fn: Callable[..., Any],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    reference: Callable[..., Any],
    ffn_factor: int,
    default_config: Callable[[Shape], Config],
) -> None:
    """Register one launch: ``fn``, its reference, run and compile take the ``inputs`` in order.

    ``ffn_factor`` is 2 for the launches over both halves of W13 (2 x tokens x hidden x 2F flops).
    """
    def args(values: Inputs) -> list[Any]:
        return [values[n] for n in inputs]

    def compile_only(values: Inputs, config: Config) -> None:
        fn(*args(values), config, compile_only=True)

    register(
        TunableKernel(
            name=name,
            shape_fields=_SHAPE_FIELDS,
            exact_fields=_EXACT_FIELDS,
            make_inputs=lambda shape, device, seed: _make_inputs(inputs, shape, device, seed),
            run=lambda values, config: fn(*args(values), config),
            reference=lambda values: reference(*args(values)),
            default_config=default_config,
            bytes_moved=lambda shape: sum(_tensor_bytes(shape)[n] for n in (*inputs, *outputs)),
            compile=compile_only,
            flops=lambda shape: 2 * shape["tokens"] * shape["hidden"] * ffn_factor * shape["ffn"],
            atol=2e-2,
            rtol=2e-2,
            presets=_PRESETS,
        )
    )


_register_launch("expert_up_fwd", _up_fwd, ("x", "offsets", "w13"), ("a", "gu"), _up_fwd_reference, 2,
                 _default_gemm_config)
_register_launch("expert_down_fwd", _down_fwd, ("a", "offsets", "weights", "w2"), ("y",), _down_fwd_reference, 1,
                 _default_gemm_config)
_register_launch("expert_down_bwd_dx", _down_bwd_dx, ("dy", "offsets", "weights", "gu", "w2"), ("dgu", "dweights"),
                 _down_bwd_dx_reference, 1, _default_swiglu_bwd_config)
_register_launch("expert_down_bwd_dw", _down_bwd_dw, ("dy", "a", "offsets", "weights", "dw2"), ("dw2",),
                 _down_bwd_dw_reference, 1, _default_down_wgrad_config)
_register_launch("expert_up_bwd_dx", _up_bwd_dx, ("dgu", "offsets", "w13"), ("dx",), _up_bwd_dx_reference, 2,
                 _default_gemm_config)
_register_launch("expert_up_bwd_dw", _up_bwd_dw, ("dgu", "x", "offsets", "dw13"), ("dw13",), _up_bwd_dw_reference, 2,
                 _default_wgrad_config)
