"""The V4 model's pieces: decoder block, embedding, MTP layer and head, each buildable alone.

* ``Block``: attention then MoE, each wrapped in mHC (``v4.mhc``); ``forward(h [B,S,4,D], token_ids
  [B,S]) -> h``. Token ids feed the hash-routed layers.
* ``Embedding``: token ids → ``[B,S,D]``; the residual copies it into the four streams.
* ``MTPLayer``: V4's one multi-token-prediction layer, ``x = e_proj(RMSNorm(e)) + h_proj(RMSNorm(h))``
  with ``e`` the embedding of the next tokens (broadcast to the four streams, ``h`` normed per
  stream), one block (its own compression ratio, learned routing), then its own head collapse →
  ``[B,S,D]`` ready for the shared LM head.
* ``Head``: the main head collapse, the LM head and the losses: next-token cross entropy, and the
  MTP's (token after next) when the MTP output is given.

``build_layer`` / ``build_embedding`` / ``build_head`` construct one initialised piece (seeded per
piece, see ``v4.init``) so that a profiler can build and time a single layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from v4.attention import Attention
from v4.config import STREAMS, ModelConfig
from v4.init import fill_normal, initialize
from v4.mhc import HeadCollapse, HyperConnection
from v4.moe import MoE
from v4.ops import Ops, get_ops
from v4.recompute import RecomputePlan

NO_RECOMPUTE = RecomputePlan()


class Block(nn.Module):
    """Decoder layer ``layer_id`` (or the MTP layer's block): mHC(attention) then mHC(MoE)."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops, recompute: RecomputePlan,
                 device: torch.device, dtype: torch.dtype):
        super().__init__()
        mhc = "mhc" in recompute.selective
        self.attn_hc = HyperConnection(config, ops, mhc, device, dtype)
        self.attn = Attention(config, layer_id, ops, "attn_core" in recompute.selective, device, dtype)
        self.moe_hc = HyperConnection(config, ops, mhc, device, dtype)
        self.moe = MoE(config, layer_id, ops, "moe_act" in recompute.selective, device, dtype)
        self.layer_id = layer_id

    def forward(self, h: Tensor, token_ids: Tensor) -> Tensor:
        h = self.attn_hc(h, self.attn)
        return self.moe_hc(h, lambda x: self.moe(x, token_ids))


def set_selective(layer: nn.Module, selective: frozenset[str]) -> None:
    """Switch the selective checkpoints of every block inside ``layer`` to ``selective``, in place:
    the profiler measures each module's saving on the one full-width layer it has built."""
    for block in layer.modules():
        if isinstance(block, Block):
            block.attn.recompute_core = "attn_core" in selective
            block.moe.recompute_act = "moe_act" in selective
            block.attn_hc.recompute = block.moe_hc.recompute = "mhc" in selective


class Embedding(nn.Module):
    """Token ids ``[B,S]`` → ``[B,S,D]``; V4's MTP layer reuses the main embedding's weights."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.vocab, config.hidden, device=device, dtype=dtype))
        self.std = config.init_std

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.weight, self.std, gen)

    def forward(self, token_ids: Tensor) -> Tensor:
        return F.embedding(token_ids, self.weight)


def to_streams(x: Tensor) -> Tensor:
    """``[B,S,D]`` → the residual ``[B,S,4,D]`` holding a copy of x in every stream."""
    return x[:, :, None, :].expand(-1, -1, STREAMS, -1).contiguous()


class MTPLayer(nn.Module):
    """``forward(h [B,S,4,D], next_embedding [B,S,D], token_ids [B,S]) -> [B,S,D]``, the MTP's LM-head input."""

    def __init__(self, config: ModelConfig, ops: Ops, recompute: RecomputePlan, device: torch.device,
                 dtype: torch.dtype):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.e_norm = nn.Parameter(torch.empty(config.hidden, **factory))
        self.h_norm = nn.Parameter(torch.empty(config.hidden, **factory))
        self.e_proj = nn.Parameter(torch.empty(config.hidden, config.hidden, **factory))
        self.h_proj = nn.Parameter(torch.empty(config.hidden, config.hidden, **factory))
        self.block = Block(config, config.layers, ops, recompute, device, dtype)
        self.head = HeadCollapse(config, ops, device, dtype)
        self.ops, self.eps, self.std = ops, config.norm_eps, config.init_std

    def init_from(self, gen: torch.Generator) -> None:
        self.e_norm.fill_(1.0)
        self.h_norm.fill_(1.0)
        fill_normal(self.e_proj, self.std, gen)
        fill_normal(self.h_proj, self.std, gen)

    def forward(self, h: Tensor, next_embedding: Tensor, token_ids: Tensor) -> Tensor:
        e = F.linear(self.ops.rms_norm(next_embedding, self.e_norm, self.eps), self.e_proj)
        x = F.linear(self.ops.rms_norm(h, self.h_norm, self.eps), self.h_proj) + e[:, :, None, :]
        return self.head(self.block(x, token_ids))


class Head(nn.Module):
    """``forward(h, labels, mtp_x=None, mtp_labels=None) -> (lm_loss [1], mtp_loss [1])``, mean cross entropies.

    The LM head is applied to the main collapse and, when given, to the MTP's output (V4 shares
    the head weights between them). Without MTP the second loss is zero. Losses are fp32.
    """

    def __init__(self, config: ModelConfig, ops: Ops, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.collapse = HeadCollapse(config, ops, device, dtype)
        self.weight = nn.Parameter(torch.empty(config.vocab, config.hidden, device=device, dtype=dtype))
        self.ops, self.std = ops, config.init_std

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.weight, self.std, gen)

    def _loss(self, x: Tensor, labels: Tensor) -> Tensor:
        logits = F.linear(x, self.weight)  # in x's dtype; the loss widens to fp32 (kernels.cross_entropy)
        return self.ops.cross_entropy(logits.flatten(0, 1), labels.flatten()).reshape(1)

    def forward(self, h: Tensor, labels: Tensor, mtp_x: Tensor | None = None,
                mtp_labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        lm_loss = self._loss(self.collapse(h), labels)
        if mtp_x is None:
            return lm_loss, torch.zeros_like(lm_loss)
        return lm_loss, self._loss(mtp_x, mtp_labels)


def build_layer(config: ModelConfig, layer_id: int, kernels: str = "eager",
                recompute: RecomputePlan = NO_RECOMPUTE, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Block | MTPLayer:
    """One initialised layer: a ``Block`` for a decoder id, the ``MTPLayer`` for ``config.layers``.

    ``recompute``'s selective modules apply inside the layer unless the plan recomputes the layer
    whole, which is the caller's to apply (a stage checkpoints the layer's call). Same seed and
    id, same initial values.
    """
    config.check_layer(layer_id)
    ops, device, inside = get_ops(kernels), torch.device(device), recompute.inside(layer_id)
    if layer_id == config.mtp_id:
        layer = MTPLayer(config, ops, inside, device, dtype)
    else:
        layer = Block(config, layer_id, ops, inside, device, dtype)
    return initialize(layer, seed, f"layer{layer_id}")


def build_embedding(config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                    seed: int = 0) -> Embedding:
    """The initialised embedding; every copy built with one seed starts equal."""
    return initialize(Embedding(config, torch.device(device), dtype), seed, "embedding")


def build_head(config: ModelConfig, kernels: str = "eager", device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Head:
    """The initialised head (collapse, final norm, LM head, losses)."""
    return initialize(Head(config, get_ops(kernels), torch.device(device), dtype), seed, "head")
