"""The MoE combine and dispatch: each token's output is the sum of its top-k routed expert rows, plus
its shared expert row, added in fp32 and written once in the rows' dtype; and the dispatch's gather
of each token's row k times, whose backward is that same sum.

The expert MLP leaves its rows sorted by expert; ``order [N]`` (N = tokens * topk) says which
(token, choice) each sorted row answers: sorted row ``i`` is choice ``order[i] % topk`` of token
``order[i] // topk``. The eager form (``moe_combine_reference``, what ``v4.moe`` ran before) widens
every routed row to fp32, scatters them into an fp32 buffer with ``index_add_`` (atomics on the
GPU), adds the widened shared rows and narrows the sum: five passes over ``[N, D]`` or ``[T, D]``
fp32 tensors. The kernel gathers each token's k rows through the inverse of ``order`` (``slot
[T, k]``: where each choice's row sits) and writes the token's sum once: one read of the routed
and shared rows, one write. The fixed summation order also makes it deterministic.

Backward: a token's output gradient is its routed rows' gradient and its shared row's, so the
routed gradient is a gather of output-gradient rows (``index_select``, one pass in the rows'
dtype) and the shared gradient is the output gradient itself: no kernel of its own.

The dispatch (``moe_dispatch``) is the mirror image: forward a gather of token rows into sorted
order, backward each token's sum of its k row gradients, which is the combine kernel again. Eager
autograd would scatter them with bf16 atomics (``index_put_`` with accumulate), rounding each add.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.contracts import check_integer, check_same_device, values_checked
from kernels.host_math import cdiv, next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

_BF16_BYTES = 2
_INDEX_BYTES = 4


@triton.jit
def _combine_kernel(routed_ptr, slot_ptr, shared_ptr, y_ptr, n_tokens, hidden,
                    TOPK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SHARED: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    token_in = tokens < n_tokens
    mask = token_in[:, None] & (cols < hidden)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for choice in tl.static_range(TOPK):
        rows = tl.load(slot_ptr + tokens.to(tl.int64) * TOPK + choice, mask=token_in, other=0)
        acc += tl.load(routed_ptr + rows.to(tl.int64)[:, None] * hidden + cols[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    offsets = tokens.to(tl.int64)[:, None] * hidden + cols[None, :]
    if HAS_SHARED:
        acc += tl.load(shared_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _forward(routed: Tensor, slot: Tensor, shared: Tensor | None, config: Config,
             compile_only: bool = False) -> Tensor:
    """Launch on contiguous ``routed [N, D]``, ``slot [T, k]`` int32 and ``shared [T, D]`` (or None)."""
    n_tokens, topk = slot.shape
    hidden = routed.shape[1]
    y = torch.empty((n_tokens, hidden), device=routed.device, dtype=routed.dtype)
    block_d = min(config["BLOCK_D"], next_pow2(hidden))
    launch(_combine_kernel, (cdiv(n_tokens, config["BLOCK_T"]), cdiv(hidden, block_d)),
           (routed, slot, routed if shared is None else shared, y, n_tokens, hidden),
           {"TOPK": topk, "BLOCK_T": config["BLOCK_T"], "BLOCK_D": block_d, "HAS_SHARED": shared is not None},
           config, compile_only)
    return y


def slots_of(order: Tensor, topk: int) -> Tensor:
    """``slot [T, k]`` int32: the sorted row holding each token's each choice (the inverse of ``order``)."""
    slot = torch.empty(order.shape[0], device=order.device, dtype=torch.int32)
    slot[order] = torch.arange(order.shape[0], device=order.device, dtype=torch.int32)
    return slot.view(-1, topk)


def _shape_of(routed: Tensor, topk: int) -> Shape:
    return {"tokens": routed.shape[0] // topk, "hidden": routed.shape[1], "topk": topk}


class _MoECombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, routed: Tensor, order: Tensor, topk: int, shared: Tensor | None) -> Tensor:
        config, _ = resolve("moe_combine_fwd", _shape_of(routed, topk))
        y = _forward(routed.contiguous(), slots_of(order, topk),
                     None if shared is None else shared.contiguous(), config)
        ctx.save_for_backward(order)
        ctx.topk, ctx.has_shared = topk, shared is not None
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        (order,) = ctx.saved_tensors
        grad_routed = grad_y.index_select(0, order // ctx.topk)
        return grad_routed, None, None, grad_y if ctx.has_shared else None


class _MoEDispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, topk: int) -> Tensor:
        ctx.save_for_backward(order)
        ctx.topk = topk
        return x.index_select(0, order // topk)

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        (order,) = ctx.saved_tensors
        config, _ = resolve("moe_combine_fwd", _shape_of(grad_rows, ctx.topk))
        return _forward(grad_rows.contiguous(), slots_of(order, ctx.topk), None, config), None, None


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _check_order(order: Tensor, rows: int, topk: int) -> None:
    if topk < 1 or rows % topk:
        raise ValueError(f"topk must be >= 1 and divide the {rows} rows, got {topk}")
    check_integer("order", order)
    if order.shape != (rows,):
        raise ValueError(f"order must be [{rows}] (one entry a sorted row), got {list(order.shape)}")
    if values_checked(order) and order.numel() and not torch.equal(
            torch.sort(order).values, torch.arange(order.numel(), device=order.device, dtype=order.dtype)):
        raise ValueError("order must be a permutation of 0..N-1 (each token's each choice exactly once)")


def _check(routed: Tensor, order: Tensor, topk: int, shared: Tensor | None) -> None:
    if routed.dim() != 2 or routed.dtype not in _FLOATS:
        raise ValueError(f"routed must be a float [N, D] tensor, got {list(routed.shape)} {routed.dtype}")
    _check_order(order, routed.shape[0], topk)
    tokens = routed.shape[0] // topk
    if shared is not None and (shared.shape != (tokens, routed.shape[1]) or shared.dtype != routed.dtype):
        raise ValueError(f"shared must be [{tokens}, {routed.shape[1]}] in {routed.dtype}, "
                         f"got {list(shared.shape)} {shared.dtype}")
    check_same_device(routed=routed, order=order, shared=shared)


def moe_combine(routed: Tensor, order: Tensor, topk: int, shared: Tensor | None = None) -> Tensor:
    """``y [T, D]``: token t's sum of the ``routed`` rows of its ``topk`` choices, plus ``shared[t]``.

    Contract: ``routed [N, D]`` bf16, fp16 or fp32, N = T * topk; ``order [N]`` int32 or int64, a
    permutation of ``0..N-1``, sorted row ``i`` answering choice ``order[i] % topk`` of token
    ``order[i] // topk``; ``shared [T, D]`` in routed's dtype or None; one device. The sum is taken
    in fp32, the output has routed's dtype; differentiable in ``routed`` and ``shared``. That
    ``order`` is a permutation is a value check (on the CPU, or under
    ``TUNER_CHECK_KERNEL_INPUTS=1``); unchecked, a repeated entry leaves another token's choice
    unread (that row reads sorted row 0). Launch parameters come from ``kernels.tuning.resolve``.
    """
    _check(routed, order, topk, shared)
    return _MoECombine.apply(routed, order, topk, shared)


def moe_dispatch(x: Tensor, order: Tensor, topk: int) -> Tensor:
    """``x_sorted [T * topk, D]``: row ``i`` is ``x[order[i] // topk]``, token rows in expert order.

    Contract: as ``moe_combine``'s with ``x [T, D]`` in the place of ``shared``; differentiable in
    ``x``, its gradient each token's fp32 sum of its k row gradients (the combine kernel).
    """
    if x.dim() != 2 or x.dtype not in _FLOATS:
        raise ValueError(f"x must be a float [T, D] tensor, got {list(x.shape)} {x.dtype}")
    _check_order(order, x.shape[0] * max(topk, 1), topk)
    check_same_device(x=x, order=order)
    return _MoEDispatch.apply(x, order, topk)


def moe_dispatch_reference(x: Tensor, order: Tensor, topk: int) -> Tensor:
    """Eager (differentiable) math of ``moe_dispatch``: an index (its backward accumulates in x's dtype)."""
    return x[order // topk]


def moe_combine_reference(routed: Tensor, order: Tensor, topk: int, shared: Tensor | None = None) -> Tensor:
    """Eager (differentiable) math of ``moe_combine``: an fp32 ``index_add_`` of the routed rows."""
    y = torch.zeros((routed.shape[0] // topk, routed.shape[1]), device=routed.device, dtype=torch.float32)
    y = y.index_add(0, order // topk, routed.float())
    if shared is not None:
        y = y + shared.float()
    return y.to(routed.dtype)


def _make_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    rows = shape["tokens"] * shape["topk"]
    routed = torch.randn(rows, shape["hidden"], generator=gen).to(torch.bfloat16)
    shared = torch.randn(shape["tokens"], shape["hidden"], generator=gen).to(torch.bfloat16)
    order = torch.randperm(rows, generator=gen)
    return {"routed": routed.to(device), "order": order.to(device), "slot": slots_of(order, shape["topk"]).to(device),
            "shared": shared.to(device)}


def _run(inputs: Inputs, config: Config) -> Tensor:
    return _forward(inputs["routed"], inputs["slot"], inputs["shared"], config)


def _compile(inputs: Inputs, config: Config) -> None:
    _forward(inputs["routed"], inputs["slot"], inputs["shared"], config, compile_only=True)


def _reference(inputs: Inputs) -> Tensor:
    return moe_combine_reference(inputs["routed"], inputs["order"], inputs["slot"].shape[1], inputs["shared"])


def _default_config(shape: Shape) -> Config:
    """Tiles of 4,096 values (four tokens of 1,024 columns at V4's widths), 4 warps: 32 values a thread."""
    block_d = min(1024, next_pow2(shape["hidden"]))
    block_t = max(1, min(next_pow2(shape["tokens"]), 4096 // block_d, 16))
    return {"BLOCK_T": block_t, "BLOCK_D": block_d, "num_warps": 4, "num_stages": 1}


def _bytes(shape: Shape) -> int:
    tokens, hidden, topk = shape["tokens"], shape["hidden"], shape["topk"]
    return _BF16_BYTES * tokens * hidden * (topk + 2) + _INDEX_BYTES * tokens * topk


register(
    TunableKernel(
        name="moe_combine_fwd",
        shape_fields=("tokens", "hidden", "topk"),
        exact_fields=("hidden", "topk"),
        make_inputs=_make_inputs,
        run=_run,
        reference=_reference,
        default_config=_default_config,
        bytes_moved=_bytes,
        compile=_compile,
        presets={
            "v4-flash": [{"tokens": t, "hidden": 4096, "topk": 6} for t in (4096, 16384)],
            "v4-pro": [{"tokens": t, "hidden": 7168, "topk": 6} for t in (4096, 16384)],
            # hidden not a power of two, k of 1 and 3, a single token
            "small": [{"tokens": 37, "hidden": 96, "topk": 3}, {"tokens": 5, "hidden": 40, "topk": 1},
                      {"tokens": 1, "hidden": 128, "topk": 6}],
        },
    )
)
