"""V4 attention, one module for the three layer types (see "Attention" in ``v4-architecture.md``).

Queries come through the low-rank path ``RMSNorm(x Wq_a) Wq_b`` (the normed ``qr`` is shared with
the CSA indexer), get a weightless per-head RMSNorm and partial RoPE; keys and values are ONE
normed 512-wide latent ``RMSNorm(x Wkv)`` with the same RoPE (MQA). Every layer attends to its
sliding window; HCA layers add every closed compressed entry, CSA layers the indexer's top-k of
theirs. The output's RoPE slice is rotated back, then projected by the grouped low-rank output
(``o_groups`` groups, each to ``o_lora_rank``, concatenated, then to D). Window layers use
``rope_theta``, compressed layers ``compress_rope_theta``.

Left out on purpose, as a BF16 training proxy may: YaRN scaling of the compressed layers' RoPE,
and the Hadamard rotation / FP8-FP4 simulation the reference applies on the indexer path. The
indexer is frozen, as Primus runs it when measuring kernels (indexer distillation off): its
parameters do not train (``requires_grad=False``) and it runs under ``no_grad`` on detached
inputs; its top-k indices are not differentiable anyway.

The ops come from ``v4.ops`` (eager or Triton). Selective recompute of ``attn_core`` checkpoints
the sparse attention itself, keeping q, the latents and the indices.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from v4.config import CSA_RATIO, ModelConfig
from v4.init import fill_normal
from v4.ops import Ops


def positions(batch: int, seq: int, device: torch.device) -> Tensor:
    """``[B, S]`` int64 token positions 0..S-1 (every sequence starts at 0)."""
    return torch.arange(seq, device=device).expand(batch, seq)


class _GroupedProjection(torch.autograd.Function):
    """``y[t, g] = w[g] @ x[t, g]`` for ``x [T, G, I]`` and ``w [G, O, I]``: the output's grouped projection
    as batched GEMMs over x's groups in place, each writing its group's columns of ``y [T, G, O]``.
    ``einsum("tgi,goi->tgo")`` computed the same, but its backward handed ``dx`` and ``dw`` back
    permuted, so autograd copied both (an attention output-sized bf16 copy a layer, and the weight's)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        y = x.new_empty(x.shape[0], w.shape[0], w.shape[1])
        torch.bmm(x.transpose(0, 1), w.transpose(1, 2), out=y.transpose(0, 1))
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        by_group = dy.contiguous().transpose(0, 1)  # [G, T, O]
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty_like(x)
            torch.bmm(by_group, w, out=dx.transpose(0, 1))
        if ctx.needs_input_grad[1]:
            dw = torch.bmm(by_group.transpose(1, 2), x.transpose(0, 1))
        return dx, dw


def grouped_projection(x: Tensor, w: Tensor) -> Tensor:
    """``y [T, G, O]``, ``y[t, g] = w[g] @ x[t, g]``; contract: contiguous ``x [T, G, I]`` and ``w [G, O, I]``
    of one dtype and device; differentiable in both, every gradient in its input's layout."""
    if x.dim() != 3 or w.dim() != 3 or x.shape[1] != w.shape[0] or x.shape[2] != w.shape[2] or not x.is_contiguous():
        raise ValueError(f"grouped_projection takes a contiguous x [T, G, I] and w [G, O, I], got "
                         f"{list(x.shape)} and {list(w.shape)}")
    return _GroupedProjection.apply(x, w)


class Compressor(nn.Module):
    """Pools every ``ratio`` tokens into one normed, RoPE'd entry of width ``dim`` → ``[B, S//ratio, dim]``.

    CSA (ratio 4) projects to two channel halves and overlaps each group with the previous one;
    HCA projects to one. RoPE takes the position of the group's first token.
    """

    def __init__(self, config: ModelConfig, ratio: int, dim: int, rope: Callable[..., Tensor], ops: Ops,
                 device: torch.device, dtype: torch.dtype):
        super().__init__()
        coff = 2 if ratio == CSA_RATIO else 1
        self.wkv = nn.Parameter(torch.empty(coff * dim, config.hidden, device=device, dtype=dtype))
        self.wgate = nn.Parameter(torch.empty(coff * dim, config.hidden, device=device, dtype=dtype))
        self.ape = nn.Parameter(torch.empty(ratio, coff * dim, device=device, dtype=torch.float32))
        self.norm = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.ratio, self.rope, self.ops = ratio, rope, ops
        self.std, self.eps, self.rope_dim = config.init_std, config.norm_eps, config.rope_dim

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.wkv, self.std, gen)
        fill_normal(self.wgate, self.std, gen)
        self.ape.zero_()
        self.norm.fill_(1.0)

    def forward(self, x: Tensor, theta: float) -> Tensor:
        pooled = self.ops.compress_pool(F.linear(x, self.wkv), F.linear(x, self.wgate), self.ape, self.ratio)
        batch, entries = pooled.shape[:2]
        if entries == 0:  # a sequence shorter than one group: nothing to norm or rotate
            return pooled
        pooled = self.ops.rms_norm(pooled, self.norm, self.eps)
        first_token = positions(batch, entries, x.device) * self.ratio
        return self.rope(pooled[:, :, None], first_token, theta, False, self.rope_dim)[:, :, 0]


class Indexer(nn.Module):
    """The lightning indexer of a CSA layer: per query, the top-k compressed entries (frozen, no gradient)."""

    def __init__(self, config: ModelConfig, ops: Ops, device: torch.device, dtype: torch.dtype):
        super().__init__()
        heads, dim = config.indexer_heads, config.indexer_dim
        self.wq = nn.Parameter(torch.empty(heads * dim, config.q_lora_rank, device=device, dtype=dtype))
        self.wweights = nn.Parameter(torch.empty(heads, config.hidden, device=device, dtype=dtype))
        self.compressor = Compressor(config, CSA_RATIO, dim, ops.indexer_rope, ops, device, dtype)
        self.requires_grad_(False)
        self.ops, self.heads, self.dim, self.topk = ops, heads, dim, config.indexer_topk
        self.std, self.rope_dim = config.init_std, config.rope_dim

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.wq, self.std, gen)
        fill_normal(self.wweights, self.std, gen)

    @torch.no_grad()
    def forward(self, x: Tensor, qr: Tensor, pos: Tensor, theta: float) -> Tensor:
        x, qr = x.detach(), qr.detach()
        q = F.linear(qr, self.wq).unflatten(-1, (self.heads, self.dim))
        q = self.ops.indexer_rope(q, pos, theta, False, self.rope_dim)
        keys = self.compressor(x, theta)
        weights = F.linear(x, self.wweights).float() * (self.dim ** -0.5 * self.heads ** -0.5)
        indices, _ = self.ops.indexer_topk(q, keys, weights, self.topk, CSA_RATIO)
        return indices


class Attention(nn.Module):
    """The attention sub-layer of layer ``layer_id``: ``forward(x [B,S,D]) -> [B,S,D]``."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops, recompute_core: bool,
                 device: torch.device, dtype: torch.dtype):
        super().__init__()
        c = config
        factory = dict(device=device, dtype=dtype)
        width = c.heads * c.head_dim
        self.wq_a = nn.Parameter(torch.empty(c.q_lora_rank, c.hidden, **factory))
        self.q_norm = nn.Parameter(torch.empty(c.q_lora_rank, **factory))
        self.wq_b = nn.Parameter(torch.empty(width, c.q_lora_rank, **factory))
        self.wkv = nn.Parameter(torch.empty(c.head_dim, c.hidden, **factory))
        self.kv_norm = nn.Parameter(torch.empty(c.head_dim, **factory))
        self.sink = nn.Parameter(torch.empty(c.heads, device=device, dtype=torch.float32))
        self.wo_a = nn.Parameter(torch.empty(c.o_groups, c.o_lora_rank, width // c.o_groups, **factory))
        self.wo_b = nn.Parameter(torch.empty(c.hidden, c.o_groups * c.o_lora_rank, **factory))
        self.ratio = c.compress_ratios[layer_id]
        self.kind = c.attention_type(layer_id)
        self.compressor = (Compressor(c, self.ratio, c.head_dim, ops.rope, ops, device, dtype)
                           if self.ratio else None)
        self.indexer = Indexer(c, ops, device, dtype) if self.kind == "csa" else None
        self.theta = c.compress_rope_theta if self.ratio else c.rope_theta
        self.ops, self.recompute_core = ops, recompute_core
        self.heads, self.head_dim, self.window = c.heads, c.head_dim, c.window
        self.std, self.eps, self.rope_dim = c.init_std, c.norm_eps, c.rope_dim

    def init_from(self, gen: torch.Generator) -> None:
        for weight in (self.wq_a, self.wq_b, self.wkv, self.wo_a, self.wo_b):
            fill_normal(weight, self.std, gen)
        self.q_norm.fill_(1.0)
        self.kv_norm.fill_(1.0)
        self.sink.zero_()

    def _core(self, q: Tensor, kv: Tensor, kv_compressed: Tensor | None, indices: Tensor | None) -> Tensor:
        return self.ops.sparse_attention(q, kv, self.sink, self.ratio, kv_compressed, indices, self.window)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        pos = positions(batch, seq, x.device)
        ops, theta = self.ops, self.theta
        qr = ops.rms_norm(F.linear(x, self.wq_a), self.q_norm, self.eps)
        q = F.linear(qr, self.wq_b).unflatten(-1, (self.heads, self.head_dim))
        q = ops.rope(ops.rms_norm(q, None, self.eps), pos, theta, False, self.rope_dim)
        kv = ops.rms_norm(F.linear(x, self.wkv), self.kv_norm, self.eps)
        kv = ops.rope(kv[:, :, None], pos, theta, False, self.rope_dim)[:, :, 0]
        kv_compressed = self.compressor(x, theta) if self.compressor is not None else None
        indices = self.indexer(x, qr, pos, theta) if self.indexer is not None else None
        if self.recompute_core:
            o = checkpoint(self._core, q, kv, kv_compressed, indices, use_reentrant=False)
        else:
            o = self._core(q, kv, kv_compressed, indices)
        o = ops.rope(o, pos, theta, True, self.rope_dim)
        o = grouped_projection(o.reshape(batch * seq, self.wo_a.shape[0], -1), self.wo_a)
        return F.linear(o.view(batch, seq, -1), self.wo_b)
