"""mHC Sinkhorn–Knopp projection (DeepSeek-V4): per token, 4x4 logits -> a near doubly stochastic matrix.

``X = softmax(C, -1) + eps``, a priming column normalisation, then ``iters - 1`` pairs of
row then column normalisation, each dividing by the sum + eps. Each program holds
``BLOCK_N`` tokens as a ``[BLOCK_N, 4, 4]`` fp32 register tile, so the whole trajectory
stays in registers and HBM sees one read and one write per token. A normalisation takes
four reciprocals per token and multiplies by them, rather than dividing 16 times.

Backward: the vector-Jacobian product of a pair needs the pair's input state, and
registers cannot hold the trajectory's 20 states (nor can Triton index an array of
them). The kernel recomputes states from the primed softmax with sqrt checkpointing: the
P = iters - 1 pairs are cut into segments of S = ceil(sqrt(P)); walking the segments
last to first, it recomputes the segment's first state (the one checkpoint, held in
registers) and, for each pair of the segment from last to first, advances the
checkpoint to that pair's input and applies the pair's VJP. That recomputes about
P * sqrt(P) pairs (66 for iters = 20) instead of P * (P - 1) / 2 (171) when starting
over from the beginning for every pair, with no scratch memory and a few register tiles.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.host_math import cdiv, next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

DEFAULT_ITERS = 20
DEFAULT_EPS = 1e-6
_MATRIX_BYTES = 16 * 4  # one token's 4x4 fp32 matrix
_WARP_SIZE = 64 if torch.version.hip else 32
# Axes of a [BLOCK_N, 4, 4] tile to sum over: a row's entries, or a column's.
_ROWS = tl.constexpr(2)
_COLS = tl.constexpr(1)


@triton.jit
def _tile_offsets(BLOCK_N: tl.constexpr):
    """Element offsets of this program's ``[BLOCK_N, 4, 4]`` tile of a ``[tokens, 4, 4]`` tensor."""
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.arange(0, 4)
    return tokens[:, None, None] * 16 + idx[None, :, None] * 4 + idx[None, None, :]


@triton.jit
def _softmax_rows(logits):
    e = tl.exp(logits - tl.max(logits, axis=_ROWS, keep_dims=True))
    return e / tl.sum(e, axis=_ROWS, keep_dims=True)


@triton.jit
def _normalize(x, eps, AXIS: tl.constexpr):
    """Divide x by its sums (+eps) over AXIS: ``_ROWS`` or ``_COLS``."""
    return x * (1.0 / (tl.sum(x, axis=AXIS, keep_dims=True) + eps))


@triton.jit
def _normalize_vjp(x, grad, eps, AXIS: tl.constexpr):
    """dL/dx of ``y = _normalize(x)`` given dL/dy: ``(g - sum(g * y)) / d`` with d = sum(x) + eps."""
    inv = 1.0 / (tl.sum(x, axis=AXIS, keep_dims=True) + eps)
    return (grad - tl.sum(grad * x, axis=AXIS, keep_dims=True) * inv) * inv


@triton.jit
def _advance(x, n_pairs, eps):
    """Apply ``n_pairs`` row-then-column normalisation pairs to x."""
    for _ in range(n_pairs):
        x = _normalize(_normalize(x, eps, _ROWS), eps, _COLS)
    return x


@triton.jit
def _sinkhorn_fwd_kernel(logits_ptr, out_ptr, n_tokens, n_pairs, eps, BLOCK_N: tl.constexpr):
    offsets = _tile_offsets(BLOCK_N)
    mask = offsets < n_tokens * 16
    logits = tl.load(logits_ptr + offsets, mask=mask, other=0.0)
    x = _normalize(_softmax_rows(logits) + eps, eps, _COLS)
    tl.store(out_ptr + offsets, _advance(x, n_pairs, eps), mask=mask)


@triton.jit
def _sinkhorn_bwd_kernel(
    logits_ptr, grad_out_ptr, grad_logits_ptr, n_tokens, n_pairs, seg_len, n_segs, eps,
    BLOCK_N: tl.constexpr,
):
    offsets = _tile_offsets(BLOCK_N)
    mask = offsets < n_tokens * 16
    probs = _softmax_rows(tl.load(logits_ptr + offsets, mask=mask, other=0.0))
    grad = tl.load(grad_out_ptr + offsets, mask=mask, other=0.0)
    for s in range(n_segs):
        seg_start = (n_segs - 1 - s) * seg_len
        seg_stop = tl.minimum(seg_start + seg_len, n_pairs)
        checkpoint = _advance(_normalize(probs + eps, eps, _COLS), seg_start, eps)
        for r in range(seg_stop - seg_start):
            x = _advance(checkpoint, seg_stop - 1 - r - seg_start, eps)
            grad = _normalize_vjp(_normalize(x, eps, _ROWS), grad, eps, _COLS)
            grad = _normalize_vjp(x, grad, eps, _ROWS)
    grad = _normalize_vjp(probs + eps, grad, eps, _COLS)
    grad_logits = probs * (grad - tl.sum(grad * probs, axis=_ROWS, keep_dims=True))
    tl.store(grad_logits_ptr + offsets, grad_logits, mask=mask)


def _forward(
    logits: torch.Tensor, iters: int, eps: float, config: Config, compile_only: bool = False
) -> torch.Tensor:
    """Launch the forward on contiguous fp32 ``logits [tokens, 4, 4]``."""
    out = torch.empty_like(logits)
    n_tokens = logits.shape[0]
    launch(
        _sinkhorn_fwd_kernel,
        (cdiv(n_tokens, config["BLOCK_N"]),),
        (logits, out, n_tokens, iters - 1, eps),
        {"BLOCK_N": config["BLOCK_N"]},
        config,
        compile_only,
    )
    return out


def _backward(
    logits: torch.Tensor, grad_out: torch.Tensor, iters: int, eps: float, config: Config, compile_only: bool = False
) -> torch.Tensor:
    """Launch the backward on contiguous fp32 ``[tokens, 4, 4]`` tensors; returns dL/dlogits."""
    grad_logits = torch.empty_like(logits)
    n_tokens, n_pairs = logits.shape[0], iters - 1
    seg_len = max(1, math.ceil(math.sqrt(n_pairs)))
    launch(
        _sinkhorn_bwd_kernel,
        (cdiv(n_tokens, config["BLOCK_N"]),),
        (logits, grad_out, grad_logits, n_tokens, n_pairs, seg_len, cdiv(n_pairs, seg_len), eps),
        {"BLOCK_N": config["BLOCK_N"]},
        config,
        compile_only,
    )
    return grad_logits


def _resolved(kernel: str, logits: torch.Tensor) -> Config:
    config, _ = resolve(kernel, {"tokens": logits.shape[0]})
    return config


class _Sinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        flat = logits.reshape(-1, 4, 4).contiguous()
        out = _forward(flat, iters, eps, _resolved("sinkhorn_fwd", flat))
        ctx.save_for_backward(flat)
        ctx.iters, ctx.eps = iters, eps
        return out.view(logits.shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (flat,) = ctx.saved_tensors
        grad = grad_out.reshape(flat.shape).float().contiguous()
        grad_logits = _backward(flat, grad, ctx.iters, ctx.eps, _resolved("sinkhorn_bwd", flat))
        return grad_logits.view(grad_out.shape), None, None


def sinkhorn(logits: torch.Tensor, iters: int = DEFAULT_ITERS, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Sinkhorn–Knopp projection of ``logits [..., 4, 4]``; fp32 result, differentiable in logits.

    Contract: ``logits [..., 4, 4]`` of any float dtype (upcast to fp32 first), any strides
    (copied); ``iters`` an int >= 1 (row and column normalisations after the softmax). Launch
    parameters come from ``kernels.tuning.resolve``.
    """
    if logits.shape[-2:] != (4, 4) or not logits.is_floating_point():
        raise ValueError(f"logits must be a float [..., 4, 4], got {list(logits.shape)} {logits.dtype}")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    return _Sinkhorn.apply(logits.float(), iters, eps)


def sinkhorn_reference(logits: torch.Tensor, iters: int = DEFAULT_ITERS, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Eager (differentiable) fp32 math of ``sinkhorn``."""
    x = torch.softmax(logits.float(), -1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def _random_tokens(shape: Shape, seed: int) -> dict[str, torch.Tensor]:
    """CPU logits and upstream gradient of ``shape["tokens"]`` tokens drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = shape["tokens"]
    logits = torch.randn(tokens, 4, 4, generator=gen)
    return {"logits": logits, "grad_out": torch.randn(tokens, 4, 4, generator=gen)}


def _make_fwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    return {"logits": _random_tokens(shape, seed)["logits"].to(device)}


def _make_bwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    return {name: t.to(device) for name, t in _random_tokens(shape, seed).items()}


def _run_fwd(inputs: Inputs, config: Config) -> torch.Tensor:
    return _forward(inputs["logits"], DEFAULT_ITERS, DEFAULT_EPS, config)


def _compile_fwd(inputs: Inputs, config: Config) -> None:
    _forward(inputs["logits"], DEFAULT_ITERS, DEFAULT_EPS, config, compile_only=True)


def _reference_fwd(inputs: Inputs) -> torch.Tensor:
    return sinkhorn_reference(inputs["logits"])


def _run_bwd(inputs: Inputs, config: Config) -> torch.Tensor:
    return _backward(inputs["logits"], inputs["grad_out"], DEFAULT_ITERS, DEFAULT_EPS, config)


def _compile_bwd(inputs: Inputs, config: Config) -> None:
    _backward(inputs["logits"], inputs["grad_out"], DEFAULT_ITERS, DEFAULT_EPS, config, compile_only=True)


def _reference_bwd(inputs: Inputs) -> torch.Tensor:
    """dL/dlogits by autograd through the eager math."""
    with torch.enable_grad():
        logits = inputs["logits"].detach().requires_grad_()
        (grad,) = torch.autograd.grad(sinkhorn_reference(logits), logits, inputs["grad_out"])
    return grad


def _default_config(shape: Shape) -> Config:
    """One token per thread (measured fastest on an H200), 16-64 tokens per program."""
    block_n = min(64, max(16, next_pow2(shape["tokens"] // 128)))
    return {"BLOCK_N": block_n, "num_warps": max(1, block_n // _WARP_SIZE), "num_stages": 1}


def _bytes_fwd(shape: Shape) -> int:
    return 2 * _MATRIX_BYTES * shape["tokens"]


def _bytes_bwd(shape: Shape) -> int:
    return 3 * _MATRIX_BYTES * shape["tokens"]


_PRESETS = {
    "v4-flash": [{"tokens": t} for t in (4096, 16384, 65536)],
    "v4-pro": [{"tokens": t} for t in (4096, 16384, 65536)],
    "small": [{"tokens": t} for t in (1, 33, 100)],
}

register(
    TunableKernel(
        name="sinkhorn_fwd",
        shape_fields=("tokens",),
        exact_fields=(),
        make_inputs=_make_fwd_inputs,
        run=_run_fwd,
        reference=_reference_fwd,
        default_config=_default_config,
        bytes_moved=_bytes_fwd,
        compile=_compile_fwd,
        atol=1e-5,
        rtol=1e-4,
        presets=_PRESETS,
    )
)
register(
    TunableKernel(
        name="sinkhorn_bwd",
        shape_fields=("tokens",),
        exact_fields=(),
        make_inputs=_make_bwd_inputs,
        run=_run_bwd,
        reference=_reference_bwd,
        default_config=_default_config,
        bytes_moved=_bytes_bwd,
        compile=_compile_bwd,
        atol=1e-4,
        rtol=1e-3,
        presets=_PRESETS,
    )
)
