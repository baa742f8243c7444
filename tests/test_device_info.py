"""The driver version a worker reports comes from the kernel module's version text."""

import pytest

from workers.device_info import driver_version_of


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 04:44:34 UTC 2025\n"
     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "570.133.20"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  (dvs-builder@U16)\n",
     "575.57.08"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.90.07  Fri May 31 09:30:47 UTC 2024\n", "550.90.07"),
    ("no module here\n", None),
])
def test_driver_version_of_the_module_text(text: str, version: str | None) -> None:
    assert driver_version_of(text) == version
