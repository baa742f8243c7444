"""Partial interleaved RoPE (DeepSeek-V4): rotate the last 64 of the 512 dims of every head.

V4 rotates dims 448..511 of each query head and of the shared KV latent as 32 complex pairs
``(2i, 2i+1)`` by the angle ``pos * theta^(-2i/64)``, and de-rotates the attention output
with the inverse rotation. The backward of a rotation is the inverse rotation of the
gradient, so ``rope_bwd`` is the same kernel turning the other way.

Each program takes ``BLOCK_T`` tokens x ``BLOCK_H`` heads. cos and sin are computed in
registers once per token and shared by the program's heads: the frequency in fp64 rounded
once to fp32, then the angle as the fp32 product ``pos * inv_freq``, which is how the V4
reference builds its table. The partner of each rotated element is a second load at offset
``^ 1`` (the same cache lines, served by L1), so the rotation is a multiply-add per element
with no shuffles.

Out of place: the same program copies the first 448 dims through, so the output is written
once and nothing is concatenated. Chosen over rotating in place, which would move 1/8 of the
bytes, because the input may be saved by the op that produced it (in-place would corrupt its
backward) and because in-place partner loads would race with other threads' stores without
a CTA barrier.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.contracts import check_same_device
from kernels.host_math import cdiv, next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

HEAD_DIM = 512
ROPE_DIM = 64
DEFAULT_THETA = 10000.0
_BF16_BYTES = 2
_POS_BYTES = 8  # int64 positions
_HEAD = tl.constexpr(HEAD_DIM)
_ROPE = tl.constexpr(ROPE_DIM)
_NOPE = tl.constexpr(HEAD_DIM - ROPE_DIM)


@triton.jit
def _rotation(pos_ptr, tokens, n_tokens, theta, direction):
    """``[tokens, 64]`` cos and signed sin of each rotated dim: even dims take -sin, odd +sin
    (negated for the inverse rotation, ``direction = -1``)."""
    dims = tl.arange(0, _ROPE)
    exponent = (dims // 2).to(tl.float64) * (-2.0 / _ROPE)
    inv_freq = tl.exp2(exponent * tl.log2(theta + tl.zeros([_ROPE], dtype=tl.float64))).to(tl.float32)
    pos = tl.load(pos_ptr + tokens, mask=tokens < n_tokens, other=0).to(tl.float32)
    angle = pos[:, None] * inv_freq[None, :]
    sin = tl.sin(angle) * direction
    return tl.cos(angle), tl.where(dims % 2 == 0, -sin, sin)


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, out_ptr, n_tokens, n_heads, theta, direction, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    rows = (tokens.to(tl.int64)[:, None] * n_heads + heads[None, :])[:, :, None] * _HEAD
    row_mask = ((tokens < n_tokens)[:, None] & (heads < n_heads)[None, :])[:, :, None]
    cols = tl.arange(0, _HEAD)[None, None, :]
    copy_mask = row_mask & (cols < _NOPE)
    tl.store(out_ptr + rows + cols, tl.load(x_ptr + rows + cols, mask=copy_mask), mask=copy_mask)
    dims = _NOPE + tl.arange(0, _ROPE)[None, None, :]
    cos, sin = _rotation(pos_ptr, tokens, n_tokens, theta, direction)
    x = tl.load(x_ptr + rows + dims, mask=row_mask, other=0.0).to(tl.float32)
    partner = tl.load(x_ptr + rows + (dims ^ 1), mask=row_mask, other=0.0).to(tl.float32)
    out = x * cos[:, None, :] + partner * sin[:, None, :]
    tl.store(out_ptr + rows + dims, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def _rotate(
    x: torch.Tensor, pos: torch.Tensor, theta: float, inverse: bool, config: Config, compile_only: bool = False
) -> torch.Tensor:
    """Launch on contiguous ``x [tokens, heads, 512]`` and ``pos [tokens]``; returns the rotated copy."""
    n_tokens, n_heads, _ = x.shape
    out = torch.empty_like(x)
    launch(
        _rope_kernel,
        (cdiv(n_tokens, config["BLOCK_T"]), cdiv(n_heads, config["BLOCK_H"])),
        (x, pos, out, n_tokens, n_heads, theta, -1.0 if inverse else 1.0),
        {"BLOCK_T": config["BLOCK_T"], "BLOCK_H": config["BLOCK_H"]},
        config,
        compile_only,
    )
    return out


def _resolved(kernel: str, x: torch.Tensor) -> Config:
    config, _ = resolve(kernel, {"tokens": x.shape[0], "heads": x.shape[1]})
    return config


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, pos: torch.Tensor, theta: float, inverse: bool) -> torch.Tensor:
        x3 = x.reshape(-1, x.shape[-2], HEAD_DIM).contiguous()
        flat_pos = pos.reshape(-1).contiguous()
        out = _rotate(x3, flat_pos, theta, inverse, _resolved("rope_fwd", x3))
        ctx.save_for_backward(flat_pos)
        ctx.theta, ctx.inverse = theta, inverse
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (flat_pos,) = ctx.saved_tensors
        grad = grad_out.reshape(-1, grad_out.shape[-2], HEAD_DIM).contiguous()
        dx = _rotate(grad, flat_pos, ctx.theta, not ctx.inverse, _resolved("rope_bwd", grad))
        return dx.view(grad_out.shape), None, None, None


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float = DEFAULT_THETA, inverse: bool = False) -> torch.Tensor:
    """Rotate dims 448..511 of every head of ``x [..., H, 512]`` by integer positions ``pos [...]``.

    Pairs ``(2i, 2i+1)`` turn by ``pos * theta^(-2i/64)``; ``inverse`` turns them back (the
    attention output's de-rotation). Contract: ``x [..., H, 512]`` any float dtype, ``pos``
    (x's leading dims) any integer dtype on x's device, any value (angles taken in fp32, as the
    reference does); any strides (copied). Returns a new tensor of x's dtype whose first 448
    dims equal x's; differentiable in x. Launch parameters come from ``kernels.tuning.resolve``.
    """
    if x.dim() < 2 or x.shape[-1] != HEAD_DIM or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a float tensor [..., heads, {HEAD_DIM}], got {list(x.shape)} {x.dtype}")
    if pos.shape != x.shape[:-2] or pos.dtype.is_floating_point or pos.dtype == torch.bool:
        raise ValueError(f"pos must be integer {list(x.shape[:-2])}, got {list(pos.shape)} {pos.dtype}")
    check_same_device(x=x, pos=pos)
    return _Rope.apply(x, pos, theta, inverse)


def rope_reference(
    x: torch.Tensor, pos: torch.Tensor, theta: float = DEFAULT_THETA, inverse: bool = False
) -> torch.Tensor:
    """Eager (differentiable) math of ``rope``: fp32 rotation, returned in x's dtype."""
    exponents = torch.arange(0, ROPE_DIM, 2, dtype=torch.float64, device=x.device) / ROPE_DIM
    angle = pos.float()[..., None, None] * (theta**-exponents).float()  # [..., 1 (heads), 32]
    cos, sin = angle.cos(), angle.sin() * (-1.0 if inverse else 1.0)
    even, odd = x[..., HEAD_DIM - ROPE_DIM:].float().unflatten(-1, (ROPE_DIM // 2, 2)).unbind(-1)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)
    return torch.cat((x[..., : HEAD_DIM - ROPE_DIM], rotated.to(x.dtype)), -1)


def _random_problem(shape: Shape, seed: int, tensor: str) -> dict[str, torch.Tensor]:
    """CPU bf16 ``tensor`` (x or grad) ``[tokens, heads, 512]`` and int64 positions below 65536."""
    gen = torch.Generator().manual_seed(seed)
    tokens, heads = shape["tokens"], shape["heads"]
    values = torch.randn(tokens, heads, HEAD_DIM, generator=gen).to(torch.bfloat16)
    return {tensor: values, "pos": torch.randint(1, 1 << 16, (tokens,), generator=gen)}


def _reference_bwd(inputs: Inputs) -> torch.Tensor:
    """dL/dx by autograd through the eager forward (a rotation's gradient does not depend on x)."""
    with torch.enable_grad():
        x = torch.zeros_like(inputs["grad"]).requires_grad_()
        (dx,) = torch.autograd.grad(rope_reference(x, inputs["pos"]), x, inputs["grad"])
    return dx


def _default_config(shape: Shape) -> Config:
    """Eight 1 KB rows a program (32 bf16 a thread at 4 warps): heads first, then tokens."""
    block_h = min(8, next_pow2(shape["heads"]))
    return {"BLOCK_T": max(1, 8 // block_h), "BLOCK_H": block_h, "num_warps": 4, "num_stages": 1}


def _bytes(shape: Shape) -> int:
    """x read and the output written once, plus the positions."""
    tokens = shape["tokens"]
    return 2 * _BF16_BYTES * tokens * shape["heads"] * HEAD_DIM + _POS_BYTES * tokens


_PRESETS = {
    "v4-flash": [{"tokens": t, "heads": h} for h in (64, 1) for t in (4096, 16384)],
    "v4-pro": [{"tokens": t, "heads": h} for h in (128, 1) for t in (4096, 16384)],
    "small": [{"tokens": 37, "heads": 3}, {"tokens": 5, "heads": 1}],
}


def _register(name: str, tensor: str, inverse: bool, reference) -> None:
    """Register a launch rotating ``inputs[tensor]``; the backward turns the inverse way."""

    def run(inputs: Inputs, config: Config) -> torch.Tensor:
        return _rotate(inputs[tensor], inputs["pos"], DEFAULT_THETA, inverse, config)

    def compile_config(inputs: Inputs, config: Config) -> None:
        _rotate(inputs[tensor], inputs["pos"], DEFAULT_THETA, inverse, config, compile_only=True)

    register(
        TunableKernel(
            name=name,
            shape_fields=("tokens", "heads"),
            exact_fields=("heads",),
            make_inputs=lambda shape, device, seed: {
                n: t.to(device) for n, t in _random_problem(shape, seed, tensor).items()
            },
            run=run,
            reference=reference,
            default_config=_default_config,
            bytes_moved=_bytes,
            compile=compile_config,
            presets=_PRESETS,
        )
    )


_register("rope_fwd", "x", inverse=False, reference=lambda inputs: rope_reference(inputs["x"], inputs["pos"]))
_register("rope_bwd", "grad", inverse=True, reference=_reference_bwd)
