"""Megatron-style mixed-precision AdamW: bf16 weights, fp32 main gradients, fp32 master weights and moments.

Per trainable parameter the run holds (bytes): the bf16 weight (2) that forward and backward use,
an fp32 main gradient (4) into which every microbatch's gradient is accumulated, and the
optimizer's fp32 master weight (4) and two AdamW moments (4 + 4): **18 bytes per parameter**,
:data:`BYTES_PER_PARAM`, the figure ``tuner.plan.costs.MemoryModel`` uses (2 + 4 + 12, of which
the 12 of optimizer state shard over data-parallel ranks under Megatron's distributed optimizer;
this optimizer does not shard). The few fp32 parameters (mHC gates, attention sinks, compressor
position biases) hold a 4-byte weight instead, 20 bytes each. Frozen parameters (the indexer's)
hold only their weight.

Main gradients live in one flat fp32 buffer, each parameter's ``main_grad`` a view of it (as
Megatron's DDP attaches them), so a data-parallel all-reduce is one call. A post-accumulate-grad
hook adds each ``.grad`` into ``main_grad`` and frees it, so bf16 gradients never pile up; the
Triton expert kernels skip ``.grad`` and add into ``main_grad`` themselves. ``step`` updates the
masters in chunks (bounded temporaries) and copies them back into the bf16 weights (rounding).

Gradient clipping is global: ``grad_sq`` gives this rank's sum of squares, the caller sums it
over the pipeline ranks and passes ``clip_coefficient(total, max_norm)`` to ``step``. Muon (V4's
pretraining optimizer for most matrices) is not implemented.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import Tensor, nn

BYTES_PER_PARAM = 2 + 4 + 4 + 4 + 4  # bf16 weight, fp32 main grad, fp32 master, two fp32 moments
_CHUNK = 1 << 24  # elements updated at once: bounds the step's fp32 temporaries to ~128 MB


def clip_coefficient(grad_sq_total: float, max_norm: float | None) -> float:
    """The factor that scales gradients to a global norm of at most ``max_norm`` (1 without clipping)."""
    if max_norm is None:
        return 1.0
    norm = math.sqrt(grad_sq_total)
    return min(1.0, max_norm / (norm + 1e-6))


class MixedPrecisionAdamW:
    """AdamW over fp32 masters of ``params`` (see the module doc); weight decay on matrices only."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1):
        unique = list({id(p): p for p in params if p.requires_grad}.values())
        if not unique:
            raise ValueError("no trainable parameters")
        # matrices first, so that weight decay applies to one prefix of the flat buffers
        self.params = sorted(unique, key=lambda p: p.dim() < 2)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.decayed = sum(p.numel() for p in self.params if p.dim() >= 2)
        total = sum(p.numel() for p in self.params)
        device = self.params[0].device
        self.main_grads = torch.zeros(total, dtype=torch.float32, device=device)
        self.master = torch.empty(total, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.steps = 0
        self._slices: list[tuple[nn.Parameter, slice]] = []
        offset = 0
        for p in self.params:
            part = slice(offset, offset + p.numel())
            offset += p.numel()
            self._slices.append((p, part))
            self.master[part].copy_(p.detach().flatten())
            p.main_grad = self.main_grads[part].view_as(p)
            p.register_post_accumulate_grad_hook(_accumulate)

    def zero_grad(self) -> None:
        """Clear the main gradients before the next iteration's microbatches."""
        self.main_grads.zero_()

    def grad_sq(self, skip: Iterable[nn.Parameter] = ()) -> Tensor:
        """Sum of squared main gradients, leaving out ``skip`` (copies whose gradient another rank counts)."""
        total = self.main_grads.square().sum()
        for p in skip:
            if hasattr(p, "main_grad"):
                total = total - p.main_grad.square().sum()
        return total

    @torch.no_grad()
    def step(self, lr: float | None = None, grad_scale: float = 1.0) -> None:
        """One AdamW update of the masters from ``grad_scale * main_grads``, then copy into the weights."""
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        self.steps += 1
        correction1 = 1 - beta1 ** self.steps
        correction2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        for start in range(0, self.master.numel(), _CHUNK):
            part = slice(start, min(start + _CHUNK, self.master.numel()))
            grad = self.main_grads[part] * grad_scale
            self.exp_avg[part].lerp_(grad, 1 - beta1)
            self.exp_avg_sq[part].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            decay_end = min(max(self.decayed, start), part.stop)
            if self.weight_decay and decay_end > start:
                self.master[start:decay_end].mul_(1 - lr * self.weight_decay)
            denom = self.exp_avg_sq[part].sqrt().div_(correction2_sqrt).add_(self.eps)
            self.master[part].addcdiv_(self.exp_avg[part], denom, value=-lr / correction1)
        for p, part in self._slices:
            p.data.copy_(self.master[part].view_as(p))

    def state_bytes(self) -> int:
        """Bytes this optimizer adds to the weights: fp32 main gradients, masters and moments (16 a parameter)."""
        return 4 * (self.main_grads.numel() + self.master.numel() + self.exp_avg.numel() + self.exp_avg_sq.numel())


def _accumulate(p: nn.Parameter) -> None:
    """Post-accumulate-grad hook: move the fresh ``.grad`` into the fp32 main gradient.

    The hook also fires, with no ``.grad``, for the expert weights whose gradient the Triton
    kernels already added into ``main_grad`` (torch 2.11 on the H200 calls it; 2.13 on CPU not).
    """
    if p.grad is not None:
        p.main_grad.add_(p.grad)
        p.grad = None
