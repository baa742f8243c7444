"""The LM head's cross entropy: the mean over rows of ``logsumexp(logits) - logits[label]``, in fp32,
read straight from the head's bf16 logits.

The eager form (``cross_entropy_reference``, what ``v4.model.Head`` ran before) widens the logits
``[N, V]`` to fp32, takes ``log_softmax`` (another fp32 ``[N, V]``, kept for backward) and gathers the
labels; its backward writes a one-hot fp32 ``[N, V]``, the ``log_softmax`` gradient, and narrows it
back: about nine passes over a tensor twice the logits' size. At V4's vocabulary (129,280) and 4,096
tokens that is 18 GB of traffic per loss, two losses a microbatch (the LM and MTP heads).

The forward kernel reads each row once, in chunks of ``BLOCK_V``, keeping a running maximum and
sum of exponentials per lane (one program a row), and writes the row's loss and log-sum-exp (4 + 4 bytes).
The backward kernel reads the row again and writes ``(softmax - onehot) * grad / N`` in the logits'
dtype: one read and one write of the logits for the whole backward, and nothing of ``[N, V]`` kept
but the logits themselves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from kernels.contracts import check_integer, check_range, check_same_device
from kernels.host_math import next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _forward_kernel(logits_ptr, labels_ptr, loss_ptr, lse_ptr, vocab, row_stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * row_stride
    cols = tl.arange(0, BLOCK_V)
    # per lane, a running maximum and the sum of exponentials below it; the maximum starts finite, so
    # a lane that only ever sees masked columns (-inf) adds exp(-inf) = 0 and never forms inf - inf
    lane_max = tl.full([BLOCK_V], -1e30, tl.float32)
    lane_sum = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        x = tl.load(base + start + cols, mask=start + cols < vocab, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.exp(x - new_max)
        lane_max = new_max
    row_max = tl.max(lane_max, 0)
    lse = row_max + tl.log(tl.sum(lane_sum * tl.exp(lane_max - row_max), 0))
    label = tl.load(labels_ptr + row).to(tl.int64)
    tl.store(loss_ptr + row, lse - tl.load(base + label).to(tl.float32))
    tl.store(lse_ptr + row, lse)


@triton.jit
def _backward_kernel(logits_ptr, labels_ptr, lse_ptr, grad_ptr, grad_logits_ptr, vocab, row_stride, scale,
                     BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    offset = row.to(tl.int64) * row_stride
    cols = tl.arange(0, BLOCK_V)
    lse = tl.load(lse_ptr + row)
    label = tl.load(labels_ptr + row).to(tl.int64)
    weight = tl.load(grad_ptr).to(tl.float32) * scale  # the loss's gradient, on the device: no host read
    for start in range(0, vocab, BLOCK_V):
        mask = start + cols < vocab
        x = tl.load(logits_ptr + offset + start + cols, mask=mask, other=0.0).to(tl.float32)
        grad = (tl.exp(x - lse) - tl.where(start + cols == label, 1.0, 0.0)) * weight
        tl.store(grad_logits_ptr + offset + start + cols, grad.to(grad_logits_ptr.dtype.element_ty), mask=mask)


def _block_v(config: Config, vocab: int) -> int:
    return min(config["BLOCK_V"], next_pow2(vocab))


def _forward(logits: Tensor, labels: Tensor, config: Config, compile_only: bool = False) -> tuple[Tensor, Tensor]:
    """Per-row losses and log-sum-exps (fp32) of ``logits [N, V]`` (unit column stride), ``labels [N]``."""
    rows, vocab = logits.shape
    loss = torch.empty(rows, device=logits.device, dtype=torch.float32)
    lse = torch.empty(rows, device=logits.device, dtype=torch.float32)
    launch(_forward_kernel, (rows,), (logits, labels, loss, lse, vocab, logits.stride(0)),
           {"BLOCK_V": _block_v(config, vocab)}, config, compile_only)
    return loss, lse


def _backward(logits: Tensor, labels: Tensor, lse: Tensor, grad: Tensor, scale: float, config: Config,
              compile_only: bool = False) -> Tensor:
    """``(softmax(logits) - onehot(labels)) * grad * scale`` in logits' dtype; ``grad`` a one-value tensor."""
    rows, vocab = logits.shape
    grad_logits = torch.empty((rows, vocab), device=logits.device, dtype=logits.dtype)
    launch(_backward_kernel, (rows,), (logits, labels, lse, grad, grad_logits, vocab, logits.stride(0), scale),
           {"BLOCK_V": _block_v(config, vocab)}, config, compile_only)
    return grad_logits


def _shape_of(logits: Tensor) -> Shape:
    return {"rows": logits.shape[0], "vocab": logits.shape[1]}


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor) -> Tensor:
        config, _ = resolve("cross_entropy_fwd", _shape_of(logits))
        loss, lse = _forward(logits, labels, config)
        ctx.save_for_backward(logits, labels, lse)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, labels, lse = ctx.saved_tensors
        config, _ = resolve("cross_entropy_bwd", _shape_of(logits))
        return _backward(logits, labels, lse, grad.reshape(1), 1.0 / logits.shape[0], config), None


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """The mean over rows of ``-log softmax(logits)[label]``: ``F.cross_entropy(logits.float(), labels)``.

    Contract: ``logits [N, V]`` bf16, fp16 or fp32, N and V >= 1, its columns contiguous (rows may
    be strided); ``labels [N]`` int32 or int64 in ``[0, V)`` (a value check on the CPU, or under
    ``TUNER_CHECK_KERNEL_INPUTS=1``); one device. Returns a 0-dim fp32 tensor, differentiable in
    ``logits``, whose gradient has their dtype. Launch parameters come from ``kernels.tuning.resolve``.
    """
    if logits.dim() != 2 or logits.dtype not in _FLOATS or 0 in logits.shape:
        raise ValueError(f"logits must be a non-empty float [N, V] tensor, got {list(logits.shape)} {logits.dtype}")
    if logits.stride(1) != 1:
        raise ValueError(f"logits must have contiguous columns, got strides {list(logits.stride())}")
    check_integer("labels", labels)
    if labels.shape != (logits.shape[0],):
        raise ValueError(f"labels must be [{logits.shape[0]}] (one a row of logits), got {list(labels.shape)}")
    check_range("labels", labels, 0, logits.shape[1], "vocabulary ids")
    check_same_device(logits=logits, labels=labels)
    return _CrossEntropy.apply(logits, labels)


def cross_entropy_reference(logits: Tensor, labels: Tensor) -> Tensor:
    """Eager (differentiable) math of ``cross_entropy``: widen to fp32, then PyTorch's cross entropy."""
    return F.cross_entropy(logits.float(), labels)


# ----- the two launches, as the sweep service sees them ---------------------------------


def _make_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    """Logits of a spread a trained head's take (a few units), labels anywhere in the vocabulary; the
    backward's log-sum-exps from the reference, and a loss gradient of one (no 1/N: values up to 1)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(shape["rows"], shape["vocab"], generator=gen)).to(torch.bfloat16)
    labels = torch.randint(0, shape["vocab"], (shape["rows"],), generator=gen)
    lse = torch.logsumexp(logits.float(), -1)
    grad = torch.ones(1) + torch.rand(1, generator=gen)  # not exactly one: a dropped factor would show
    return {"logits": logits.to(device), "labels": labels.to(device), "lse": lse.to(device), "grad": grad.to(device)}


def _run_forward(inputs: Inputs, config: Config) -> tuple[Tensor, Tensor]:
    return _forward(inputs["logits"], inputs["labels"], config)


def _compile_forward(inputs: Inputs, config: Config) -> None:
    _forward(inputs["logits"], inputs["labels"], config, compile_only=True)


def _reference_forward(inputs: Inputs) -> tuple[Tensor, Tensor]:
    logits = inputs["logits"].float()
    lse = torch.logsumexp(logits, -1)
    return lse - logits.gather(1, inputs["labels"][:, None]).squeeze(1), lse


def _run_backward(inputs: Inputs, config: Config) -> Tensor:
    return _backward(inputs["logits"], inputs["labels"], inputs["lse"], inputs["grad"], 1.0, config)


def _compile_backward(inputs: Inputs, config: Config) -> None:
    _backward(inputs["logits"], inputs["labels"], inputs["lse"], inputs["grad"], 1.0, config, compile_only=True)


def _reference_backward(inputs: Inputs) -> Tensor:
    logits = inputs["logits"]
    probs = torch.softmax(logits.float(), -1)
    onehot = F.one_hot(inputs["labels"], logits.shape[1]).float()
    return ((probs - onehot) * inputs["grad"]).to(logits.dtype)


def _default_config(shape: Shape) -> Config:
    """Chunks of up to 4,096 columns (the space's least, 256, for a smaller vocabulary), a warp a 512
    of them: 16 values a thread a chunk."""
    block_v = min(4096, max(256, next_pow2(shape["vocab"])))
    return {"BLOCK_V": block_v, "num_warps": max(1, block_v // 512), "num_stages": 2}


def _bytes_forward(shape: Shape) -> int:
    return 2 * shape["rows"] * shape["vocab"] + 16 * shape["rows"]


def _bytes_backward(shape: Shape) -> int:
    return 4 * shape["rows"] * shape["vocab"] + 16 * shape["rows"]


# V4's vocabulary at a microbatch of 4,096 tokens and four of them; the half-width proxy's; ragged rows
# and vocabularies (not a power of two, smaller than a chunk, one row).
_PRESETS = {
    "v4-flash": [{"rows": r, "vocab": 129280} for r in (4096, 16384)],
    "proxy": [{"rows": 4096, "vocab": 32768}],
    "small": [{"rows": 7, "vocab": 1000}, {"rows": 1, "vocab": 5}, {"rows": 33, "vocab": 4097}],
}

for _name, _run, _compile, _reference, _bytes, _atol in (
        ("cross_entropy_fwd", _run_forward, _compile_forward, _reference_forward, _bytes_forward, 2e-3),
        ("cross_entropy_bwd", _run_backward, _compile_backward, _reference_backward, _bytes_backward, 1e-3)):
    register(TunableKernel(name=_name, shape_fields=("rows", "vocab"), exact_fields=("vocab",),
                           make_inputs=_make_inputs, run=_run, reference=_reference, default_config=_default_config,
                           bytes_moved=_bytes, compile=_compile, atol=_atol, rtol=2e-2, presets=_PRESETS))
