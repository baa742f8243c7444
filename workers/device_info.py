"""What a worker runs on: host, device, arch and the toolchain that is part of a config's identity."""

from __future__ import annotations

import functools
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
import triton

from kernels.arch import INTERPRETER_ARCH, current_arch


# The NVIDIA kernel module names its version here ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
# 570.133.20 ..."): read in microseconds, where nvidia-smi takes up to seconds of a worker's start.
NVIDIA_MODULE_VERSION = Path("/proc/driver/nvidia/version")


def driver_version_of(module_text: str) -> str | None:
    """The driver version in the kernel module's version text, or None."""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", module_text)
    return found.group(1) if found else None


@functools.lru_cache(maxsize=1)
def _driver_version() -> str | None:
    try:
        version = driver_version_of(NVIDIA_MODULE_VERSION.read_text())
    except OSError:
        version = None
    if version is not None:
        return version
    try:  # not a Linux NVIDIA driver (or no /proc): ask nvidia-smi
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def describe_device() -> dict[str, Any]:
    """Host, device name, arch, SM/CU count and versions of the running process."""
    arch = current_arch()
    info: dict[str, Any] = {"host": socket.gethostname(), "arch": arch}
    if arch == INTERPRETER_ARCH:
        info.update(gpu_name=f"CPU ({platform.processor() or platform.machine()}) via TRITON_INTERPRET", sm_count=None,
                    memory_bytes=None)
    else:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(gpu_name=props.name, sm_count=props.multi_processor_count, memory_bytes=props.total_memory)
    info["versions"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "driver": None if arch == INTERPRETER_ARCH else _driver_version(),
    }
    return info


def gpu_name_and_memory(device: torch.device | str) -> tuple[str, int | None]:
    """The device's name and memory in bytes, as the profile rows are keyed: ``("cpu", None)`` on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu", None
    return torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
