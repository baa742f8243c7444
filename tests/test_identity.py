"""A config's identity changes with everything that could change its measurement, and only that."""

from tuner.identity import config_identity

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
