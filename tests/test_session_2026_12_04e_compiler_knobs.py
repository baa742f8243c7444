"""The 2026-12-04e write-up's offline compiles (``bench/offline_compiler_knobs.sh``): its tables reprint
from the raw results, and what it says each compiler knob changed is what the raw results hold."""

from __future__ import annotations

import json
import sys

import pytest

from tests.bench_reprint import ROOT

sys.path.insert(0, str(ROOT / "bench"))  # the script imports its sibling bench modules by name
from offline_compiler_knobs import marks_table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "2026-12-04e-cpu-compiler-knobs"
ROW_TILE_GEMMS = ["expert_up_fwd", "expert_down_fwd", "expert_up_bwd_dx", "expert_down_bwd_dx"]
GRIDS = [f"sm_90-warp-specialized-grid-{launch}" for launch in ROW_TILE_GEMMS]
RUNS = ["sm_90-warp-specialize", "sm_100-warp-specialize", "gfx942-async-copy-and-pingpong",
        "gfx950-async-copy-and-pingpong", "sm_90-tuned-after", "sm_90-tuned-before",
        "sm_90-warp-specialized-256-wide", *GRIDS, "gfx942-kpack", "gfx950-kpack"]
SHARED_BYTES_A_BLOCK = 232_448  # sm_90's opt-in limit (search_spaces/arch_facts.py)
AMD = ["gfx942", "gfx950"]


def _marks(run: str) -> dict[tuple[str, str], dict]:
    """(launch, variant) -> the marks of the launch's one compiled kernel."""
    rows = json.loads((RESULTS / f"{run}.json").read_text())["rows"]
    return {(r["kernel"], r["variant"]): next(iter(r["triton_kernels"].values())) for r in rows}


@pytest.mark.parametrize("run", RUNS)
def test_tables_reprint(run):
    rows = json.loads((RESULTS / f"{run}.json").read_text())["rows"]
    assert marks_table(rows) == (RESULTS / f"{run}.md").read_text()


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_warp_specialization_takes_the_4_warp_loops_only(arch):
    marks = _marks(f"{arch}-warp-specialize")
    launches = {launch for launch, _ in marks}
    assert launches == (set(ROW_TILE_GEMMS) if arch == "sm_90" else {"expert_down_fwd"})
    for (launch, variant), m in marks.items():
        if arch == "sm_100":
            assert (m["warp_specialize"] > 0) == variant.endswith("-ws")
            continue
        specialized = variant.endswith("-w4-ws")
        assert (m["warp_specialize"], m["setmaxnreg"]) == ((1, 8) if specialized else (0, 0)), (launch, variant)
        if specialized:
            assert m["registers"] == 168 and m["warps"] == 12 and m["setmaxnreg_range"] == "40-256"
            assert m["shared_bytes"] > marks[(launch, variant.removesuffix("-ws"))]["shared_bytes"]


def test_async_copies_load_straight_to_lds_into_more_of_it():
    for arch in AMD:
        marks = _marks(f"{arch}-async-copy-and-pingpong")
        for (launch, variant), m in marks.items():
            if "async" in variant:
                assert m["lds_direct_loads"] > 0, (arch, launch, variant)
            else:
                assert m["lds_direct_loads"] == 0, (arch, launch, variant)
        for launch in {launch for launch, _ in marks}:
            assert marks[(launch, "128x128-async")]["shared_bytes"] > marks[(launch, "128x128")]["shared_bytes"]


def test_ping_pong_schedules_the_one_dot_loops_and_leaves_the_other_two():
    one_dot = {"expert_down_fwd", "expert_up_bwd_dx", "expert_down_bwd_dx", "expert_up_bwd_dw"}
    for arch in AMD:
        marks = _marks(f"{arch}-async-copy-and-pingpong")
        for launch in {launch for launch, _ in marks}:
            pingpong, plain = marks[(launch, "128x256-pingpong")], marks[(launch, "128x256")]
            if launch in one_dot:
                assert pingpong["s_setprio"] == 4 and plain["s_setprio"] == 0, (arch, launch)
            else:  # the up GEMM's two dots, the down weight gradient's scaled operand: the same code
                assert pingpong["digest"] == plain["digest"], (arch, launch)
            assert marks[(launch, "128x256-async-pingpong")]["s_setprio"] == 0  # not beside async copies


def test_the_knobs_constexpr_left_every_measured_config_s_code_as_it_was():
    rows = json.loads((RESULTS / "sm_90-tuned-after.json").read_text())["rows"]
    assert len(rows) >= 24 and {r["variant"] for r in rows} == {"default", "tuned"}
    after_by_shape = {(r["kernel"], r["shape"], r["variant"]): r["triton_kernels"] for r in rows}
    before_rows = json.loads((RESULTS / "sm_90-tuned-before.json").read_text())["rows"]
    before_by_shape = {(r["kernel"], r["shape"], r["variant"]): r["triton_kernels"] for r in before_rows}
    assert after_by_shape.keys() == before_by_shape.keys()
    for key, kernels in after_by_shape.items():
        assert {fn: m["digest"] for fn, m in kernels.items()} == \
            {fn: m["digest"] for fn, m in before_by_shape[key].items()}, key


def test_every_warp_specialized_config_the_grid_sweeps_compiles_specialized_and_fits():
    """The configs of ``GROUP=gemm-warp-specialized`` that each space admits (as the script lists them,
    from the committed spaces) compile specialized within a block's shared memory; only the down dX,
    whose epilogue holds the SwiGLU backward, spills (16-104 bytes)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from search_spaces import load_space
    from sweep_specs import WARP_SPECIALIZED_SPACE
    from kernels import registry

    counts = {}
    for launch, grid in zip(ROW_TILE_GEMMS, GRIDS):
        rows = json.loads((RESULTS / f"{grid}.json").read_text())["rows"]
        shape = registry.get(launch).presets["v4-flash"][0]
        space = load_space(launch).with_overrides(WARP_SPECIALIZED_SPACE)
        admitted = [c for c in space.grid("sm_90") if space.violation(c, shape, "sm_90") is None]
        assert sorted(json.dumps(r["config"], sort_keys=True) for r in rows) == \
            sorted(json.dumps({**registry.get(launch).default_config(shape), **c}, sort_keys=True) for c in admitted)
        for row in rows:
            assert "error" not in row, (launch, row["variant"])
            [marks] = row["triton_kernels"].values()
            assert marks["warp_specialize"] == 1 and marks["shared_bytes"] <= SHARED_BYTES_A_BLOCK
            assert marks["spilled_bytes"] <= (104 if launch == "expert_down_bwd_dx" else 0)
        counts[launch] = len(rows)
    assert counts == {"expert_up_fwd": 9, "expert_down_fwd": 12, "expert_up_bwd_dx": 12, "expert_down_bwd_dx": 3}


def test_256_wide_warp_specialized_tiles_do_not_compile():
    rows = json.loads((RESULTS / "sm_90-warp-specialized-256-wide.json").read_text())["rows"]
    assert len(rows) == 4 and all(r["error"] == "RuntimeError: PassManager::run failed" for r in rows)


def test_kpack_2_compiles_as_1_on_gfx950_only():
    digests = {arch: {variant: m["digest"] for (_, variant), m in _marks(f"{arch}-kpack").items()} for arch in AMD}
    assert digests["gfx950"]["kpack-1"] == digests["gfx950"]["kpack-2"]
    assert digests["gfx942"]["kpack-1"] != digests["gfx942"]["kpack-2"]


# (fit, spill, over LDS, compiler error) of the 30 sampled configs each HIP space admits, as the
# write-up's table gives them.
AMD_SPACE_OUTCOMES = {
    "gfx942": {"expert_up_fwd": (29, 1, 0, 0), "expert_down_fwd": (30, 0, 0, 0), "expert_up_bwd_dx": (30, 0, 0, 0),
               "expert_down_bwd_dx": (28, 2, 0, 0), "expert_up_bwd_dw": (30, 0, 0, 0),
               "expert_down_bwd_dw": (28, 0, 1, 1)},
    "gfx950": {"expert_up_fwd": (25, 2, 3, 0), "expert_down_fwd": (30, 0, 0, 0), "expert_up_bwd_dx": (30, 0, 0, 0),
               "expert_down_bwd_dx": (25, 5, 0, 0), "expert_up_bwd_dw": (28, 2, 0, 0),
               "expert_down_bwd_dw": (23, 5, 0, 2)},
}


@pytest.mark.parametrize("arch", AMD)
def test_the_hip_spaces_against_offline_compiles(arch):
    """Outcome counts as the write-up gives them, and as each run's summary (OUT.md) printed them; every
    spill at 256 or 512 VGPRs; every LDS overrun an async-copy config."""
    for launch, expected in AMD_SPACE_OUTCOMES[arch].items():
        run = json.loads((RESULTS / f"{arch}-space-{launch}.json").read_text())
        rows = run["rows"]
        assert len(rows) == 30 and all(r["admitted"] for r in rows)
        counts = [sum(r["outcome"] == o for r in rows) for o in ("fits", "spills", "over shared memory")]
        counts.append(sum(r["outcome"].startswith("compile error") for r in rows))
        assert tuple(counts) == expected, launch
        summary = (RESULTS / f"{arch}-space-{launch}.md").read_text()
        for outcome, count in zip(("fits", "spills", "over shared memory"), counts):
            assert (f"| admitted | {outcome} | {count} |" in summary) == (count > 0), (launch, outcome)
        for row in rows:
            marks = list(row["triton_kernels"].values())
            if row["outcome"] == "spills":
                assert any(m["spilled_bytes"] > 0 and m["vgprs"] in (256, 512) for m in marks)
            if row["outcome"] == "over shared memory":
                assert row["config"]["async_copy"] == 1
