"""Which architecture the kernels run on, named as the tuned tables are named."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # torch is imported by the functions that need it: the CLI reads arch names without it
    import torch

INTERPRETER_ARCH = "interp"
_offline_arch: str | None = None  # ``set_offline_arch``: this process compiles for it, runs nothing


def interpreter_active() -> bool:
    """True when Triton runs kernels on the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def current_arch() -> str:
    """``sm_90`` on an H100/H200, ``gfx942``-style names on AMD, ``interp`` on the CPU interpreter; in a
    process that compiles offline (``kernels.offline``), the arch it compiles for."""
    if _offline_arch is not None:
        return _offline_arch
    if interpreter_active():
        return INTERPRETER_ARCH
    import torch

    if not torch.cuda.is_available():
        return INTERPRETER_ARCH
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


@contextlib.contextmanager
def as_interpreter() -> Iterator[None]:
    """Inside ``with``, ``current_arch()`` is ``interp`` and the kernels take the interpreter's host paths,
    whatever device there is; the arch seen before comes back after. For runs on meta tensors, whose
    launches return before anything compiles (``tuner.train.model_shapes``): a GPU's host paths would
    build TMA descriptors from them."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    current_arch.cache_clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
        current_arch.cache_clear()


def backend_of(arch: str) -> str:
    """The Triton backend that compiles for ``arch``: ``hip`` for AMD's ``gfx`` names, else ``cuda``."""
    return "hip" if arch.startswith("gfx") else "cuda"


def set_offline_arch(arch: str) -> None:
    """From now on ``current_arch()`` is ``arch`` and kernel inputs live on the CPU (``kernels.offline.compile_for``)."""
    global _offline_arch
    _offline_arch = arch
    current_arch.cache_clear()


def offline_arch() -> str | None:
    """The arch this process compiles for without its GPU (``kernels.offline.compile_for``), else None."""
    return _offline_arch


def kernel_device() -> torch.device:
    """The device kernel inputs live on: the GPU, or the CPU under the interpreter and where the process
    compiles offline (a compile reads the inputs' dtypes, alignment and sizes, never their memory)."""
    import torch

    if current_arch() == INTERPRETER_ARCH or _offline_arch is not None:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
