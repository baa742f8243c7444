"""The kernel launches a model's training step makes, with their shapes: what to sweep for that model.

The tables are swept at the shapes of each kernel's presets (V4-Flash and V4-Pro), and a lookup
takes the nearest entry only among those whose exact fields match. A model of another width (the
proxy-8l training proxy: hidden 2048, 16 heads, 32 experts of width 1,024) then finds no entry for
most of its launches and runs them at their heuristic defaults, tuned table or not.

``model_launches`` finds the shapes without a GPU and without computing anything: one layer of each
kind, the embedding and the head are built on the meta device and run forward and backward as in
``tuner profile layers``, with the Triton kernels. A launch on meta tensors returns at once
(``kernels.launch``), and every table lookup on the way is recorded (``kernels.tuning``). The
optimizer's update (``adamw_step``) is left out: its shape is a stage's parameter count, and its
lookup takes the nearest entry of any size. The run takes the interpreter's host paths on any machine
(``kernels.arch.as_interpreter``): the lookups come before any arch's own path is chosen, and the
interpreter's host code takes meta tensors everywhere, where a GPU's would build TMA descriptors from them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from kernels import registry
from kernels.arch import as_interpreter
from kernels.registry import Shape
from kernels.tuning import Source, recorded_lookups, source_on
from tuner.train.profile_layers import pieces
from v4.config import ModelConfig, expert_parallel_config

META = torch.device("meta")
# FLOPs a byte moved below which a launch is memory-bound: it runs for microseconds, and a sweep times
# it by CUDA-graph replay, so that the host's launch cost does not hide its device time
MEMORY_BOUND_INTENSITY = 64.0
# A compute-bound launch is graph-timed too where it cannot run longer than this at the rates below: an
# expert GEMM's host path (its tile table, TMA descriptors) costs about 0.35 ms, so CUDA events around
# a proxy-8l expert GEMM (0.2-0.6 ms on an H100) timed mostly the host, and its sweep ranked configs by
# host time while the replayed step runs them at device time (docs/findings.md)
GRAPH_TIMED_BELOW_MS = 2.0
PEAK_TFLOPS, PEAK_TBPS = 1000.0, 5.0  # above any supported GPU's dense bf16 rate and HBM bandwidth
# A graph-timed launch's trial (compile, check, replay) finishes in seconds: a config whose compile does
# not end within this is given up sooner than the spec's default 120 s. On one H100 a proxy-8l expert
# GEMM's trials took 1-5 s, and one warp-specialized config never answered (compile or launch), holding
# its sweep until the deadline (docs/findings.md)
GRAPH_TIMED_TRIAL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Launch:
    """A kernel launch of the model's step: the launch's name, its shape, and where a run on the arch
    asked about would take its config from (``table`` or ``default``; ``env`` under an override)."""

    kernel: str
    shape: Shape
    source: Source


def model_launches(config: ModelConfig, seq: int, mbs: int, ep: int, arch: str) -> list[Launch]:
    """Every distinct (launch, shape) of one forward and backward of each piece of ``config`` at
    ``seq`` tokens a sequence, ``mbs`` sequences, expert parallelism ``ep``, in first-asked order."""
    registry.names()  # every kernel module imported (and jitted for this device) before the interpreter's arch
    local = expert_parallel_config(config, ep)
    with as_interpreter(), recorded_lookups() as asked, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no tuned table")  # the interpreter's: not the arch asked about
        for build in pieces(config, local, seq, mbs, "triton", META, torch.bfloat16):
            piece = build()
            roots, grads = piece.roots(piece.module(*piece.inputs()))
            torch.autograd.backward(roots, grads)
    seen: dict[tuple[str, tuple[tuple[str, int], ...]], Shape] = {}
    for kernel, shape in asked:
        seen.setdefault((kernel, tuple(shape.items())), shape)
    return [Launch(kernel, shape, source_on(kernel, shape, arch)) for (kernel, _), shape in seen.items()]


def memory_bound(kernel: str, shape: Shape) -> bool:
    """A launch with no FLOP count, or fewer than ``MEMORY_BOUND_INTENSITY`` a byte moved."""
    launch = registry.get(kernel)
    return launch.flops is None or launch.flops(shape) < MEMORY_BOUND_INTENSITY * launch.bytes_moved(shape)


def graph_timed(kernel: str, shape: Shape) -> bool:
    """Whether a sweep of ``kernel`` at ``shape`` times device time by CUDA-graph replay: a memory-bound
    launch, or one whose device time at peak rates (a lower bound on any GPU) is under
    ``GRAPH_TIMED_BELOW_MS``, where the host's launch cost may exceed it."""
    if memory_bound(kernel, shape):
        return True
    launch = registry.get(kernel)
    floor_s = max(launch.flops(shape) / (PEAK_TFLOPS * 1e12), launch.bytes_moved(shape) / (PEAK_TBPS * 1e12))
    return floor_s * 1e3 < GRAPH_TIMED_BELOW_MS


def sweep_specs(launches: list[Launch], arch: str, trials: int) -> list[dict[str, Any]]:
    """One TPE sweep spec per kernel over its shapes among ``launches``, ``trials`` configs a shape; the
    compute-bound kernels (GEMMs, attention) first, where most of a step's time goes, so that a sweep
    given too little time still tunes them; graph-timed where every shape is (``graph_timed``), each
    trial then given ``GRAPH_TIMED_TRIAL_TIMEOUT_S``."""
    by_kernel: dict[str, list[Shape]] = {}
    for launch in launches:
        by_kernel.setdefault(launch.kernel, []).append(launch.shape)
    specs = []
    for kernel, shapes in by_kernel.items():
        body: dict[str, Any] = {"kernel": kernel, "shapes": shapes, "arch": arch,
                                "strategy": {"name": "tpe", "seed": 0}, "budget": {"max_trials": trials}}
        if all(graph_timed(kernel, shape) for shape in shapes):
            body["timing"] = {"method": "cudagraph", "trial_timeout_s": GRAPH_TIMED_TRIAL_TIMEOUT_S}
        specs.append(body)
    return sorted(specs, key=lambda body: all(memory_bound(body["kernel"], shape) for shape in body["shapes"]))
