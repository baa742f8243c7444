"""A test-only kernel whose config can crash, hang or compute the wrong thing.

Loaded by the workers through ``TUNER_KERNEL_MODULES=tests.fault_probe``: it runs a real
Triton kernel (``y = 2x``) through the whole sweep path, and its ``MODE`` parameter makes
the benchmarking process segfault, never return, or return wrong numbers, so the tests
can check that each is recorded with the right status while the sweep completes. ``slow``
computes the right thing at half a second per launch, for tests that must catch a
sweep while it runs. ``kill_worker`` SIGKILLs the device worker (the benchmarking child's
parent) the first time it runs in a test (a marker named after ``TUNER_TEST_TAG`` under
``TUNER_TEST_MARKER_DIR``), and computes the right thing after.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels.registry import TunableKernel, register


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _run(inputs, config):
    mode = config["MODE"]
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang":
        time.sleep(3600)
    if mode == "slow":
        time.sleep(0.5)
    if mode == "kill_worker":
        _kill_worker_once()
    x = inputs["x"]
    y = torch.empty_like(x)
    _double_kernel[(triton.cdiv(x.numel(), config["BLOCK"]),)](x, y, x.numel(), BLOCK=config["BLOCK"])
    return y + 1 if mode == "wrong" else y


def _kill_worker_once() -> None:
    marker = Path(os.environ.get("TUNER_TEST_MARKER_DIR", tempfile.gettempdir()))
    try:
        os.close(os.open(marker / f"killed-worker-{os.environ.get('TUNER_TEST_TAG', '')}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)  # this process ends with its parent (workers.bench_child)


register(TunableKernel(
    name="fault_probe",
    shape_fields=("n",),
    exact_fields=(),
    make_inputs=lambda shape, device, seed: {
        "x": torch.randn(shape["n"], generator=torch.Generator().manual_seed(seed)).to(device)},
    run=_run,
    reference=lambda inputs: 2 * inputs["x"],
    default_config=lambda shape: {"MODE": "ok", "BLOCK": 32},
    bytes_moved=lambda shape: 8 * shape["n"],
    atol=1e-5, rtol=1e-5,
    presets={"small": [{"n": 100}]},
))
