"""The tunable-kernel registry: what the sweep service needs to know about each kernel.

A kernel module describes each tunable launch (e.g. ``rmsnorm_fwd``) with one
``TunableKernel`` and calls ``register``. The sweep workers, the exporter and the
run-time lookup all find kernels here by name, so adding a kernel touches no other
module. Extra modules (a user's own kernels, the test suite's fault-injection kernel)
are imported from the comma-separated ``TUNER_KERNEL_MODULES`` environment variable.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

Shape = dict[str, int]
Config = dict[str, Any]
Inputs = dict[str, Any]

# Modules of the project that register kernels; imported on first lookup.
BUILTIN_MODULES = (
    "kernels.rmsnorm", "kernels.sinkhorn", "kernels.mhc", "kernels.rope", "kernels.router", "kernels.grouped_gemm",
    "kernels.sparse_attention", "kernels.compressor", "kernels.indexer", "kernels.moe_combine",
    "kernels.cross_entropy", "kernels.adamw",
)


@dataclass(frozen=True)
class TunableKernel:
    """One tunable kernel launch, as the sweep service sees it.

    ``run`` launches the Triton kernel with an explicit config and returns its outputs
    (a tensor or a tuple of tensors); ``reference`` computes the same outputs eagerly;
    ``compile`` compiles the config without launching it (for ahead-of-time compilation
    on CPU workers). ``exact_fields`` are the shape fields a tuned-table entry must match
    exactly; the others are matched by nearest distance in log2 space.
    """

    name: str
    shape_fields: tuple[str, ...]
    exact_fields: tuple[str, ...]
    make_inputs: Callable[[Shape, torch.device, int], Inputs]
    run: Callable[[Inputs, Config], Any]
    reference: Callable[[Inputs], Any]
    default_config: Callable[[Shape], Config]
    bytes_moved: Callable[[Shape], int]
    compile: Callable[[Inputs, Config], None] | None = None
    flops: Callable[[Shape], int] | None = None
    atol: float = 2e-2
    rtol: float = 2e-2
    presets: dict[str, list[Shape]] = field(default_factory=dict)

    @functools.cached_property
    def source_version(self) -> str:
        """Hash of the file that holds the kernel's launch code: part of a trial's identity, so that a
        stored timing is reused only while that code is unchanged."""
        return hashlib.sha256(Path(inspect.getsourcefile(inspect.unwrap(self.run))).read_bytes()).hexdigest()[:12]

    def shape_key(self, shape: Shape) -> str:
        """Canonical text key of a shape, shared by the exporter and the lookup."""
        missing = [f for f in self.shape_fields if f not in shape]
        extra = [f for f in shape if f not in self.shape_fields]
        if missing or extra:
            raise KeyError(
                f"shape for kernel {self.name!r} must have exactly the fields "
                f"{list(self.shape_fields)}; missing {missing}, unexpected {extra}"
            )
        return ",".join(f"{f}={int(shape[f])}" for f in self.shape_fields)


_REGISTRY: dict[str, TunableKernel] = {}
_loaded = False


def register(kernel: TunableKernel) -> TunableKernel:
    """Add a kernel to the registry (idempotent for the same name)."""
    _REGISTRY[kernel.name] = kernel
    return kernel


def _load_modules() -> None:
    global _loaded
    if _loaded:
        return
    extra = [m.strip() for m in os.environ.get("TUNER_KERNEL_MODULES", "").split(",") if m.strip()]
    for module in (*BUILTIN_MODULES, *extra):
        importlib.import_module(module)
    _loaded = True


def get(name: str) -> TunableKernel:
    """The registered kernel called ``name``; KeyError listing the known names otherwise."""
    _load_modules()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known kernels: {sorted(_REGISTRY)}") from None


def names() -> list[str]:
    """Names of all registered kernels, sorted."""
    _load_modules()
    return sorted(_REGISTRY)


def parse_shape_key(key: str) -> Shape:
    """Inverse of ``TunableKernel.shape_key``."""
    return {k: int(v) for k, v in (part.split("=") for part in key.split(","))}
