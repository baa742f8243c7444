"""The optimizer's AdamW update in one pass: fp32 masters and moments updated from the fp32 main
gradients, and the training weights rewritten from the new masters.

The eager form (``adamw_step_reference_``, what ``v4.optim`` ran before) is nine elementwise ops
over the flat fp32 buffers (the scaled gradient, ``lerp_``, ``mul_``, ``addcmul_``, the decay, the
square root, two for the denominator, ``addcdiv_``), each reading and writing whole buffers, then a
copy into the weights: about 110 bytes a parameter. The kernel reads the gradient, master and two
moments once and writes the master, moments and weight once: 30 bytes a parameter with bf16
weights. At proxy-8l's 2.18 billion parameters that is 65 GB a step instead of about 240.

The arithmetic follows the eager ops one for one (the same fp32 constants, the same order of
operations, IEEE square root and division), so the two agree to within fp32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.contracts import check_same_device
from kernels.host_math import cdiv
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

_WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CHUNK = 1 << 24  # elements the eager form updates at once: bounds its fp32 temporaries to ~128 MB


@dataclass(frozen=True)
class AdamWHyper:
    """One update's hyperparameters. ``step`` counts updates from 1 (bias correction); ``grad_scale``
    multiplies the gradients first (global-norm clipping); the first ``decayed`` elements take weight
    decay (the matrices, which ``v4.optim`` lays out first)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int
    grad_scale: float = 1.0

    def constants(self) -> tuple[float, ...]:
        """The scalars the update multiplies by, computed once in double as the eager ops' are."""
        correction1 = 1 - self.beta1 ** self.step
        correction2_sqrt = (1 - self.beta2 ** self.step) ** 0.5
        return (self.grad_scale, 1 - self.beta1, self.beta2, 1 - self.beta2, 1 - self.lr * self.weight_decay,
                correction2_sqrt, self.eps, -self.lr / correction1)


@triton.jit
def _adamw_kernel(grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, master_out_ptr, exp_avg_out_ptr,
                  exp_avg_sq_out_ptr, weight_ptr, n, decayed, grad_scale, one_minus_beta1, beta2, one_minus_beta2,
                  decay_factor, correction2_sqrt, eps, neg_step_size, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    grad = tl.load(grad_ptr + offsets, mask=mask, other=0.0) * grad_scale
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=mask, other=0.0)
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=mask, other=0.0)
    master = tl.load(master_ptr + offsets, mask=mask, other=0.0)
    exp_avg = exp_avg + one_minus_beta1 * (grad - exp_avg)  # lerp toward grad by 1 - beta1 (< 0.5)
    exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * (grad * grad)
    master = tl.where(offsets < decayed, master * decay_factor, master)
    denom = tl.div_rn(tl.sqrt_rn(exp_avg_sq), correction2_sqrt) + eps
    master = master + neg_step_size * tl.div_rn(exp_avg, denom)
    tl.store(exp_avg_out_ptr + offsets, exp_avg, mask=mask)
    tl.store(exp_avg_sq_out_ptr + offsets, exp_avg_sq, mask=mask)
    tl.store(master_out_ptr + offsets, master, mask=mask)
    tl.store(weight_ptr + offsets, master.to(weight_ptr.dtype.element_ty), mask=mask)


def _launch(grad: Tensor, state: tuple[Tensor, Tensor, Tensor], out: tuple[Tensor, Tensor, Tensor], weight: Tensor,
            decayed: int, hyper: AdamWHyper, config: Config, compile_only: bool = False) -> None:
    """Read ``state`` (master, exp_avg, exp_avg_sq), write ``out`` (the same three; may be ``state``) and
    ``weight``: flat, contiguous, one length."""
    n = grad.numel()
    launch(_adamw_kernel, (cdiv(n, config["BLOCK"]),), (grad, *state, *out, weight, n, decayed, *hyper.constants()),
           {"BLOCK": config["BLOCK"]}, config, compile_only)


def _check(grad: Tensor, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, weight: Tensor, decayed: int) -> None:
    n = grad.numel()
    for name, t in (("grad", grad), ("master", master), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.dim() != 1 or t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != n:
            raise ValueError(f"{name} must be a contiguous 1-D fp32 tensor of {n} elements (grad's), "
                             f"got {list(t.shape)} {t.dtype}{'' if t.is_contiguous() else ' non-contiguous'}")
    if weight.dim() != 1 or weight.dtype not in _WEIGHT_DTYPES or not weight.is_contiguous() or weight.numel() != n:
        raise ValueError(f"weight must be a contiguous 1-D bf16, fp16 or fp32 tensor of {n} elements, "
                         f"got {list(weight.shape)} {weight.dtype}")
    if not 0 <= decayed <= n:
        raise ValueError(f"decayed must be within 0..{n} (the elements under weight decay), got {decayed}")
    check_same_device(grad=grad, master=master, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, weight=weight)


def _check_hyper(hyper: AdamWHyper) -> None:
    if hyper.step < 1:
        raise ValueError(f"step must be >= 1 (updates counted from 1), got {hyper.step}")
    if not (0 <= hyper.beta1 < 1 and 0 <= hyper.beta2 < 1):
        raise ValueError(f"betas must be within [0, 1), got ({hyper.beta1}, {hyper.beta2})")


def adamw_step_(grad: Tensor, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, weight: Tensor,
                hyper: AdamWHyper, decayed: int = 0) -> None:
    """One AdamW update, in place, in one kernel: ``master``, ``exp_avg``, ``exp_avg_sq`` and ``weight``.

    Contract: ``grad``, ``master``, ``exp_avg``, ``exp_avg_sq`` contiguous 1-D fp32 of one length n;
    ``weight`` contiguous 1-D bf16, fp16 or fp32 of length n, overwritten with the new master rounded
    to its dtype; ``0 <= decayed <= n``; ``hyper.step >= 1``; one device. ``grad`` is read, not changed.
    Launch parameters come from ``kernels.tuning.resolve`` at ``params = n``.
    """
    _check(grad, master, exp_avg, exp_avg_sq, weight, decayed)
    _check_hyper(hyper)
    if grad.numel() == 0:
        return
    config, _ = resolve("adamw_step", {"params": grad.numel()})
    state = (master, exp_avg, exp_avg_sq)
    _launch(grad, state, state, weight, decayed, hyper, config)


def adamw_step_reference_(grad: Tensor, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, weight: Tensor,
                          hyper: AdamWHyper, decayed: int = 0) -> None:
    """Eager math of ``adamw_step_`` (same contract), in chunks of 2^24 elements to bound temporaries."""
    _check(grad, master, exp_avg, exp_avg_sq, weight, decayed)
    _check_hyper(hyper)
    grad_scale, one_minus_beta1, beta2, one_minus_beta2, decay_factor, correction2_sqrt, eps, neg_step_size = (
        hyper.constants())
    for start in range(0, grad.numel(), _CHUNK):
        part = slice(start, min(start + _CHUNK, grad.numel()))
        g = grad[part] * grad_scale
        exp_avg[part].lerp_(g, one_minus_beta1)
        exp_avg_sq[part].mul_(beta2).addcmul_(g, g, value=one_minus_beta2)
        if decayed > start and decay_factor != 1:
            master[start:min(decayed, part.stop)].mul_(decay_factor)
        denom = exp_avg_sq[part].sqrt().div_(correction2_sqrt).add_(eps)
        master[part].addcdiv_(exp_avg[part], denom, value=neg_step_size)
        weight[part].copy_(master[part])


# --- the registry's view: an out-of-place update, so that a sweep can time it again and again ---

_HYPER = AdamWHyper(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=3, grad_scale=0.5)


def _make_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    """Masters small beside the update (std 1e-3 against lr 1e-2), so that a wrong update shows
    through the bf16 weight's rounding; moments of a few earlier steps; a third of the elements decayed."""
    gen = torch.Generator().manual_seed(seed)
    n = shape["params"]
    grad = torch.randn(n, generator=gen)
    exp_avg = 0.1 * torch.randn(n, generator=gen)
    exp_avg_sq = 0.01 * (torch.rand(n, generator=gen) + 0.1)
    master = 1e-3 * torch.randn(n, generator=gen)
    return {"grad": grad.to(device), "master": master.to(device), "exp_avg": exp_avg.to(device),
            "exp_avg_sq": exp_avg_sq.to(device), "decayed": n // 3}


def _run(inputs: Inputs, config: Config, compile_only: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    state = (inputs["master"], inputs["exp_avg"], inputs["exp_avg_sq"])
    out = tuple(torch.empty_like(t) for t in state)
    weight = torch.empty_like(inputs["master"], dtype=torch.bfloat16)
    _launch(inputs["grad"], state, out, weight, inputs["decayed"], _HYPER, config, compile_only)
    return (*out, weight)


def _compile(inputs: Inputs, config: Config) -> None:
    _run(inputs, config, compile_only=True)


def _reference(inputs: Inputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    master, exp_avg, exp_avg_sq = (inputs[k].clone() for k in ("master", "exp_avg", "exp_avg_sq"))
    weight = torch.empty_like(master, dtype=torch.bfloat16)
    adamw_step_reference_(inputs["grad"], master, exp_avg, exp_avg_sq, weight, _HYPER, inputs["decayed"])
    return master, exp_avg, exp_avg_sq, weight


def _default_config(shape: Shape) -> Config:
    """Blocks of 2,048 elements over 8 warps (8 a thread: two 16-byte loads of each fp32 stream)."""
    return {"BLOCK": 2048, "num_warps": 8, "num_stages": 1}


def _bytes(shape: Shape) -> int:
    """Gradient, master and moments read (16 bytes), master and moments written (12), a bf16 weight (2)."""
    return 30 * shape["params"]


register(
    TunableKernel(
        name="adamw_step",
        shape_fields=("params",),
        exact_fields=(),
        make_inputs=_make_inputs,
        run=_run,
        reference=_reference,
        default_config=_default_config,
        bytes_moved=_bytes,
        compile=_compile,
        # fp32 state within rounding; the bf16 weight within one step of its own rounding (the
        # interpreter rounds toward zero); the update is 10x the masters, so a wrong one is caught
        atol=1e-6,
        rtol=8e-3,
        presets={
            # a rank's parameters at V4 sizes, 67 million to 1.07 billion (an fp32 buffer of 4.3 GB: the
            # inputs, outputs and reference of a sweep's largest check fit one 80 GB card)
            "v4-flash": [{"params": 1 << k} for k in (26, 28, 30)],
            "v4-pro": [{"params": 1 << 30}],
            "small": [{"params": 1}, {"params": 1000}, {"params": 4097}],
        },
    )
)
