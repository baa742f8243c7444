"""The V4 MoE sub-layer, present in every layer (see "MoE" in ``v4-architecture.md``).

The router scores ``s = sqrt(softplus(x Wg^T))`` in fp32. The first ``hash_layers`` layers pick
their experts from a frozen token-id table ``tid2eid [vocab, k]`` (drawn once from the seed, k
distinct experts per token); later layers take the top-k of ``s + bias``, the bias steering the
choice only. The weights are the chosen scores normalised to one, times ``routed_scale``. Tokens
are sorted by expert and run through the grouped expert MLP (clamped SwiGLU); the shared
expert(s) run densely on every token through the same op, as one expert of width
``shared_experts * expert_ffn``. The dispatch gathers token rows into expert order and the
combine sums each token's routed rows and shared row in fp32 (``kernels.moe_combine``).

The selection bias is a buffer that stays zero here: V4's auxiliary-loss-free balancing nudges it
after each step from the expert loads; this proxy leaves that update out (Primus forces uniform
balancing when it measures steps, for the same reason: stable expert shapes).

Weights are stored as the grouped-GEMM kernel wants them: ``w13 [E, 2F, D]`` (gate rows, then up
rows) and ``w2 [E, D, F]``. When a parameter carries a Megatron-style fp32 ``main_grad`` (see
``v4.optim``) and the Triton kernel runs, the kernel adds its weight gradients straight into it.
Selective recompute of ``moe_act`` checkpoints the expert MLPs (routed and shared): the fused
kernel makes the SwiGLU inseparable from its GEMMs, so they are recomputed too, which is more
than Megatron's activation-only ``moe_act`` recomputes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from v4.config import ModelConfig
from v4.init import fill_normal
from v4.ops import Ops


def _grad_buffers(w13: Tensor, w2: Tensor) -> tuple[Tensor, Tensor] | None:
    """The weights' fp32 main gradients, when an optimizer has attached them."""
    if hasattr(w13, "main_grad") and hasattr(w2, "main_grad"):
        return w13.main_grad, w2.main_grad
    return None


def expert_offsets(sorted_experts: Tensor, experts: int) -> Tensor:
    """``[experts + 1]`` int32 row offsets of each expert in ``sorted_experts`` (ascending ids).

    A search on the device: ``torch.bincount`` on a GPU reads its input's maximum back to the
    host, which made every MoE layer's forward wait for the GPU."""
    bounds = torch.arange(experts + 1, device=sorted_experts.device, dtype=sorted_experts.dtype)
    return torch.searchsorted(sorted_experts, bounds, out_int32=True)


class MoE(nn.Module):
    """``forward(x [B,S,D], token_ids [B,S]) -> [B,S,D]``: routed experts plus the shared expert."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops, recompute_act: bool,
                 device: torch.device, dtype: torch.dtype):
        super().__init__()
        c = config
        factory = dict(device=device, dtype=dtype)
        self.gate = nn.Parameter(torch.empty(c.experts, c.hidden, **factory))
        self.register_buffer("bias", torch.zeros(c.experts, device=device, dtype=torch.float32))
        self.hashed = c.hash_routed(layer_id)
        if self.hashed:
            self.register_buffer("tid2eid", torch.zeros(c.vocab, c.experts_per_token, device=device, dtype=torch.int32))
        self.w13 = nn.Parameter(torch.empty(c.experts, 2 * c.expert_ffn, c.hidden, **factory))
        self.w2 = nn.Parameter(torch.empty(c.experts, c.hidden, c.expert_ffn, **factory))
        shared_ffn = c.shared_experts * c.expert_ffn
        self.shared_w13 = nn.Parameter(torch.empty(1, 2 * shared_ffn, c.hidden, **factory)) if shared_ffn else None
        self.shared_w2 = nn.Parameter(torch.empty(1, c.hidden, shared_ffn, **factory)) if shared_ffn else None
        self.ops, self.recompute_act = ops, recompute_act
        self.topk, self.scale, self.std = c.experts_per_token, c.routed_scale, c.init_std

    def init_from(self, gen: torch.Generator) -> None:
        for weight in (self.gate, self.w13, self.w2, self.shared_w13, self.shared_w2):
            if weight is not None:
                fill_normal(weight, self.std, gen)
        if self.hashed:
            vocab, experts = self.tid2eid.shape[0], self.w13.shape[0]
            table = torch.rand(vocab, experts, generator=gen).argsort(-1)[:, : self.topk]
            self.tid2eid.copy_(table.int())

    def _route(self, x2: Tensor, token_ids: Tensor) -> tuple[Tensor, Tensor]:
        logits = F.linear(x2.float(), self.gate.float())
        if self.hashed:
            return self.ops.route(logits, None, self.topk, self.scale, token_ids.reshape(-1), self.tid2eid)
        return self.ops.route(logits, self.bias, self.topk, self.scale)

    def _experts(self, x2: Tensor, order: Tensor, offsets: Tensor, weights: Tensor) -> Tensor:
        ops = self.ops
        routed = ops.expert_mlp(ops.moe_dispatch(x2, order, self.topk), offsets, weights, self.w13, self.w2,
                                _grad_buffers(self.w13, self.w2))
        shared = None
        if self.shared_w13 is not None:
            n_tokens = x2.shape[0]
            # [0, n_tokens] made on the device: a list copied from the host would wait for the GPU
            everyone = torch.arange(2, device=x2.device, dtype=torch.int32) * n_tokens
            ones = torch.ones(n_tokens, device=x2.device, dtype=torch.float32)
            shared = ops.expert_mlp(x2, everyone, ones, self.shared_w13, self.shared_w2,
                                    _grad_buffers(self.shared_w13, self.shared_w2))
        return ops.moe_combine(routed, order, self.topk, shared)

    def forward(self, x: Tensor, token_ids: Tensor) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        indices, weights = self._route(x2, token_ids)
        expert_of = indices.reshape(-1).long()
        order = torch.argsort(expert_of, stable=True)
        offsets = expert_offsets(expert_of[order], self.w13.shape[0])
        sorted_weights = weights.reshape(-1)[order]
        if self.recompute_act:
            y = checkpoint(self._experts, x2, order, offsets, sorted_weights, use_reentrant=False)
        else:
            y = self._experts(x2, order, offsets, sorted_weights)
        return y.view(x.shape)
