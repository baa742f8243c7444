"""The optimizer's step over proxy-8l's 2.18 billion parameters: the fused AdamW kernel against the eager ops it replaced.

``v4.optim.MixedPrecisionAdamW.step`` at proxy-8l's parameter count (bf16 matrices, a few fp32
vectors as the mHC gates and sinks are), one optimizer whose ``fused`` switch is flipped between
interleaved rounds, so both paths update the same buffers: the eager ops of ``kernels.adamw``'s
reference, chunked, and the one-pass kernel (``adamw_step``, launch parameters from the arch's
tables). The gradient-norm reduction the training step runs first (``grad_sq``) is timed beside
the square-and-sum it replaced, which allocated a temporary the size of the gradients.

Before timing, a parity gate: a fused and an eager optimizer over the same small model take three
steps from the same state; the fused masters must agree with the eager ones (relative error of the
difference's norm within 1e-5 after the first step). Gradients are random, never zeros. Times: CUDA
events around each call after warm-up, the median of ``--rounds`` interleaved rounds; on a CPU
(``--smoke``: the interpreter, a small count) wall-clock medians, which check the harness only.
Bandwidth counts 30 bytes a parameter for the fused step (what it must move with bf16 weights).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from v4.optim import MixedPrecisionAdamW

PROXY_PARAMS = 2_180_000_000
SMOKE_PARAMS = 100_000
FP32_SHARE = 1e-4  # of the parameters: fp32 vectors (mHC gates, attention sinks, compressor biases)
MATRIX = 1 << 26  # elements of each bf16 matrix the benchmark builds
PARITY_LIMIT = 1e-5
FUSED_BYTES_PER_PARAM = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=int, default=PROXY_PARAMS, help="parameters to update (default: proxy-8l's)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per variant")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_PARAMS:,} parameters on whatever device there is (the CPU: TRITON_INTERPRET=1)")


def _parameters(total: int, device: torch.device, seed: int) -> list[torch.nn.Parameter]:
    """bf16 matrices of up to ``MATRIX`` elements and fp32 vectors, ``total`` elements in all, random."""
    gen = torch.Generator(device=device).manual_seed(seed)
    vectors = max(1, int(total * FP32_SHARE))
    sizes = [MATRIX] * ((total - vectors) // MATRIX) + [(total - vectors) % MATRIX]
    params = [torch.nn.Parameter(0.02 * torch.randn(1, n, device=device, dtype=torch.bfloat16, generator=gen))
              for n in sizes if n]
    params.append(torch.nn.Parameter(torch.randn(vectors, device=device, generator=gen)))
    return params


def _random_grads(optimizer: MixedPrecisionAdamW, seed: int) -> None:
    gen = torch.Generator(device=optimizer.main_grads.device).manual_seed(seed)
    optimizer.main_grads.normal_(generator=gen).mul_(1e-3)


def parity(device: torch.device, params: int = 200_000) -> dict[str, float | bool]:
    """Three steps of a fused and an eager optimizer from one state: the masters' relative difference
    after the first (within fp32 rounding) and after the third (the weights feed no gradient here,
    so the two stay within rounding throughout)."""
    fused, eager = (MixedPrecisionAdamW(_parameters(params, device, seed=1), lr=1e-3, fused=flag) for flag in (True, False))
    errors = []
    for step in range(3):
        for optimizer in (fused, eager):
            _random_grads(optimizer, seed=step)
            optimizer.step(grad_scale=0.5)
        errors.append(float((fused.master - eager.master).norm() / eager.master.norm()))
    return {"first_step_error": errors[0], "third_step_error": errors[-1], "ok": max(errors) <= PARITY_LIMIT}


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Milliseconds of one call: CUDA events on a GPU, the wall clock otherwise."""
    if device.type == "cuda":
        def events(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return events

    def wall(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    return wall


def run(args: argparse.Namespace) -> dict:
    if args.params < 1000 or args.rounds < 1:
        raise ValueError(f"--params must be >= 1000 and --rounds >= 1, got {args.params} and {args.rounds}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    total = SMOKE_PARAMS if args.smoke else args.params
    gate = parity(device)
    figures: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "params": total, "parity": gate}
    if not gate["ok"]:
        return {**figures, "timed": False}
    optimizer = MixedPrecisionAdamW(_parameters(total, device, seed=2), lr=1e-4)
    _random_grads(optimizer, seed=3)
    timer = _timer(device)

    def step(fused: bool) -> Callable[[], None]:
        def call() -> None:
            optimizer.fused = fused
            optimizer.step(grad_scale=0.9)
        return call

    variants = {"eager_step": step(False), "fused_step": step(True),
                "grad_sq_square_sum": lambda: optimizer.main_grads.square().sum(),
                "grad_sq_norm": optimizer.grad_sq}
    for fn in variants.values():  # warm-up: compiles, the allocator's pools
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            samples[name].append(timer(fn))
    ms = {name: statistics.median(values) for name, values in samples.items()}
    figures.update({f"{name}_ms": round(value, 3) for name, value in ms.items()})
    figures.update({
        "fused_over_eager": round(ms["eager_step"] / ms["fused_step"], 2),
        "norm_over_square_sum": round(ms["grad_sq_square_sum"] / ms["grad_sq_norm"], 2),
        "fused_tb_per_s": round(FUSED_BYTES_PER_PARAM * total / ms["fused_step"] / 1e9, 3),
        "rounds": args.rounds, "timed": True,
    })
    return figures
