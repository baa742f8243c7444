"""Expert MLP forward and forward + backward: the fused Triton path against torch._grouped_mm with eager SwiGLU (issue 36: >= 1.3x, backward <= 2.2x forward).

The whole routed expert MLP of one MoE layer (``kernels.grouped_gemm.expert_mlp``: up GEMM and
clamped SwiGLU, down GEMM and routing weight; backward: both dX GEMMs with the SwiGLU backward fused,
both weight-gradient GEMMs) at V4-Flash EP 8 (32 local experts) and V4-Pro EP 8 (48), balanced
loads, with the arch's tables. The peer is what a model without the project's kernels runs:
``torch._grouped_mm`` for the GEMMs, the SwiGLU and routing weight in eager PyTorch, autograd for
the backward (where the installed torch rejects ``_grouped_mm``, as on a CPU, one ``torch.mm`` per
expert, named ``loop``).

Two gradient modes, each variant timed in both:

* ``bf16``: the weight gradients come back to autograd in bf16, like for like with the peer;
* ``main_grad``: they are added into fp32 buffers, as in training (``v4.optim``): the Triton kernels
  add in their epilogue, the peer adds its bf16 gradients after its backward.

Before any timing, both paths' outputs and gradients (y, dx, the routing-weight and weight gradients)
are compared at full size with the kernels' eager reference fed fp32 copies (one matmul per expert):
the Triton path passes where each of its errors is within 1% (3% under the interpreter, whose bf16
rounding truncates) or within twice the peer's own; a shape that fails is reported and not timed. Times:
``triton.testing.do_bench`` (warm-up, L2 flushed before each repetition, CUDA events) interleaved
over ``--rounds`` rounds, the median of every sample; on a CPU (``--smoke``: the interpreter, a small
shape) wall-clock medians, which check the harness only. Backward time is forward + backward less
forward, both timed with autograd recording, as in a training step. Then each of the six launches alone,
with the config the layer resolves: where the time goes, launch by launch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
from torch import Tensor

from bench.expert_gemm_peers import peer_swiglu
from kernels.grouped_gemm import expert_loads, expert_mlp, expert_mlp_reference

SHAPES = {
    "v4-flash-ep8": {"tokens": 24576, "experts": 32, "hidden": 4096, "ffn": 2048},
    "v4-pro-ep8": {"tokens": 24576, "experts": 48, "hidden": 7168, "ffn": 3072},
}
SMOKE_SHAPES = {"smoke": {"tokens": 96, "experts": 4, "hidden": 64, "ffn": 32}}
GRAD_MODES = ("bf16", "main_grad")
PARITY_FLOOR = 1e-2  # an error (relative norm of the difference from fp32) this small passes outright
# Triton's CPU interpreter rounds fp32 to bf16 by truncation, which doubles each rounding's error
# (and the fused path rounds g, u, a and y): its floor is wider
INTERPRETER_PARITY_FLOOR = 3e-2
TARGET_OVER_PEER = 1.3
TARGET_BWD_OVER_FWD = 2.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {', '.join(SHAPES)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per variant")
    parser.add_argument("--smoke", action="store_true",
                        help="a small shape on whatever device there is (the CPU: under TRITON_INTERPRET=1)")


def expert_inputs(shape: dict[str, int], device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """Balanced loads, unit-size activations, weights scaled by 1/sqrt(fan-in), an output gradient."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t, e, d, f = shape["tokens"], shape["experts"], shape["hidden"], shape["ffn"]

    def randn(*size: int, std: float = 1.0) -> Tensor:
        return (torch.randn(*size, generator=gen) * std).to(device=device, dtype=torch.bfloat16)

    counts = expert_loads(t, e, 0, gen).cumsum(0)
    return {"x": randn(t, d), "offsets": torch.cat([counts.new_zeros(1), counts]).int().to(device),
            "weights": (0.1 + torch.rand(t, generator=gen)).to(device), "w13": randn(e, 2 * f, d, std=d ** -0.5),
            "w2": randn(e, d, f, std=f ** -0.5), "dy": randn(t, d)}


def _grouped(a: Tensor, b: Tensor, offsets: Tensor | None, bounds: list[tuple[int, int]] | None) -> Tensor:
    """``a[rows of e] @ b[e]`` per expert: ``torch._grouped_mm``, or one ``torch.mm`` each given ``bounds``."""
    if bounds is None:
        return torch._grouped_mm(a, b, offs=offsets[1:])
    return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(bounds)])


def peer_mlp(x: Tensor, offsets: Tensor, weights: Tensor, w13: Tensor, w2: Tensor,
             bounds: list[tuple[int, int]] | None) -> Tensor:
    """The peer's forward: grouped GEMMs with the clamped SwiGLU and routing weight in eager PyTorch."""
    a = peer_swiglu(_grouped(x, w13.transpose(1, 2), offsets, bounds))
    return (_grouped(a, w2.transpose(1, 2), offsets, bounds) * weights[:, None]).to(torch.bfloat16)


def _peer_bounds(inputs: dict[str, Tensor]) -> tuple[list[tuple[int, int]] | None, str]:
    """None and ``grouped_mm`` where the installed torch runs ``_grouped_mm`` here, forward and backward,
    else the host bounds and ``loop``."""
    try:
        x = inputs["x"][:, :8].contiguous().requires_grad_()
        w = inputs["w2"][:, :8, :8].transpose(1, 2).contiguous().requires_grad_()
        _grouped(x, w, inputs["offsets"], None).float().sum().backward()
        return None, "grouped_mm"
    except (RuntimeError, NotImplementedError):
        offsets = inputs["offsets"].tolist()
        return list(zip(offsets[:-1], offsets[1:])), "loop"


class Variant:
    """One implementation in one gradient mode: ``forward()`` and ``forward_backward()`` closures over
    the shape's inputs, each returning what parity compares."""

    def __init__(self, impl: str, mode: str, inputs: dict[str, Tensor], bounds: list[tuple[int, int]] | None):
        self.impl, self.bounds = impl, bounds
        self.x = inputs["x"].detach().requires_grad_()
        self.weights = inputs["weights"].detach().requires_grad_()
        self.w13 = inputs["w13"].detach().requires_grad_()
        self.w2 = inputs["w2"].detach().requires_grad_()
        self.offsets, self.dy = inputs["offsets"], inputs["dy"]
        fp32 = torch.float32
        self.buffers = ((torch.zeros_like(self.w13, dtype=fp32), torch.zeros_like(self.w2, dtype=fp32))
                        if mode == "main_grad" else None)

    def _forward(self) -> Tensor:
        if self.impl == "triton":
            return expert_mlp(self.x, self.offsets, self.weights, self.w13, self.w2, self.buffers)
        return peer_mlp(self.x, self.offsets, self.weights, self.w13, self.w2, self.bounds)

    def forward(self) -> tuple[Tensor, ...]:
        return (self._forward(),)

    def forward_backward(self) -> tuple[Tensor, ...]:
        """y, dx, dweights, dw13, dw2 (the last two the buffers' contents in main_grad mode)."""
        y = self._forward()
        fused_buffers = self.impl == "triton" and self.buffers is not None
        wrt = [self.x, self.weights] + ([] if fused_buffers else [self.w13, self.w2])
        grads = torch.autograd.grad(y, wrt, self.dy)
        if self.buffers is None:
            return (y, *grads)
        if not fused_buffers:
            self.buffers[0].add_(grads[2])
            self.buffers[1].add_(grads[3])
        return (y, grads[0], grads[1], *self.buffers)


OUTPUTS = ("y", "dx", "dweights", "dw13", "dw2")


def fp32_reference(inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
    """y, dx, dweights, dw13, dw2 of the MLP from the same bf16 inputs: the kernels' own eager reference
    (``expert_mlp_reference``, one matmul per expert) fed fp32 copies."""
    leaves = [inputs[k].detach().float().requires_grad_() for k in ("x", "weights", "w13", "w2")]
    x, weights, w13, w2 = leaves
    y = expert_mlp_reference(x, inputs["offsets"], weights, w13, w2)
    return (y.detach(), *torch.autograd.grad(y, leaves, inputs["dy"].float()))


def errors(outputs: tuple[Tensor, ...], reference: tuple[Tensor, ...]) -> dict[str, float]:
    """Relative norm of each output's difference from the fp32 reference."""
    return {name: float((a.detach().float() - b).norm() / b.norm().clamp_min(1e-30))
            for name, a, b in zip(OUTPUTS, outputs, reference)}


def parity(ours: dict[str, float], peer: dict[str, float], floor: float = PARITY_FLOOR) -> dict[str, Any]:
    """The Triton path's and the peer's errors, and whether each of ours is within ``floor`` or twice the peer's."""
    ok = all(ours[name] <= max(floor, 2 * peer[name]) for name in OUTPUTS)
    return {"triton_error": ours, "peer_error": peer, "ok": ok}


def _timer(on_gpu: bool) -> Callable[[Callable[[], Any]], list[float]]:
    """Milliseconds samples of a closure: ``do_bench`` on a GPU, wall clock on the CPU."""
    if on_gpu:
        import triton.testing

        return lambda fn: [float(s) for s in triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")]

    def wall(fn: Callable[[], Any]) -> list[float]:
        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples

    return wall


def forward_flops(shape: dict[str, int]) -> float:
    """Up (2F outputs) and down (D outputs) GEMMs over every routed row; the backward does twice this."""
    return 2.0 * shape["tokens"] * shape["hidden"] * 3 * shape["ffn"]


def bench_shape(shape: dict[str, int], rounds: int, device: torch.device) -> dict[str, Any]:
    """Parity of the Triton path against the peer in both gradient modes, then every variant's times."""
    inputs = expert_inputs(shape, device)
    bounds, peer_name = _peer_bounds(inputs)
    reference = fp32_reference(inputs)  # before the variants' fp32 buffers: its fp32 weights are freed by then
    variants = {f"{impl}/{mode}": Variant(impl, mode, inputs, bounds)
                for impl in ("triton", "peer") for mode in GRAD_MODES}
    floor = PARITY_FLOOR if device.type == "cuda" else INTERPRETER_PARITY_FLOOR
    result: dict[str, Any] = {"shape": shape, "peer": peer_name, "parity": {
        mode: parity(errors(variants[f"triton/{mode}"].forward_backward(), reference),
                     errors(variants[f"peer/{mode}"].forward_backward(), reference), floor) for mode in GRAD_MODES}}
    del reference
    if not all(check["ok"] for check in result["parity"].values()):
        result["status"] = "parity failed: not timed"
        return result
    timer = _timer(device.type == "cuda")
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, variant in variants.items():
            for phase, fn in (("fwd", variant.forward), ("fwd_bwd", variant.forward_backward)):
                samples.setdefault((name, phase), []).extend(timer(fn))
    flops = forward_flops(shape)
    times = {}
    for name in variants:
        fwd, both = statistics.median(samples[(name, "fwd")]), statistics.median(samples[(name, "fwd_bwd")])
        times[name] = {"fwd_ms": fwd, "fwd_bwd_ms": both, "bwd_ms": both - fwd, "bwd_over_fwd": (both - fwd) / fwd,
                       "fwd_tflops": flops / fwd / 1e9, "fwd_bwd_tflops": 3 * flops / both / 1e9}
    result["times"] = times
    result["triton_over_peer"] = {
        mode: {phase: times[f"peer/{mode}"][f"{phase}_ms"] / times[f"triton/{mode}"][f"{phase}_ms"]
               for phase in ("fwd", "fwd_bwd")}
        for mode in GRAD_MODES}
    result["status"] = "ok"
    return result


BACKWARD_LAUNCHES = ("expert_down_bwd_dx", "expert_up_bwd_dx", "expert_down_bwd_dw", "expert_up_bwd_dw")
FORWARD_LAUNCHES = ("expert_up_fwd", "expert_down_fwd")


def launch_times(shape: dict[str, int], device: torch.device) -> dict[str, Any]:
    """Each of the MLP's six launches alone, with the config the layer resolves (the arch's tables, a
    balanced load), timed as a sweep times it (the weight gradients adding into fp32 buffers): where the
    forward's and the backward's time goes, and how much of the measured backward the four backward
    launches leave to the rest (the routing-weight gradient's sum, the copies)."""
    from kernels import registry
    from kernels.tuning import resolve

    timer = _timer(device.type == "cuda")
    full = {**shape, "skew": 0}
    launches = {}
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the variants' blocks, cached by the allocator
    for name in FORWARD_LAUNCHES + BACKWARD_LAUNCHES:
        kernel = registry.get(name)
        config, source = resolve(name, full)
        inputs = kernel.make_inputs(full, device, 0)
        ms = statistics.median(timer(lambda: kernel.run(inputs, config)))
        launches[name] = {"ms": ms, "tflops": kernel.flops(full) / ms / 1e9, "config_from": source}
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"launches": launches,
            "forward_launches_ms": sum(launches[n]["ms"] for n in FORWARD_LAUNCHES),
            "backward_launches_ms": sum(launches[n]["ms"] for n in BACKWARD_LAUNCHES)}


def targets(shapes: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Issue 36's two targets per shape and gradient mode: forward + backward over the peer, backward
    over forward."""
    rows = []
    for name, result in shapes.items():
        if result["status"] != "ok":
            rows.append({"target": f"expert MLP at {name}: parity with the peer", "measured": result["status"],
                         "status": "missed"})
            continue
        for mode in GRAD_MODES:
            ours, ratio = result["times"][f"triton/{mode}"], result["triton_over_peer"][mode]["fwd_bwd"]
            rows.append({"target": f"expert MLP fwd+bwd at {name} ({mode} grads) >= {TARGET_OVER_PEER}x "
                                   f"{result['peer']} + eager SwiGLU",
                         "measured": f"{ratio:.2f}x ({ours['fwd_bwd_tflops']:.0f} TFLOP/s, "
                                     f"{ours['fwd_bwd_ms']:.3f} ms)",
                         "status": "met" if ratio >= TARGET_OVER_PEER else "missed"})
            rows.append({"target": f"expert MLP backward at {name} ({mode} grads) <= {TARGET_BWD_OVER_FWD}x "
                                   "its forward",
                         "measured": f"{ours['bwd_over_fwd']:.2f}x ({ours['bwd_ms']:.3f} / {ours['fwd_ms']:.3f} ms)",
                         "status": "met" if ours["bwd_over_fwd"] <= TARGET_BWD_OVER_FWD else "missed"})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every asked shape, then the targets; see the module doc."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        raise ValueError("expert_mlp times the V4 shapes on a GPU; none is visible (--smoke runs a small shape here)")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.smoke:
        chosen = SMOKE_SHAPES
    else:
        names = [s.strip() for s in args.shapes.split(",") if s.strip()]
        unknown = [s for s in names if s not in SHAPES]
        if unknown or not names:
            raise ValueError(f"--shapes: unknown {', '.join(unknown) or '(none given)'}; one of {', '.join(SHAPES)}")
        chosen = {name: SHAPES[name] for name in names}
    device = torch.device("cuda" if on_gpu else "cpu")
    save_partial = getattr(args, "save_partial", lambda _figures: None)  # the runner's; absent in a direct call
    shapes: dict[str, dict[str, Any]] = {}
    for name, shape in chosen.items():
        shapes[name] = bench_shape(shape, args.rounds, device)
        if shapes[name]["status"] == "ok":  # after the variants' tensors are freed
            shapes[name].update(launch_times(shape, device))
        save_partial({"rounds": args.rounds, "shapes": shapes})
    # the interpreter's times check the harness, not the kernels: no target is judged on them
    return {"rounds": args.rounds, "shapes": shapes, "targets": targets(shapes) if on_gpu else []}
