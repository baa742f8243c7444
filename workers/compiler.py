"""Compiling one config into Triton's cache without launching it: what a sweep's compile workers do ahead
of its benchmarking child (as Ray tasks, ``workers.compile_task``, or as the pool's local compile processes,
``workers.compile_server``). Imports neither Ray nor torch until a config is compiled.

The compile allocates its problem's tensors on the GPU, which the benchmarking child shares: it hands its
allocator's cache back after every config (a full-size attention backward sizes buffers of up to 10 GiB),
and a config that finds the GPU full is left for the child to compile on its first launch rather than
recorded as a compile error. So is a problem whose tensors would take more than ``MAX_SHARE_OF_FREE`` of
the GPU's free memory: several compile processes each holding an EP-1 expert weight gradient's (17 GB of
fp32, twice) left the child none, and its trials crashed out of memory.

A process that compiles offline (``kernels.offline``: the pool's local compile processes on an NVIDIA host)
holds the inputs in host memory instead, and keeps them under ``MAX_SHARE_OF_FREE`` of the host's free
memory shared among as many processes as the host has cores. There, only Triton's own errors (the
compiler's, ptxas's, resources) mark a config as failing; any other is left for the child to meet on the GPU.
"""

from __future__ import annotations

import os
from typing import Any

from workers.errors import error_text

_inputs: dict[tuple[str, str], dict[str, Any]] = {}
MAX_SHARE_OF_FREE = 0.25


def compile_one(kernel_name: str, shape: dict[str, int], config: dict[str, Any]) -> dict[str, Any]:
    """``{"status": "ok"}`` when ``config`` compiled (or was left to the child), else a ``compile_error`` with its text."""
    import torch  # here, not at the top: the driver that submits these tasks needs neither torch nor the kernels

    from kernels import registry
    from kernels.arch import kernel_device, offline_arch

    kernel = registry.get(kernel_name)
    if kernel.compile is None:
        return {"status": "ok"}
    key = (kernel_name, kernel.shape_key(shape))
    try:
        if key not in _inputs:
            _inputs.clear()
            if kernel.bytes_moved(shape) > _room_for_inputs(offline_arch() is not None):
                return {"status": "ok"}  # too large to hold beside the child: it compiles this config itself
            _inputs[key] = kernel.make_inputs(shape, kernel_device(), 0)
        kernel.compile(_inputs[key], config)
    except torch.OutOfMemoryError:
        return {"status": "ok"}  # not the config's fault; the child compiles it when it launches
    except Exception as exc:  # noqa: BLE001 - every compiler failure is a result, not a fault
        if offline_arch() is not None and not _rejected_by_triton(exc):
            return {"status": "ok"}  # maybe the offline stand-in's doing, not the config's: the child tries it
        return {"status": "compile_error", "error": error_text(exc)}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"status": "ok"}


def _room_for_inputs(on_host: bool) -> float:
    """The bytes one problem's inputs may take: a share of the GPU's free memory, or of the host's."""
    import torch

    if on_host:
        return MAX_SHARE_OF_FREE * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (os.cpu_count() or 1)
    return MAX_SHARE_OF_FREE * torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else float("inf")


def _rejected_by_triton(exc: Exception) -> bool:
    """Whether ``exc`` is one of Triton's own errors (its compiler's, ptxas's, a resource limit)."""
    try:
        from triton.errors import TritonError
    except ImportError:  # a Triton without the common base: take every failure as the config's
        return True
    return isinstance(exc, TritonError)
