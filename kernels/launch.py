"""Turning a tuned config into a Triton launch, shared by every kernel module.

A config mixes kernel constexprs (upper-case, e.g. ``BLOCK_M``; each kernel passes its
own) with launch options and per-backend compiler knobs. Triton rejects knobs of another
backend, and the sweep stores unset knobs as None, so only the running backend's set
knobs are passed on.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from kernels.arch import INTERPRETER_ARCH, current_arch

_COMMON_OPTIONS = ("num_warps", "num_stages")
_BACKEND_KNOBS = {
    "cuda": ("maxnreg",),
    "hip": ("waves_per_eu", "matrix_instr_nonkdim", "kpack"),
}


def tma_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``t``: not empty, unit last stride, 16-byte aligned base
    and other strides."""
    size = t.element_size()
    return (t.numel() > 0 and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(stride * size % 16 == 0 for stride in t.stride()[:-1]))


def tma_usable(config: dict[str, Any], *tensors: torch.Tensor) -> bool:
    """Whether ``config`` asks for TMA (its ``TMA`` knob) and a descriptor can address every one of ``tensors``."""
    return bool(config.get("TMA")) and all(tma_ready(t) for t in tensors)


def check_gluon(form: str, misfit: str | None) -> None:
    """Raise unless this process runs on sm_90 and a config fits the Gluon ``form`` (``misfit``: how it
    does not, or None)."""
    if current_arch() != "sm_90":
        raise ValueError(f"GLUON is the sm_90 form of {form} (Gluon has no interpreter mode); "
                         f"this process runs on {current_arch()}")
    if misfit is not None:
        raise ValueError(f"GLUON compiles fixed tilings of {form}; this config has {misfit}")


@functools.lru_cache(maxsize=None)
def _option_names() -> tuple[str, ...]:
    if current_arch() == INTERPRETER_ARCH:
        return _COMMON_OPTIONS
    return _COMMON_OPTIONS + _BACKEND_KNOBS["hip" if torch.version.hip else "cuda"]


def launch_options(config: dict[str, Any]) -> dict[str, Any]:
    """The Triton launch keyword options in ``config``, for the running backend."""
    return {name: config[name] for name in _option_names() if config.get(name) is not None}


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    constexprs: dict[str, Any],
    config: dict[str, Any],
    compile_only: bool = False,
) -> None:
    """Launch ``kernel``, or with ``compile_only`` just compile it into Triton's cache.

    Running and compiling share this one call so that the binary a sweep compiles ahead
    of time is exactly the one its launch later finds in the cache. The interpreter has
    nothing to compile, so ``compile_only`` is a no-op there; an empty grid (no rows)
    launches nothing, since CUDA rejects it.
    """
    options = {**constexprs, **launch_options(config)}
    if compile_only:
        if current_arch() != INTERPRETER_ARCH:
            kernel.warmup(*args, grid=grid, **options)
    elif all(grid):
        kernel.run(*args, grid=grid, warmup=False, **options)  # kernel[grid](...) without its proxy lambda
