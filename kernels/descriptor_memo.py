"""Host-built TMA descriptors encoded once per (address, geometry), not at every launch.

A launch given a ``TensorDescriptor`` has Triton's CUDA launcher encode a CUtensorMap for it on
every call (``make_tensordesc_arg``: ``cuTensorMapEncodeTiled`` and a Python object, then the
shape and strides). On the H200's host that cost the indexer's scoring, two descriptors, 37-46 us
a call beside its pointer form (2026-12-04c), about half its kernel time, so back-to-back calls
waited on the host. The encoding is a pure function of the tensor's address, dtype and device,
the descriptor's shape, strides, block and padding, and the compiled kernel's descriptor
metadata (swizzle, element type); an eager step launches the same tensors' descriptors again
and again (torch's caching allocator hands the same blocks back), so ``install`` routes Triton's
``make_tensordesc_arg`` through a memo keyed on all of those. A hit returns the same encoded
arguments Triton would build; a descriptor encodes only an address and a geometry, so reusing
it for a later tensor at the same address with the same geometry is exact.

``ENABLED`` is read at each encoding (``TUNER_TMA_MEMO=0`` turns it off), so a benchmark can time
both paths in one process; ``hits`` counts the encodings it saved.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import torch

ENABLED = os.environ.get("TUNER_TMA_MEMO", "1") != "0"
MAX_ENTRIES = 4096  # a few hundred bytes each; the memo starts over when full
hits = 0

_memo: dict[tuple, tuple[Any, Any]] = {}


@functools.lru_cache(maxsize=None)
def _geometry_fields(cls: type) -> tuple[str, ...]:
    """A descriptor class's fields other than ``base`` (shape, strides, block, padding, and whatever
    a later Triton adds), all of which the encoding may read."""
    return tuple(field.name for field in dataclasses.fields(cls) if field.name != "base")


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def descriptor_key(arg: Any, metadata: Any, rest: tuple) -> tuple | None:
    """The memo key of one encoding, or None where it is not memoized: no kernel metadata (Triton then
    passes the tensor itself), or not a dataclass descriptor over a tensor. The metadata is keyed
    by identity: an entry holds it, so its id is not reused while the entry lives."""
    base = getattr(arg, "base", None)
    if metadata is None or not isinstance(base, torch.Tensor) or not dataclasses.is_dataclass(arg):
        return None
    return (type(arg), base.data_ptr(), base.get_device(), base.dtype, id(metadata),
            *(_frozen(getattr(arg, name)) for name in _geometry_fields(type(arg))), *rest)


def memoized(encode: Callable[..., Any]) -> Callable[..., Any]:
    """``encode`` (Triton's ``make_tensordesc_arg(arg, metadata, ...)``) with its results kept per key."""

    def encode_once(arg: Any, metadata: Any, *rest: Any) -> Any:
        global hits
        if not ENABLED:
            return encode(arg, metadata, *rest)
        try:
            key = descriptor_key(arg, metadata, rest)
            entry = _memo.get(key) if key is not None else None
        except TypeError:  # an unhashable field: encoded as Triton would
            key = entry = None
        if entry is not None:
            hits += 1
            return entry[1]
        encoded = encode(arg, metadata, *rest)
        if key is not None:
            if len(_memo) >= MAX_ENTRIES:
                _memo.clear()
            _memo[key] = (metadata, encoded)  # holding metadata keeps its id, in the key, from being reused
        return encoded

    encode_once.encode = encode  # type: ignore[attr-defined]
    return encode_once


def install(driver_module: Any) -> bool:
    """Route ``driver_module.make_tensordesc_arg`` through the memo (once); whether the module has one.
    Triton's launchers look the function up in their module at each call, so every launcher,
    ``kernels.launch``'s cached ones and ``JITFunction.run``'s alike, takes the memo."""
    encode = getattr(driver_module, "make_tensordesc_arg", None)
    if encode is None:
        return False
    if not hasattr(encode, "encode"):
        driver_module.make_tensordesc_arg = memoized(encode)
    return True


def install_on_cuda() -> bool:
    """``install`` on Triton's CUDA driver module, where this Triton has one."""
    try:
        from triton.backends.nvidia import driver as cuda_driver
    except ImportError:
        return False
    return install(cuda_driver)
