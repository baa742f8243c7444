"""The benchmarking child process: checks one config against the reference, then times it.

Runs as ``python -m workers.bench_child`` under a ``BenchProcess``. It reads one JSON
request per line on stdin and answers with one JSON line on its real stdout (everything
else the kernels print goes to stderr). A config that faults the GPU or hangs takes only
this process down; the parent records the trial and starts a fresh child.

Requests: ``{"op": "describe"}``, ``{"op": "trial", ...}``, ``{"op": "retime", ...}``.

The child ends itself when its parent dies (its worker killed, or its node's raylet): a
config that hangs would otherwise keep it, and the device, busy with nobody to answer.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from typing import Any

import torch

from kernels import registry
from kernels.arch import INTERPRETER_ARCH, current_arch, kernel_device
from workers.device_info import describe_device
from workers.errors import error_text
from workers.parent_watch import exit_with_parent
from workers.timing import host_ms, measure, screen

# Compile-time failures of a config (as opposed to faults of the process).
try:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    COMPILE_ERRORS: tuple[type[BaseException], ...] = (CompilationError, OutOfResources)
except ImportError:  # pragma: no cover - older Triton layouts
    COMPILE_ERRORS = ()

_inputs: dict[tuple[str, str, int], tuple[dict[str, Any], Any]] = {}


def as_tuple(outputs: Any) -> tuple[torch.Tensor, ...]:
    """A launch's or reference's outputs as a tuple (single tensors are returned bare)."""
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _inputs_and_reference(kernel: registry.TunableKernel, shape: dict[str, int], seed: int):
    """Random inputs for (kernel, shape, seed) and the eager reference outputs, built once."""
    key = (kernel.name, kernel.shape_key(shape), seed)
    if key not in _inputs:
        _inputs.clear()  # keep one problem resident: GPU memory is for the current shape
        inputs = kernel.make_inputs(shape, kernel_device(), seed)
        _inputs[key] = (inputs, as_tuple(kernel.reference(inputs)))
    return _inputs[key]


COMPARE_CHUNK = 1 << 26  # elements compared at a time: the comparison's fp32 temporaries stay at 256 MB each


def mismatch(outputs: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...], atol: float, rtol: float) -> str | None:
    """Why ``outputs`` differ from ``reference`` beyond tolerance, or None when they match.

    Compared ``COMPARE_CHUNK`` elements at a time: an expert weight gradient at EP 1 is 17 GB of fp32, and
    whole-tensor temporaries (the difference, its magnitude, the bound) would need several times that
    beside the inputs, the reference and the output."""
    if len(outputs) != len(reference):
        return f"returned {len(outputs)} outputs, reference has {len(reference)}"
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if out.shape != ref.shape:
            return f"output {i}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
        out, ref = out.reshape(-1), ref.reshape(-1)
        failing, most, worst_diff = 0, -math.inf, 0.0  # elements out of tolerance; the largest excess, its |diff|
        for start in range(0, out.numel(), COMPARE_CHUNK):
            o = out[start:start + COMPARE_CHUNK].float()
            r = ref[start:start + COMPARE_CHUNK].float()
            if not torch.isfinite(o).all():
                return f"output {i}: non-finite values"
            diff = (o - r).abs()
            excess = diff - (atol + rtol * r.abs())
            failing += int((excess > 0).sum())
            top = int(excess.argmax())
            if float(excess[top]) > most:
                most, worst_diff = float(excess[top]), float(diff[top])
        if failing:
            return (f"output {i}: {failing} elements out of tolerance (atol={atol}, rtol={rtol}); "
                    f"worst |diff|={worst_diff:.3g}")
    return None


def prepare(problem: dict[str, Any]) -> dict[str, Any]:
    """Build ``problem``'s inputs and reference (``kernel``, ``shape``, ``seed``), so that a sweep's first trial
    finds them ready: what a pre-warmed child does while it waits for its worker. No config is compiled
    here: the worker waits for this, and the compile workers wait for the worker, so a slow compile would
    hold them all. ``{"kernel", "seconds"}``, or ``{"error"}`` where it failed (the sweep's own trials then
    meet the same failure and record it)."""
    started = time.perf_counter()
    try:
        kernel = registry.get(problem["kernel"])
        _inputs_and_reference(kernel, problem["shape"], problem.get("seed", 0))
        if current_arch() != INTERPRETER_ARCH:
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a problem that fails here is the sweep's to report
        return {"error": error_text(exc)}
    return {"kernel": kernel.name, "seconds": time.perf_counter() - started}


def run_trial(request: dict[str, Any]) -> dict[str, Any]:
    """Check one config against the reference, then time it. The metrics' ``phases_s`` say where the
    trial's seconds went: building the inputs (once per shape), the first call (loading the compiled
    binary, or compiling it where no compile worker did), the check, the timing and the host's time.
    The timing stops after its probe where the request's ``probe_ms`` and ``stop_over_ms`` say so
    (``workers.timing.screen``; ``stopped_after_probe`` in the metrics). The host's time is taken only
    when ``request["host_time"]`` (default: yes) and the timing ran whole: a sweep ranked by device time
    has its few best configs' host times taken at their re-timing."""
    kernel = registry.get(request["kernel"])
    shape, config = request["shape"], request["config"]
    on_gpu = current_arch() != INTERPRETER_ARCH
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    inputs, reference = _inputs_and_reference(kernel, shape, request.get("seed", 0))
    phase("inputs")
    try:
        outputs = as_tuple(kernel.run(inputs, config))
    except COMPILE_ERRORS as exc:
        return {"status": "compile_error", "error": error_text(exc)}
    sync()
    phase("first_call")
    problem = mismatch(outputs, reference, request["atol"], request["rtol"])
    if problem:
        return {"status": "wrong", "error": problem}
    phase("check")
    call = lambda: kernel.run(inputs, config)  # noqa: E731 - one call of the launch
    timing, stopped = screen(call, request["warmup_ms"], request["rep_ms"], on_gpu, request.get("method", "events"),
                             request.get("probe_ms", 0.0), request.get("stop_over_ms"))
    phase("timing")
    metrics: dict[str, Any] = {"gbps": kernel.bytes_moved(shape) / (timing.median_ms * 1e-3) / 1e9}
    if stopped:
        metrics["stopped_after_probe"] = True
    if on_gpu and request.get("host_time", True) and not stopped:  # the interpreter's calls are synchronous
        metrics["host_ms"] = host_ms(call)
        phase("host")
    if kernel.flops is not None:
        metrics["tflops"] = kernel.flops(shape) / (timing.median_ms * 1e-3) / 1e12
    metrics["phases_s"] = phases
    return {"status": "ok", "median_ms": timing.median_ms, "p20_ms": timing.p20_ms,
            "p80_ms": timing.p80_ms, "reps": timing.reps, "metrics": metrics}


def retime(request: dict[str, Any]) -> dict[str, Any]:
    """Time several configs interleaved, round after round, so drift hits them all alike; on a GPU
    their host times too (``tuner.sweep.ranking``)."""
    kernel = registry.get(request["kernel"])
    shape = request["shape"]
    on_gpu = current_arch() != INTERPRETER_ARCH
    inputs, _ = _inputs_and_reference(kernel, shape, request.get("seed", 0))
    configs = request["configs"]
    samples: list[list[float]] = [[] for _ in configs]
    host_samples: list[list[float]] = [[] for _ in configs]
    generator = torch.Generator().manual_seed(request.get("seed", 0))
    for _ in range(request["rounds"]):
        for i in torch.randperm(len(configs), generator=generator).tolist():
            call = lambda: kernel.run(inputs, configs[i])  # noqa: E731 - one call of the launch
            timing = measure(call, request["warmup_ms"], request["rep_ms"], on_gpu, request.get("method", "events"))
            samples[i].append(timing.median_ms)
            if on_gpu:
                host_samples[i].append(host_ms(call))
    reply = {"status": "ok", "medians_ms": [sorted(s)[len(s) // 2] for s in samples]}
    if on_gpu:
        reply["host_least_ms"] = [min(s) for s in host_samples]  # as in host_ms: interference only adds
    return reply


HANDLERS = {"describe": lambda _request: describe_device(), "trial": run_trial, "retime": retime}


def main() -> None:
    exit_with_parent()
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt answers
    for line in sys.stdin:
        request = json.loads(line)
        started = time.perf_counter()
        try:
            reply = HANDLERS[request["op"]](request)
            reply["busy_s"] = time.perf_counter() - started
        except Exception as exc:  # noqa: BLE001 - any other failure poisons the CUDA context
            reply = {"status": "crash", "error": "".join(traceback.format_exception(exc))[-4000:], "fatal": True}
        answer.write(json.dumps(reply) + "\n")
        if reply.get("fatal"):
            return  # the parent starts a fresh process with a clean context


if __name__ == "__main__":
    main()
