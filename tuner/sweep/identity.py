"""A config's identity: the hash that says two trials would measure the same thing.

It covers the kernel, the shape, the arch, every launch parameter and compiler knob, and
the toolchain (Triton, torch, CUDA/ROCm, driver, and the hash of the kernel's source file,
``kernel_source``), and the timing method when it is not the default CUDA-events one, so a
result is reused across sweeps only where nothing that could change it has changed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def config_identity(
    kernel: str, shape_key: str, arch: str, config: dict[str, Any], toolchain: dict[str, Any],
    method: str = "events",
) -> str:
    payload = {"kernel": kernel, "shape": shape_key, "arch": arch, "config": config, "toolchain": toolchain}
    if method != "events":
        payload["method"] = method
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
