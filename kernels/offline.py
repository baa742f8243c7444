"""Compiling the kernels for an arch without opening its GPU.

Triton's JIT specialises and compiles for the driver's target; nothing in a compile needs the device.
``compile_for`` hands the JIT a stand-in driver that names the target and launches nothing, and makes
``kernels.arch`` report that arch (so the kernels take its host paths) with their inputs on the CPU. The
binary lands in Triton's cache under the key a launch on the GPU looks up: a process on the GPU then
launches it without compiling (docs/findings.md). Two users: the offline compile reports
(``bench/offline_compile.py``), and a sweep's local compile processes (``workers.compile_server``),
which thereby open no CUDA context beside the benchmarking child's.
"""

from __future__ import annotations

import re
from typing import Any

import kernels.arch


class _OfflineDriver:
    """The little of Triton's driver that its JIT needs to compile (not launch) for a GPU it does not have."""

    def __init__(self, arch: str) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = (GPUTarget("hip", arch, 64) if kernels.arch.backend_of(arch) == "hip"
                       else GPUTarget("cuda", int(arch.removeprefix("sm_")), 32))

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def compile_for(arch: str) -> None:
    """From now on this process compiles for ``arch`` (``sm_90``, ``gfx942``) and launches nothing."""
    from triton.runtime.driver import driver

    if not re.fullmatch(r"sm_\d+|gfx\w+", arch):
        raise ValueError(f"arch: {arch!r} is neither sm_NN nor gfxNNN")
    if kernels.arch.interpreter_active():
        raise ValueError("TRITON_INTERPRET=1 runs kernels in the interpreter, which compiles nothing: unset it")
    driver.set_active(_OfflineDriver(arch))
    kernels.arch.set_offline_arch(arch)


def build_launcher(compiled: Any) -> bool:
    """Build what a launch of ``compiled`` needs from the host's own Triton driver beside the binary: its C
    helper module and, where the Triton version has one, the kernel's launcher. Both are built from C once
    per cache and open no GPU context; a process on the GPU then loads them at its first launch rather than
    compiling them there (about a second on a fresh cache). True when built; False where this host has no
    such driver (a CPU machine) or the version's internals differ: the first launch builds them then."""
    from triton.runtime.driver import driver

    offline = driver.active
    try:
        host_driver = driver.default  # its constructor builds the helper module
        driver.set_active(host_driver)  # a launcher reads the active driver's helpers
        host_driver.launcher_cls(compiled.src, compiled.metadata)
    except Exception:  # noqa: BLE001 - an optimisation: the launch builds them itself
        return False
    finally:
        driver.set_active(offline)
    return True
