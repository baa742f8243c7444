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
Triton expert kernels skip ``.grad`` and add into ``main_grad`` themselves.

The weights, too, become views of flat buffers, one per weight dtype, in the masters' order, so that
``step`` rewrites them as it updates the masters: with ``fused``, in one pass of the Triton kernel
(``kernels.adamw``, 30 bytes a parameter); without, by the eager ops of its reference, in chunks.

Gradient clipping is global: ``grad_sq`` gives this rank's sum of squares, the caller sums it
over the pipeline ranks and passes ``clip_coefficient(total, max_norm)`` to ``step``. Muon (V4's
pretraining optimizer for most matrices) is not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import Tensor, nn

from kernels.adamw import AdamWHyper, adamw_step_, adamw_step_reference_

BYTES_PER_PARAM = 2 + 4 + 4 + 4 + 4  # bf16 weight, fp32 main grad, fp32 master, two fp32 moments


@dataclass(frozen=True)
class _WeightGroup:
    """The parameters of one weight dtype: elements ``start:stop`` of the flat fp32 buffers, those
    before ``decayed_stop`` (the matrices) under weight decay, their weights views of ``weights``."""

    start: int
    stop: int
    decayed_stop: int
    weights: Tensor


def clip_coefficient(grad_sq_total: float, max_norm: float | None) -> float:
    """The factor that scales gradients to a global norm of at most ``max_norm`` (1 without clipping)."""
    if max_norm is None:
        return 1.0
    norm = math.sqrt(grad_sq_total)
    return min(1.0, max_norm / (norm + 1e-6))


class MixedPrecisionAdamW:
    """AdamW over fp32 masters of ``params`` (see the module doc); weight decay on matrices only."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1, fused: bool = False):
        unique = list({id(p): p for p in params if p.requires_grad}.values())
        if not unique:
            raise ValueError("no trainable parameters")
        # grouped by weight dtype, matrices first in each group: weight decay applies to a prefix of each
        self.params = sorted(unique, key=lambda p: (str(p.dtype), p.dim() < 2))
        self.lr, self.betas, self.eps, self.weight_decay, self.fused = lr, betas, eps, weight_decay, fused
        total = sum(p.numel() for p in self.params)
        device = self.params[0].device
        self.main_grads = torch.zeros(total, dtype=torch.float32, device=device)
        self.master = torch.empty(total, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.steps = 0
        self._groups: list[_WeightGroup] = []
        self._parts: dict[int, slice] = {}  # id(p) -> p's elements of the flat buffers
        offset = 0
        for dtype in dict.fromkeys(p.dtype for p in self.params):
            members = [p for p in self.params if p.dtype == dtype]
            size = sum(p.numel() for p in members)
            group = _WeightGroup(offset, offset + size, offset + sum(p.numel() for p in members if p.dim() >= 2),
                                 torch.empty(size, dtype=dtype, device=device))
            for p in members:
                part = slice(offset, offset + p.numel())
                flat = p.detach().flatten()
                self.master[part].copy_(flat)
                weight = group.weights[part.start - group.start:part.stop - group.start]
                weight.copy_(flat)
                p.data = weight.view_as(p)
                p.main_grad = self.main_grads[part].view_as(p)
                p.register_post_accumulate_grad_hook(_accumulate)
                self._parts[id(p)] = part
                offset = part.stop
            self._groups.append(group)

    def master_of(self, p: nn.Parameter) -> Tensor:
        """The fp32 master of ``p``: a view, shaped like ``p``."""
        return self.master[self._parts[id(p)]].view_as(p)

    def zero_grad(self) -> None:
        """Clear the main gradients before the next iteration's microbatches."""
        self.main_grads.zero_()

    def grad_sq(self, skip: Iterable[nn.Parameter] = ()) -> Tensor:
        """Sum of squared main gradients, leaving out ``skip`` (copies whose gradient another rank counts).

        A norm, squared: one reduction with no temporary the size of the gradients."""
        total = torch.linalg.vector_norm(self.main_grads).square()
        for p in skip:
            if hasattr(p, "main_grad"):
                total = total - torch.linalg.vector_norm(p.main_grad).square()
        return total

    @torch.no_grad()
    def step(self, lr: float | None = None, grad_scale: float = 1.0) -> None:
        """One AdamW update of the masters from ``grad_scale * main_grads``, and of the weights from them."""
        self.steps += 1
        hyper = AdamWHyper(lr=self.lr if lr is None else lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                           weight_decay=self.weight_decay, step=self.steps, grad_scale=grad_scale)
        update = adamw_step_ if self.fused else adamw_step_reference_
        for group in self._groups:
            part = slice(group.start, group.stop)
            update(self.main_grads[part], self.master[part], self.exp_avg[part], self.exp_avg_sq[part],
                   group.weights, hyper, decayed=group.decayed_stop - group.start)

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
