"""``bench/offline_compile.py``: loop bodies and what they hold, read from SASS (each backward branch's span),
ptxas's serialization warning, compile outcomes, launch recording and bad input."""

from __future__ import annotations

import argparse

import pytest

from bench.offline_compile import compile_outcome, loop_bodies, loop_count, run, serialization_reason

# Shaped like cuobjdump -sass: 16-byte instructions, one predicated backward branch (a loop of
# 0x2000..0x2740), one forward branch and the trailing self-branch at the end of every kernel.
SASS = """
        /*1fd0*/              @!P5 BRA 0x2750 ;                   /* 0x0000000400dcd947 */
        /*2000*/                   ISETP.GE.U32.AND P0, PT, R4, R9, PT ;  /* 0x000000090400720c */
        /*2740*/               @P5 BRA P6, 0x2000 ;                /* 0xfffffff8002c5947 */
        /*2750*/                   EXIT ;                          /* 0x000000000000794d */
        /*2760*/                   BRA 0x2760;                     /* 0xfffffffc00fc7947 */
"""


def test_loop_bodies_count_each_backward_branch_span_only():
    assert loop_bodies(SASS) == [(0x2740 - 0x2000) // 16 + 1]


def test_no_loop_no_body():
    assert loop_bodies("        /*0000*/  EXIT ;\n        /*0010*/  BRA 0x10;\n") == []


@pytest.mark.parametrize("opcode, lines, inside", [
    ("BAR.SYNC", ["BAR.SYNC.DEFER_BLOCKING 0x0", "BAR.SYNC.DEFER_BLOCKING 0x0", "DEPBAR.LE SB0, 0x0",
                  "BAR.SYNC.DEFER_BLOCKING 0x0"], 2),  # DEPBAR is no CTA barrier
    ("R2UR", ["R2UR UR4, R2", "R2UR UR40, R248", "UIADD3.64 UR52, UR4, 0x4, URZ", "R2UR UR41, R249"], 2),
    ("WARPGROUP.DEPBAR", ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT, gsb0",
                          "WARPGROUP.DEPBAR.LE gsb0, 0x0", "DEPBAR.LE SB0, 0x0"], 1),  # DEPBAR is cp.async's
])
def test_loop_count_counts_an_opcode_inside_each_body_only(opcode: str, lines: list[str], inside: int) -> None:
    """The first line lands at 0x1ff0, before the loop; the other three inside it."""
    placed = "".join(f"        /*{at:04x}*/                   {line} ;\n"
                     for at, line in zip((0x1FF0, 0x2010, 0x2020, 0x2030), lines))
    assert loop_count(SASS.replace("        /*2000*/", placed + "        /*2000*/"), opcode) == [inside]
    assert loop_count(SASS, opcode) == [0]


def test_serialization_reason_reads_ptxas_warning_and_nothing_else():
    """Triton 3.6's ptxas on the expert weight-gradient kernel before 2026-12-04d (verbatim but the
    function name), and a clean assembly."""
    serialized = ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
                  "due to non wgmma instructions defining accumulator registers of a wgmma between start and end of "
                  "the pipeline stage in the function '_grouped_wgrad_kernel'\nptxas info    : 0 bytes gmem\n")
    assert serialization_reason(serialized) == ("C7515: non wgmma instructions defining accumulator registers of a "
                                                "wgmma between start and end of the pipeline stage")
    clean = "ptxas info    : 0 bytes gmem\nptxas info    : Used 174 registers, used 1 barriers\n"
    assert serialization_reason(clean) == ""


def test_recording_sees_every_launch_of_a_key(monkeypatch):
    """The compiled-kernel cache of ``kernels.launch`` would send a key's second launch past
    ``JITFunction.run``: recording turns it off, so each launch is recorded."""
    from triton.runtime.jit import JITFunction

    from bench import offline_compile
    from kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "CACHE_COMPILED", True)
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, grid, warmup, **kwargs: "compiled")
    monkeypatch.setattr(offline_compile, "_launched", [])
    offline_compile.record_launches()
    assert launch_module.CACHE_COMPILED is False
    kernel = JITFunction(_recorded_kernel)
    assert kernel.run(1, grid=(1,), warmup=False) == "compiled"
    assert [name for name, _ in offline_compile._launched] == ["_recorded_kernel"]


def _recorded_kernel(x_ptr):
    pass


def test_compile_outcome_orders_error_over_shared_memory_over_spills() -> None:
    fits = {"shared_bytes": 1024, "spilled_bytes": 0}
    assert compile_outcome({"a": fits}, 2048) == "fits"
    assert compile_outcome({"a": fits, "b": {**fits, "spilled_bytes": 8}}, 2048) == "spills"
    assert compile_outcome({"a": {"shared_bytes": 4096, "spilled_bytes": 8}}, 2048) == "over shared memory"
    assert compile_outcome({"(compile)": {"error": "RuntimeError: PassManager::run failed"}}, 2048) == "compile error"


@pytest.mark.parametrize("configs, message", [("[1]", "a JSON object mapping a name"),
                                              ("wide", "neither default, table, space nor a JSON object")])
def test_bad_configs_are_refused_before_compiling(configs: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = argparse.Namespace(arch="sm_90", kernel="rmsnorm_fwd", preset="small", shape="", configs=configs,
                              table=None, sample=0, seed=0)
    with pytest.raises(ValueError, match=message):
        run(args)


def test_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="unset it"):
        run(argparse.Namespace(arch="sm_90", configs="default"))
