"""Ahead-of-time compilation on CPU workers, so GPUs never wait for Triton.

The task compiles one config into the shared Triton cache (``TRITON_CACHE_DIR``) without
launching it; the GPU worker's child then finds the binary in the cache. Triton needs the
driver to know its target, so the task keeps the host's GPUs visible
(``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` in the pool's runtime env) but launches nothing.

The compile itself is ``workers.compiler.compile_one``.
"""

from __future__ import annotations

import time

import ray

from workers.compiler import compile_one

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
