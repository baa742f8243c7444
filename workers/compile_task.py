"""Ahead-of-time compilation on CPU workers, so GPUs never wait for Triton.

The task compiles one config into the shared Triton cache (``TRITON_CACHE_DIR``) without
launching it; the GPU worker's child then finds the binary in the cache. Triton needs the
driver to know its target, so the task keeps the host's GPUs visible
(``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` in the pool's runtime env) but launches nothing.

The task does allocate its problem's tensors on that GPU, which the benchmarking child shares:
it hands its allocator's cache back after every config (a full-size attention backward sizes
buffers of up to 10 GiB), and a config that finds the GPU full is left for the child to compile
on its first launch rather than recorded as a compile error.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from workers.errors import error_text

_inputs: dict[tuple[str, str], dict[str, Any]] = {}


def compile_one(kernel_name: str, shape: dict[str, int], config: dict[str, Any]) -> dict[str, Any]:
    """``{"status": "ok"}`` when ``config`` compiled (or was left to the child), else a ``compile_error`` with its text."""
    import torch  # here, not at the top: the driver that submits these tasks needs neither torch nor the kernels

    from kernels import registry
    from kernels.arch import kernel_device

    kernel = registry.get(kernel_name)
    if kernel.compile is None:
        return {"status": "ok"}
    key = (kernel_name, kernel.shape_key(shape))
    try:
        if key not in _inputs:
            _inputs.clear()
            _inputs[key] = kernel.make_inputs(shape, kernel_device(), 0)
        kernel.compile(_inputs[key], config)
    except torch.OutOfMemoryError:
        return {"status": "ok"}  # not the config's fault; the child compiles it when it launches
    except Exception as exc:  # noqa: BLE001 - every compiler failure is a result, not a fault
        return {"status": "compile_error", "error": error_text(exc)}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"status": "ok"}


compile_config = ray.remote(num_cpus=1, max_retries=0)(compile_one)


@ray.remote(num_cpus=1, max_retries=0)
def warm_up() -> float:
    """Import the kernels and open the GPU driver in a compile worker before the first sweep; the wall
    clock when done, so that a benchmark can tell when the compile workers were ready."""
    from kernels import registry
    from kernels.arch import kernel_device

    registry.names()
    kernel_device()
    return time.time()
