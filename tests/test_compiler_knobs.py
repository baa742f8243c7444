"""Compiler knobs reach the compiler: AMD's environment knobs (block ping-pong, async copy) set around
each compile and keyed per config, Hopper warp specialization in the expert GEMMs, and every knob a
search space tunes known to ``kernels.launch``. The end-to-end checks compile offline (no GPU) with the
wheel's own compilers, in a child process without TRITON_INTERPRET, through
``python -m bench offline_compile``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import triton.language as tl
from pydantic import ValidationError
from triton.runtime.jit import JITFunction

from kernels import launch as launch_module
from search_spaces import SearchSpace, load_space
from search_spaces.space import space_dirs

ROOT = Path(__file__).resolve().parents[1]


def _kernel_body(x_ptr, BLOCK: tl.constexpr):
    pass


@pytest.fixture
def pretend_gfx950(monkeypatch):
    """A real JITFunction on a pretend gfx950 whose ``run`` records the environment it compiled under."""
    kernel = JITFunction(_kernel_body)
    seen = []
    kernel.run = lambda *args, grid, warmup, **options: seen.append(
        (os.environ.get("TRITON_HIP_USE_ASYNC_COPY"), dict(kernel.device_caches)))
    monkeypatch.setattr(launch_module, "current_arch", lambda: "gfx950")
    monkeypatch.setattr(launch_module, "CACHE_COMPILED", False)
    monkeypatch.delenv("TRITON_HIP_USE_ASYNC_COPY", raising=False)
    return kernel, seen


def _launch(kernel, **knobs):
    launch_module.launch(kernel, (1,), (None,), {"BLOCK": 16}, {"num_warps": 4, **knobs})


def test_environment_knobs_are_set_around_a_compile_and_restored(pretend_gfx950):
    kernel, seen = pretend_gfx950
    _launch(kernel, async_copy=1)
    _launch(kernel, async_copy=0)
    _launch(kernel)  # not set: Triton's own default
    assert [env for env, _ in seen] == ["1", "0", None]
    assert "TRITON_HIP_USE_ASYNC_COPY" not in os.environ


def test_a_kernel_drops_its_compiled_forms_only_when_its_environment_knobs_change(pretend_gfx950):
    """Triton keys its in-memory compiled kernels without the environment: a form compiled with async
    copies would otherwise be reused for a config without them."""
    kernel, seen = pretend_gfx950
    _launch(kernel, async_copy=1)
    kernel.device_caches[0] = "compiled with async copies"
    _launch(kernel, async_copy=1)  # the same knobs: kept
    assert seen[-1][1] == {0: "compiled with async copies"}
    _launch(kernel, async_copy=0)
    assert seen[-1][1] == {}


def test_environment_knobs_are_only_those_of_the_running_backend(monkeypatch):
    config = {"async_copy": 1, "block_pingpong": 0, "maxnreg": 128}
    monkeypatch.setattr(launch_module, "current_arch", lambda: "gfx942")
    assert launch_module.compiler_environment(config) == (("TRITON_HIP_USE_ASYNC_COPY", "1"),
                                                          ("TRITON_HIP_USE_BLOCK_PINGPONG", "0"))
    assert launch_module.launch_options({**config, "waves_per_eu": 2}) == {"waves_per_eu": 2}
    monkeypatch.setattr(launch_module, "current_arch", lambda: "sm_90")
    assert launch_module.compiler_environment(config) == ()
    assert launch_module.launch_options(config) == {"maxnreg": 128}


def test_the_launch_cache_keys_on_environment_knobs(monkeypatch):
    monkeypatch.setattr(launch_module, "current_arch", lambda: "gfx950")
    monkeypatch.setattr(launch_module, "driver", type("Driver", (), {"active": type("A", (), {
        "get_current_device": staticmethod(lambda: 0)})()}))
    kernel = JITFunction(_kernel_body)
    keys = {launch_module._launch_key(kernel, (3,), {"BLOCK": 16}, env)
            for env in ((), (("TRITON_HIP_USE_ASYNC_COPY", "1"),), (("TRITON_HIP_USE_ASYNC_COPY", "0"),))}
    assert len(keys) == 3 and None not in keys


def test_a_space_tuning_a_knob_kernels_launch_does_not_pass_on_is_refused():
    space = load_space("expert_down_fwd")
    body = space.model_dump() | {"knobs": {"hip": {"kpack": [1, 2], "use_block_pingpong": [0, 1]}}}
    with pytest.raises(ValidationError, match=r"unknown hip knobs \['use_block_pingpong'\]; kernels.launch passes on"):
        SearchSpace(**body)
    for name in sorted(p.stem for d in space_dirs() for p in d.glob("*.yaml")):
        load_space(name)  # every committed space loads


def _offline_marks(arch: str, variants: dict) -> dict[str, dict]:
    """Each variant's compile marks from ``python -m bench offline_compile`` at the small expert_down_fwd
    shape, compiled for ``arch`` in one child process in the order given."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "marks.json"
        done = subprocess.run([sys.executable, "-m", "bench", "offline_compile", "--arch", arch, "--kernel",
                               "expert_down_fwd", "--preset", "small", "--shape", "tokens=22", "--configs",
                               json.dumps(variants), "--record", str(out)],
                              env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        compiles = json.loads(out.read_text())["figures"]["compiles"]
    return {key.split(" ")[2]: marks for key, marks in compiles.items() if key.endswith(" _grouped_gemm_kernel")}


def test_async_copy_changes_the_gfx950_compile_within_one_process():
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2}
    marks = _offline_marks("gfx950", {"sync": {**tile, "async_copy": 0}, "async": {**tile, "async_copy": 1},
                                      "sync_again": {**tile, "async_copy": 0}})
    assert marks["sync"]["lds_direct_loads"] == 0 < marks["async"]["lds_direct_loads"]
    assert marks["async"]["shared_bytes"] > marks["sync"]["shared_bytes"]  # two LDS buffers
    assert marks["sync_again"]["digest"] == marks["sync"]["digest"]


def test_warp_specialize_splits_the_expert_gemm_on_sm_90():
    tile = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3}
    marks = _offline_marks("sm_90", {"plain": tile, "specialized": {**tile, "WARP_SPECIALIZE": 1}})
    assert marks["plain"]["warp_specialize"] == 0 and marks["plain"]["setmaxnreg"] == "-"
    assert marks["specialized"]["warp_specialize"] >= 1 and marks["specialized"]["setmaxnreg"] != "-"


def test_knob_values_an_arch_overrides_leave_its_dimensions():
    """gfx950's compiler turns kpack 2 into 1: a sweep there would time one binary twice."""
    space = load_space("expert_down_fwd")
    assert space.dimensions("gfx942")["kpack"] == [1, 2]
    assert space.dimensions("gfx950")["kpack"] == [1]
    assert space.size("gfx950") * 2 == space.size("gfx942")
    only_ignored = space.model_copy(update={"knobs": {"hip": {"kpack": [2], "waves_per_eu": [0, 2]}}})
    assert "kpack" not in only_ignored.dimensions("gfx950")  # left to the compiler
    assert only_ignored.dimensions("gfx950")["waves_per_eu"] == [0, 2]
