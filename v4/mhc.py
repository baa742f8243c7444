"""mHC around a sub-layer, and the head's stream collapse (see "mHC" in ``v4-architecture.md``).

The residual ``h [B,S,4,D]`` holds four streams. ``HyperConnection`` wraps one sub-layer: the glue
projects h onto 24 gate logits (``pre``, ``post`` and the 4x4 mixing logits, which Sinkhorn makes
near doubly stochastic), the collapse ``u = sum_j pre_j h_j`` feeds the sub-layer through its
RMSNorm (the norm comes after the collapse), and the expand writes
``h'_k = post_k f + sum_j C[j,k] h_j``. ``HeadCollapse`` is the output side: its own ``pre`` from
``fn [4, 4D]``, the collapse, then the final RMSNorm.

Initialisation (V4's training init is not public): ``fn`` small normal, ``base`` 0 and ``scale``
1, so every stream starts with ``pre ~ 0.5``, ``post ~ 1`` and a uniform mixing matrix.
Selective recompute (``recompute=True``) checkpoints the entry (glue, Sinkhorn, collapse, norm) and
the expand, keeping only their inputs.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from v4.config import STREAMS, ModelConfig
from v4.init import fill_normal
from v4.ops import Ops

_GATES = 2 * STREAMS + STREAMS * STREAMS  # pre, post, comb


class HyperConnection(nn.Module):
    """One sub-layer's mHC: ``forward(h, sublayer)`` returns the new residual ``[B,S,4,D]``."""

    def __init__(self, config: ModelConfig, ops: Ops, recompute: bool, device: torch.device, dtype: torch.dtype):
        super().__init__()
        fp32 = dict(device=device, dtype=torch.float32)
        self.fn = nn.Parameter(torch.empty(_GATES, STREAMS * config.hidden, **fp32))
        self.base = nn.Parameter(torch.empty(_GATES, **fp32))
        self.scale = nn.Parameter(torch.empty(3, **fp32))
        self.norm = nn.Parameter(torch.empty(config.hidden, device=device, dtype=dtype))
        self.ops, self.recompute = ops, recompute
        self.eps, self.norm_eps, self.std = config.hc_eps, config.norm_eps, config.init_std
        self.iters = config.sinkhorn_iters

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.fn, self.std, gen)
        self.base.zero_()
        self.scale.fill_(1.0)
        self.norm.fill_(1.0)

    def _enter(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The sub-layer's input, post, the mixing matrix, and h as the entry hands it on (``mhc_enter``:
        the expand takes h from it, so that all of h's gradient is summed in one kernel)."""
        u, post, comb_logits, h = self.ops.mhc_enter(h, self.fn, self.base, self.scale, self.eps)
        comb = self.ops.sinkhorn(comb_logits, self.iters, self.eps)
        return self.ops.rms_norm(u, self.norm, self.norm_eps), post, comb, h

    def forward(self, h: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if not self.recompute:
            x, post, comb, h = self._enter(h)
            return self.ops.mhc_expand(sublayer(x), h, post, comb)
        x, post, comb, h = checkpoint(self._enter, h, use_reentrant=False)
        return checkpoint(self.ops.mhc_expand, sublayer(x), h, post, comb, use_reentrant=False)


class HeadCollapse(nn.Module):
    """The output side of the residual: ``pre`` from its own ``fn [4, 4D]``, collapse, final RMSNorm → ``[B,S,D]``."""

    def __init__(self, config: ModelConfig, ops: Ops, device: torch.device, dtype: torch.dtype):
        super().__init__()
        fp32 = dict(device=device, dtype=torch.float32)
        self.fn = nn.Parameter(torch.empty(STREAMS, STREAMS * config.hidden, **fp32))
        self.base = nn.Parameter(torch.empty(STREAMS, **fp32))
        self.scale = nn.Parameter(torch.empty(1, **fp32))
        self.norm = nn.Parameter(torch.empty(config.hidden, device=device, dtype=dtype))
        self.ops = ops
        self.eps, self.norm_eps, self.std = config.hc_eps, config.norm_eps, config.init_std

    def init_from(self, gen: torch.Generator) -> None:
        fill_normal(self.fn, self.std, gen)
        self.base.zero_()
        self.scale.fill_(1.0)
        self.norm.fill_(1.0)

    def forward(self, h: Tensor) -> Tensor:
        xf = h.flatten(-2).float()
        m = (xf @ self.fn.T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        pre = torch.sigmoid(m * self.scale + self.base) + self.eps
        return self.ops.rms_norm(self.ops.mhc_collapse(h, pre), self.norm, self.norm_eps)
