"""CUDA graphs of a stage's layers: each decoder layer's (and the MTP layer's) forward and backward
captured once, then replayed for every microbatch.

Why: on one H100 a proxy-8l layer's forward + backward timed with CUDA events took 1.8-3x the time
its kernels kept the GPU busy (``docs/findings.md``): the host (Python, autograd, each launch's
dispatch) was the limit, not the kernels, so tuned kernels barely moved the step. A replayed graph
launches a layer's hundreds of kernels in one call. ``torch.cuda.make_graphed_callables`` does the
capture: a few warm-up calls on a side stream, then one forward and one backward graph per layer,
all in one memory pool, the backward graphs in the reverse order of the forwards.

What it needs (``RunConfig`` refuses the rest):

* one pipeline stage on the rank, so one microbatch is in flight: a replay overwrites the
  activations the previous replay saved, which its backward must have used by then (1F1B on one
  stage runs each microbatch's backward before the next forward);
* the Triton kernels and no recompute: the eager expert MLP reads its offsets on the host, and a
  checkpoint saves the RNG state on the host; a capture fails on any host sync, naming the op;
* a CUDA device.

The warm-up calls run the layers' backward too, and the Triton expert kernels add their weight
gradients straight into ``main_grad``: the caller zeroes the gradients before the first step (the
optimizer's ``zero_grad`` at every step start does). The saved-activation meter (``v4.memory``)
sees nothing a graphed layer keeps: its memory is the CUDA allocator's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from v4.config import STREAMS, ModelConfig

WARMUP_CALLS = 3  # make_graphed_callables' default: enough for lazy inits (cuBLAS workspaces, Triton loads)


def _sample_args(is_mtp: bool, config: ModelConfig, mbs: int, seq: int, device: torch.device,
                 dtype: torch.dtype) -> tuple[Tensor, ...]:
    """Inputs shaped as a microbatch's to capture a layer with: (h, token_ids), and for the MTP layer
    (h, next_embedding, token_ids)."""
    gen = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(mbs, seq, STREAMS, config.hidden, device=device, dtype=dtype, generator=gen).requires_grad_()
    ids = torch.randint(config.vocab, (mbs, seq), device=device, generator=gen)
    if not is_mtp:
        return h, ids
    next_embedding = torch.randn(mbs, seq, config.hidden, device=device, dtype=dtype, generator=gen).requires_grad_()
    return h, next_embedding, ids


def graph_layers(layers: list[nn.Module], mtp: nn.Module | None, config: ModelConfig, mbs: int, seq: int,
                 device: torch.device, dtype: torch.dtype) -> None:
    """Replace the forward of every module in ``layers`` (and ``mtp``) with its captured graph, in place;
    ``dtype`` is the activations' (the residual streams').

    Parameters stay the modules' own, so an optimizer built before keeps them; every parameter's
    ``main_grad`` must exist already, for the captured expert kernels write into it.
    """
    modules = [*layers, *([mtp] if mtp is not None else [])]
    if not modules:
        return
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need the layers on a CUDA device, got {device}")
    samples = tuple(_sample_args(m is mtp, config, mbs, seq, device, dtype) for m in modules)
    torch.cuda.synchronize()
    torch.cuda.make_graphed_callables(tuple(modules), samples, num_warmup_iters=WARMUP_CALLS,
                                      allow_unused_input=True)
