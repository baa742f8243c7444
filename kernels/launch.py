"""Turning a tuned config into a Triton launch, shared by every kernel module.

A config mixes kernel constexprs (upper-case, e.g. ``BLOCK_M``; each kernel passes its
own) with launch options and per-backend compiler knobs. Triton rejects knobs of another
backend, and the sweep stores unset knobs as None, so only the running backend's set
knobs are passed on.

Launching through Triton's ``JITFunction.run`` costs the host 13-29 us a launch on the H200's
host (2026-12-03f): it binds and specializes every argument, builds a string cache key and the
launch metadata, then calls the compiled launcher. Most of the kernels' launches move a few MB,
a few microseconds of device time, so an eager step calling them back to back waits on the host.
``launch`` therefore keeps each compiled kernel under a key of its own: the kernel, the device,
the constexprs and options, and per argument what Triton specializes on (a tensor's dtype and
16-byte alignment; an integer's being 1, a multiple of 16, and its width; a host-built TMA
descriptor's dtype and block shape, its shape, strides and padding being read by the launcher at
each launch). A key it has seen calls the compiled launcher directly; the first launch of a key,
and any launch it cannot key (another argument type, Triton's launch hooks set, a kernel whose
constexprs do not follow its other arguments), goes through ``JITFunction.run``. Triton's
compile-time knobs (``debug``, instrumentation) are those of a key's first launch.
``TUNER_LAUNCH_CACHE=0`` turns it off.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
from triton import knobs
from triton.runtime import _allocation
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.arch import INTERPRETER_ARCH, current_arch

# Read at each launch, so that a benchmark can time both paths in one process.
CACHE_COMPILED = os.environ.get("TUNER_LAUNCH_CACHE", "1") != "0"
_UNKEYABLE = object()
_compiled: dict[tuple, Any] = {}

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


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for a launch, from torch's caching allocator on the current device and stream
    (its blocks are 512-byte aligned, more than Triton asks)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_scratch_allocator() -> None:
    """Let Triton take kernels' global scratch (device-built TMA descriptors) from torch, unless this
    thread has an allocator already. Triton keeps it in a context variable, which every thread starts
    without: autograd's backward threads too, so it is set at the launch, not once at import."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


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
        key = _launch_key(kernel, args, options) if CACHE_COMPILED else None
        try:
            cached = _compiled.get(key) if key is not None else None
        except TypeError:  # an unhashable constexpr: Triton's path
            key = cached = None
        if cached is None:
            compiled = kernel.run(*args, grid=grid, warmup=False, **options)  # kernel[grid](...) without its proxy
            names = _trailing_constexprs(kernel, len(args)) if key is not None else None
            if compiled is not None and names is not None and all(name in constexprs for name in names):
                _compiled[key] = compiled.result() if hasattr(compiled, "result") else compiled, names
        else:
            _launch_compiled(*cached, key[1], grid, args, constexprs)


def _arg_key(arg: Any) -> Any:
    """What Triton 3.6 specializes an argument on (``native_specialize_impl``), or ``_UNKEYABLE``."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if type(arg) is TensorDescriptor:  # a host-built TMA descriptor: the launcher encodes it at each launch
        return TensorDescriptor, arg.base.dtype, tuple(arg.block_shape)
    if isinstance(arg, bool):
        return bool, arg
    if isinstance(arg, int):
        return int, arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31, arg >= 2**63
    if isinstance(arg, float):
        return float
    if arg is None:
        return None
    return _UNKEYABLE


def _hook_idle(hook: Any) -> bool:
    """No launch hook set: None, or (Triton 3.6) an empty ``HookChain``."""
    return hook is None or getattr(hook, "calls", None) == []


def _launch_key(kernel: Any, args: tuple[Any, ...], options: dict[str, Any]) -> tuple | None:
    """The compiled-kernel key of a launch (the kernel, the current device, the options, the arguments'
    specializations), or None where only ``JITFunction.run`` may launch it."""
    if (type(kernel) is not JITFunction or kernel.pre_run_hooks or current_arch() == INTERPRETER_ARCH
            or not (_hook_idle(knobs.runtime.launch_enter_hook) and _hook_idle(knobs.runtime.launch_exit_hook))
            or _trailing_constexprs(kernel, len(args)) is None):
        return None
    arg_keys = tuple(_arg_key(arg) for arg in args)
    if _UNKEYABLE in arg_keys:
        return None
    return kernel, driver.active.get_current_device(), tuple(options.items()), arg_keys


@functools.lru_cache(maxsize=None)
def _trailing_constexprs(kernel: Any, n_args: int) -> tuple[str, ...] | None:
    """The names of the kernel's parameters after its first ``n_args``, if those are its runtime ones
    and the rest constexprs (the order in which its compiled launcher takes them); else None."""
    params = kernel.params
    if any(param.is_constexpr != (i >= n_args) for i, param in enumerate(params)):
        return None
    return tuple(param.name for param in params[n_args:])


def _launch_compiled(compiled: Any, names: tuple[str, ...], device: int, grid: tuple[int, ...],
                     args: tuple[Any, ...], constexprs: dict[str, Any]) -> None:
    """Call a compiled kernel's launcher as ``JITFunction.run`` does, on ``device``'s current stream,
    without launch hooks (``_launch_key`` keys no launch while any is set)."""
    stream = driver.active.get_current_stream(device)
    launcher = compiled.run  # loads the module on first use, and sets ``function``
    launcher(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, compiled.function,
             compiled.packed_metadata, None, None, None, *args, *[constexprs[name] for name in names])
