"""The kernel switch: the table of ops a model calls, from eager PyTorch or from the project's Triton kernels.

``get_ops("eager")`` takes the eager reference of every kernel (each kernel module has one, and
the kernels' tests hold the two to agreement); ``get_ops("triton")`` takes the Triton kernels
where the project has them: RMSNorm, Sinkhorn, the mHC glue / collapse / expand, RoPE on the
512-wide heads, the router tail, the grouped expert MLP with its dispatch and combine, the sparse
attention, the compressor's pooling and the indexer's top-k. Only RoPE on the indexer's 128-wide heads stays eager in both
(``kernels.rope`` rotates 512-wide heads). Until 2026-12-01 the three attention-side kernels had
landed but were not swapped in here, so "triton" runs and profiles before then attended eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from torch import Tensor

from kernels.compressor import compressor_pool
from kernels.grouped_gemm import expert_mlp, expert_mlp_reference
from kernels.indexer import indexer_topk
from kernels.mhc import (
    mhc_collapse, mhc_collapse_reference, mhc_enter, mhc_enter_reference, mhc_expand, mhc_expand_reference,
)
from kernels.cross_entropy import cross_entropy, cross_entropy_reference
from kernels.moe_combine import moe_combine, moe_combine_reference, moe_dispatch, moe_dispatch_reference
from kernels.rmsnorm import rms_norm, rms_norm_reference
from kernels.rope import HEAD_DIM, ROPE_DIM, rope
from kernels.router import route, route_reference
from kernels.sinkhorn import sinkhorn, sinkhorn_reference
from kernels.sparse_attention import sparse_attention
from v4 import attention_ops

Kernels = Literal["eager", "triton"]
KERNEL_CHOICES: tuple[str, ...] = ("eager", "triton")


@dataclass(frozen=True)
class Ops:
    """One callable per op; see the kernel modules (and ``v4.attention_ops``) for their contracts."""

    rms_norm: Callable[..., Tensor]
    sinkhorn: Callable[..., Tensor]
    mhc_enter: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]  # (h, fn, base, scale, eps) -> u, post, comb logits, h
    mhc_collapse: Callable[..., Tensor]
    mhc_expand: Callable[..., Tensor]
    rope: Callable[..., Tensor]  # rope(x [..., H, d], pos, theta, inverse, rope_dim)
    route: Callable[..., tuple[Tensor, Tensor]]
    expert_mlp: Callable[..., Tensor]  # expert_mlp(x_sorted, offsets, weights, w13, w2, grad_buffers)
    moe_dispatch: Callable[..., Tensor]  # moe_dispatch(x, order, topk): token rows in expert order
    moe_combine: Callable[..., Tensor]  # moe_combine(routed, order, topk, shared)
    cross_entropy: Callable[..., Tensor]  # cross_entropy(logits [N, V], labels [N]): the mean loss, fp32
    sparse_attention: Callable[..., Tensor]
    compress_pool: Callable[..., Tensor]
    indexer_topk: Callable[..., tuple[Tensor, Tensor]]
    indexer_rope: Callable[..., Tensor]


def _triton_rope(x: Tensor, pos: Tensor, theta: float, inverse: bool = False, rope_dim: int = ROPE_DIM) -> Tensor:
    """``kernels.rope`` rotates the last 64 dims of 512-wide heads; other widths are the eager op's."""
    if rope_dim != ROPE_DIM or x.shape[-1] != HEAD_DIM:
        raise ValueError(f"the RoPE kernel takes heads of {HEAD_DIM} dims with {ROPE_DIM} rotated, "
                         f"got {x.shape[-1]} with {rope_dim}; use kernels='eager' for other widths")
    return rope(x, pos, theta, inverse)


def _eager_expert_mlp(x_sorted: Tensor, offsets: Tensor, weights: Tensor, w13: Tensor, w2: Tensor,
                      grad_buffers: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The reference has no in-place gradient buffers: its weight gradients reach ``.grad`` as usual."""
    return expert_mlp_reference(x_sorted, offsets, weights, w13, w2)


def _triton_compress_pool(kv: Tensor, score: Tensor, ape: Tensor, ratio: int) -> Tensor:
    """``kernels.compressor`` reads the ratio off ``ape [ratio, coff*d]``; the op's signature also names it."""
    if ape.shape[0] != ratio:
        raise ValueError(f"ape has {ape.shape[0]} rows for ratio {ratio}")
    return compressor_pool(kv, score, ape)


_TABLES = {
    "eager": Ops(rms_norm=rms_norm_reference, sinkhorn=sinkhorn_reference, mhc_enter=mhc_enter_reference,
                 mhc_collapse=mhc_collapse_reference, mhc_expand=mhc_expand_reference, rope=attention_ops.rope_tail,
                 route=route_reference, expert_mlp=_eager_expert_mlp,
                 moe_dispatch=moe_dispatch_reference, moe_combine=moe_combine_reference,
                 cross_entropy=cross_entropy_reference,
                 sparse_attention=attention_ops.sparse_attention, compress_pool=attention_ops.compress_pool,
                 indexer_topk=attention_ops.indexer_topk, indexer_rope=attention_ops.rope_tail),
    "triton": Ops(rms_norm=rms_norm, sinkhorn=sinkhorn, mhc_enter=mhc_enter, mhc_collapse=mhc_collapse,
                  mhc_expand=mhc_expand, rope=_triton_rope, route=route, expert_mlp=expert_mlp,
                  moe_dispatch=moe_dispatch, moe_combine=moe_combine, cross_entropy=cross_entropy,
                  sparse_attention=sparse_attention, compress_pool=_triton_compress_pool, indexer_topk=indexer_topk,
                  indexer_rope=attention_ops.rope_tail),
}


def get_ops(kernels: str) -> Ops:
    """The op table for ``"eager"`` or ``"triton"``."""
    if kernels not in _TABLES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
    return _TABLES[kernels]
