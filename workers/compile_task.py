"""Ahead-of-time compilation on CPU workers, so GPUs never wait for Triton.

The task compiles one config into the shared Triton cache (``TRITON_CACHE_DIR``) without
launching it; the GPU worker's child then finds the binary in the cache. Triton needs the
driver to know its target, so the task keeps the host's GPUs visible
(``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` in the pool's runtime env) but launches nothing.

The compile itself is ``workers.compiler.compile_one``. The sweep cancels a compile task whose config a
local compile process or the device worker took first; a task already running gets a KeyboardInterrupt,
and one that lands inside the worker's first ``import torch`` leaves torch half-initialized in that
process for good (every later import there fails: "SystemError: ... bad call flags"). Such a worker
exits, and Ray starts a fresh one for the next task.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import ray

from workers.compiler import compile_one

# Below the local compile processes' (``workers.compile_server.NICENESS``) and so below the benchmarking
# child's: on a one-GPU host those processes are warm seconds before these workers, whose imports then ran
# beside them at a higher priority while the sweep's first trials waited on their compiles (the child
# compiled its first configs itself; docs/findings.md). These take the cores the others leave.
NICENESS = 10


@functools.cache
def yield_cores() -> None:
    """Lower this worker's priority by ``NICENESS``, once (``os.nice`` adds at every call)."""
    os.nice(NICENESS)


@ray.remote(num_cpus=1, max_retries=0)
def compile_config(kernel_name: str, shape: dict[str, int], config: dict[str, Any]) -> dict[str, Any]:
    """``compile_one`` in a compile worker whose torch imports whole, else the worker's end; with the seconds
    the compile took, as a local compile process answers them."""
    yield_cores()
    try:
        import torch  # noqa: F401 - the import compile_one makes first, here where its failure is the worker's
    except BaseException:  # noqa: BLE001 - a cancel's KeyboardInterrupt mid-import, or its earlier victim
        os._exit(1)
    began = time.perf_counter()
    return {**compile_one(kernel_name, shape, config), "seconds": time.perf_counter() - began}


@ray.remote(num_cpus=1, max_retries=0)
def warm_up() -> float:
    """Import the kernels and open the GPU driver in a compile worker before the first sweep; the wall
    clock when done, so that a benchmark can tell when the compile workers were ready."""
    yield_cores()
    from kernels import registry
    from kernels.arch import kernel_device

    registry.names()
    kernel_device()
    return time.time()
