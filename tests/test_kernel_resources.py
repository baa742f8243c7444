"""``bench/kernel_resources.py``'s loop bodies and their barriers, read from SASS: each backward branch's span."""

from __future__ import annotations

from bench.kernel_resources import (loop_barriers, loop_bodies, loop_uniform_moves, loop_wgmma_waits,
                                    serialization_reason)

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


def test_loop_barriers_count_the_bar_syncs_inside_each_body():
    sass = SASS.replace(
        "        /*2000*/", "        /*1ff0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*2010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*2020*/                   DEPBAR.LE SB0, 0x0 ;\n"
        "        /*2030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n        /*2000*/")
    assert loop_barriers(sass) == [2]  # the one at 0x1ff0 is before the loop; DEPBAR is no CTA barrier
    assert loop_barriers(SASS) == [0]


def test_loop_uniform_moves_count_the_r2urs_inside_each_body():
    sass = SASS.replace(
        "        /*2000*/", "        /*1ff0*/                   R2UR UR4, R2 ;\n"
        "        /*2010*/                   R2UR UR40, R248 ;\n"
        "        /*2020*/                   UIADD3.64 UR52, UR4, 0x4, URZ ;\n"
        "        /*2030*/                   R2UR UR41, R249 ;\n        /*2000*/")
    assert loop_uniform_moves(sass) == [2]  # the one at 0x1ff0 is before the loop
    assert loop_uniform_moves(SASS) == [0]


def test_loop_wgmma_waits_count_the_warpgroup_depbars_inside_each_body():
    sass = SASS.replace(
        "        /*2000*/", "        /*1ff0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
        "        /*2010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT, gsb0 ;\n"
        "        /*2020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
        "        /*2030*/                   DEPBAR.LE SB0, 0x0 ;\n        /*2000*/")
    assert loop_wgmma_waits(sass) == [1]  # the one at 0x1ff0 is before the loop; DEPBAR is cp.async's
    assert loop_wgmma_waits(SASS) == [0]


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

    from bench import kernel_resources
    from kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "CACHE_COMPILED", True)
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, grid, warmup, **kwargs: "compiled")
    monkeypatch.setattr(kernel_resources, "_launched", [])
    kernel_resources.record_launches(compile_only=True)
    assert launch_module.CACHE_COMPILED is False
    kernel = JITFunction(_recorded_kernel)
    assert kernel.run(1, grid=(1,), warmup=False) == "compiled"
    assert [name for name, _ in kernel_resources._launched] == ["_recorded_kernel"]


def _recorded_kernel(x_ptr):
    pass
