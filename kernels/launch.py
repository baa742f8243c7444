"""Turning a tuned config into a Triton launch, shared by every kernel module.

A config mixes kernel constexprs (upper-case, e.g. ``BLOCK_M``; each kernel passes its
own) with launch options and per-backend compiler knobs. Triton rejects knobs of another
backend, and the sweep stores unset knobs as None, so only the running backend's set
knobs are passed on.

Launching through Triton's ``JITFunction.run`` costs the host 13-29 us a launch on the H200's
host: it binds and specializes every argument, builds a string cache key and the
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

Some compiler knobs are not launch options but environment variables that Triton's compiler
reads (AMD's block ping-pong schedule and async copies to LDS). ``launch`` sets them around a
compile and keys compiled kernels by them. Triton 3.6's own in-memory cache of a kernel's compiled
forms does not key by them (its on-disk cache does): within one process it would hand a sweep the
first config's binary for every later one (offline gfx950 compiles). So when they
change between two compiles of a kernel, its in-memory cache is dropped first.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Iterator

import torch
import triton
from triton import knobs
from triton.runtime import _allocation
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.arch import INTERPRETER_ARCH, backend_of, current_arch, offline_arch
from kernels.offline import build_launcher

# Read at each launch, so that a benchmark can time both paths in one process.
CACHE_COMPILED = os.environ.get("TUNER_LAUNCH_CACHE", "1") != "0"
_UNKEYABLE = object()
_compiled: dict[tuple, Any] = {}

_COMMON_OPTIONS = ("num_warps", "num_stages")
# Per backend: the knobs passed to Triton as launch options, and those it reads from the environment.
LAUNCH_KNOBS = {
    "cuda": ("maxnreg",),
    "hip": ("waves_per_eu", "matrix_instr_nonkdim", "kpack"),
}
ENVIRONMENT_KNOBS = {
    "cuda": {},
    "hip": {"block_pingpong": "TRITON_HIP_USE_BLOCK_PINGPONG", "async_copy": "TRITON_HIP_USE_ASYNC_COPY"},
}
_environment_of: dict[Any, tuple[tuple[str, str], ...]] = {}  # per kernel: the environment knobs it last compiled with
_ENVIRONMENT_LOCK = threading.RLock()  # held through each compile of ``launch``


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
def _option_names(arch: str) -> tuple[str, ...]:
    if arch == INTERPRETER_ARCH:
        return _COMMON_OPTIONS
    return _COMMON_OPTIONS + LAUNCH_KNOBS[backend_of(arch)]


def launch_options(config: dict[str, Any]) -> dict[str, Any]:
    """The Triton launch keyword options in ``config``, for the running backend."""
    return {name: config[name] for name in _option_names(current_arch()) if config.get(name) is not None}


def compiler_environment(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The environment variables (name, "1" or "0") that ``config``'s set environment knobs ask of
    Triton's compiler on the running backend; none under the interpreter."""
    if current_arch() == INTERPRETER_ARCH:
        return ()
    knobs_here = ENVIRONMENT_KNOBS[backend_of(current_arch())]
    return tuple((variable, "1" if config[name] else "0") for name, variable in sorted(knobs_here.items())
                 if config.get(name) is not None)


@contextlib.contextmanager
def _compiling_with(kernel: Any, environment: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Set ``environment`` for a compile of ``kernel`` (restored after it), dropping the kernel's
    in-memory compiled forms when they were compiled with other environment knobs. The environment
    is the process's, so compiles of other threads (autograd's backward) wait for this one. A backend
    without environment knobs (CUDA, the interpreter, which runs every launch through here) skips it all."""
    arch = current_arch()
    if arch == INTERPRETER_ARCH or not ENVIRONMENT_KNOBS[backend_of(arch)]:
        yield
        return
    with _ENVIRONMENT_LOCK:
        if _environment_of.get(kernel, ()) != environment and hasattr(kernel, "device_caches"):
            kernel.device_caches.clear()  # rebuilt per device on the next lookup
        _environment_of[kernel] = environment
        saved = {variable: os.environ.get(variable) for variable, _ in environment}
        os.environ.update(environment)
        try:
            yield
        finally:
            for variable, value in saved.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value


def _load(compiled: Any) -> None:
    """Load a compile's binary as a launch would, so that what a launch builds once per process and cache
    (the driver's helper module and the argument launcher, compiled from C on a fresh cache) is built here,
    by the compile worker, not in the benchmarking child's first call; and a config beyond the device's
    registers or shared memory fails its compile (``OutOfResources``), not its first launch. Through a
    Triton internal: where a version lacks it, the launch does this itself, as before. In a process that
    compiles offline (``kernels.offline``) there is no GPU to load on: the helper and launcher are built alone."""
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    if offline_arch() is not None:
        build_launcher(compiled)
        return
    init_handles = getattr(compiled, "_init_handles", None)
    if init_handles is not None:
        init_handles()


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    constexprs: dict[str, Any],
    config: dict[str, Any],
    compile_only: bool = False,
) -> None:
    """Launch ``kernel``, or with ``compile_only`` just compile it into Triton's cache (and load it, ``_load``).

    Running and compiling share this one call so that the binary a sweep compiles ahead
    of time is exactly the one its launch later finds in the cache. The interpreter has
    nothing to compile, so ``compile_only`` is a no-op there; an empty grid (no rows)
    launches nothing, since CUDA rejects it, and neither does a first argument on the meta device:
    a model run on meta tensors goes through every lookup and launch with the shapes alone
    (``tuner.train.model_shapes``).
    """
    if getattr(args[0], "is_meta", False):
        return
    options = {**constexprs, **launch_options(config)}
    environment = compiler_environment(config)
    if compile_only:
        if current_arch() != INTERPRETER_ARCH:
            with _compiling_with(kernel, environment):
                _load(kernel.warmup(*args, grid=grid, **options))
    elif all(grid):
        key = _launch_key(kernel, args, options, environment) if CACHE_COMPILED else None
        try:
            cached = _compiled.get(key) if key is not None else None
        except TypeError:  # an unhashable constexpr: Triton's path
            key = cached = None
        if cached is None:
            with _compiling_with(kernel, environment):
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


def _launch_key(kernel: Any, args: tuple[Any, ...], options: dict[str, Any],
                environment: tuple[tuple[str, str], ...]) -> tuple | None:
    """The compiled-kernel key of a launch (the kernel, the current device, the options and compiler
    environment, the arguments' specializations), or None where only ``JITFunction.run`` may launch it."""
    if (type(kernel) is not JITFunction or kernel.pre_run_hooks or current_arch() == INTERPRETER_ARCH
            or not (_hook_idle(knobs.runtime.launch_enter_hook) and _hook_idle(knobs.runtime.launch_exit_hook))
            or _trailing_constexprs(kernel, len(args)) is None):
        return None
    arg_keys = tuple(_arg_key(arg) for arg in args)
    if _UNKEYABLE in arg_keys:
        return None
    return kernel, driver.active.get_current_device(), tuple(options.items()), environment, arg_keys


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
