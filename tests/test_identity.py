"""A config's identity changes with everything that could change its measurement, and only that."""

import importlib.util

from kernels.registry import TunableKernel
from tuner.sweep.identity import config_identity

TOOLCHAIN = {"triton": "3.6.0", "torch": "2.11.0", "cuda": "13.0", "driver": "580"}
BASE = ("rmsnorm_fwd", "tokens=4096,hidden=4096", "sm_90", {"BLOCK_M": 2, "num_warps": 8})


def test_identity_is_stable_and_order_free():
    assert config_identity(*BASE, TOOLCHAIN) == config_identity(
        BASE[0], BASE[1], BASE[2], {"num_warps": 8, "BLOCK_M": 2}, dict(reversed(TOOLCHAIN.items())))


def test_identity_covers_config_shape_arch_toolchain_and_timing_method():
    base = config_identity(*BASE, TOOLCHAIN)
    variants = [
        config_identity(BASE[0], BASE[1], BASE[2], {"BLOCK_M": 4, "num_warps": 8}, TOOLCHAIN),
        config_identity(BASE[0], "tokens=16384,hidden=4096", BASE[2], BASE[3], TOOLCHAIN),
        config_identity(BASE[0], BASE[1], "gfx942", BASE[3], TOOLCHAIN),
        config_identity(*BASE, {**TOOLCHAIN, "triton": "3.5.0"}),
        config_identity(*BASE, {**TOOLCHAIN, "driver": "570"}),
        config_identity(*BASE, TOOLCHAIN, method="cudagraph"),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert config_identity(*BASE, TOOLCHAIN, method="events") == base


def test_kernel_source_version_follows_the_launch_code(tmp_path, monkeypatch):
    """A stored timing is reused only while the file holding the kernel's launch code is unchanged."""
    module = tmp_path / "probe_kernel.py"
    monkeypatch.syspath_prepend(str(tmp_path))

    def version() -> str:
        spec = importlib.util.spec_from_file_location("probe_kernel", module)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        kernel = TunableKernel(name="probe", shape_fields=("n",), exact_fields=(), make_inputs=None, run=loaded.run,
                               reference=None, default_config=None, bytes_moved=None)
        return kernel.source_version

    module.write_text("def run(inputs, config):\n    return inputs\n")
    first = version()
    assert version() == first and len(first) == 12
    module.write_text("def run(inputs, config):\n    return inputs  # a loop bound changed\n")
    assert version() != first
