"""What a compiler knob changes in the compiled kernel, read from offline compiles (no GPU).

The sweeps tune knobs that only the compiler acts on: Hopper warp specialization (``WARP_SPECIALIZE``,
a loop attribute), AMD's block ping-pong schedule and async copies to LDS (``block_pingpong``,
``async_copy``, read by Triton from the environment). A knob that never reaches the compiler is a
dimension a sweep explores for nothing, and a knob whose compiled form a process keeps from an
earlier config times the wrong binary. This compiles each variant of a launch (a config merged over
the heuristic default), all in one process and in the order given, as a sweep's benchmark child
would, for ``ARCH`` (sm_90, sm_100, gfx942, gfx950: Triton compiles for each without its GPU), and
records per compiled Triton kernel the marks of each knob:

* CUDA: ``warp_specialize`` regions in the TTGIR, the warps a program launches with, ``setmaxnreg``
  in the PTX (how many, and the range of register counts the producer and consumer warps move to),
  and the registers (at launch) and spills of the cubin (``cuobjdump``);
* HIP: ``s_setprio`` (the ping-pong schedule's priority switches), loads straight to LDS
  (``global_load_lds`` / ``buffer_load ... lds``: async copies), the ``.vgpr_count`` and the scratch a
  work-item spills to (``.private_segment_fixed_size``);

and for both the shared memory (LDS) and a digest of the code without its debug lines, so two
variants that compiled to the same code show it.

Usage: python bench/offline_compiler_knobs.py OUT_JSON ARCH KERNEL,... PRESET SHAPE_TEXT VARIANTS_JSON
(SHAPE_TEXT: the preset's shapes whose key contains it; VARIANTS_JSON maps a variant name to a config
over the default, e.g. '{"plain": {"TMA": 1}, "specialized": {"TMA": 1, "WARP_SPECIALIZE": 1}}', or
names a tuned table, ``table:kernels/tables/sm_90.json``: the default and the table's entry at each
shape, to compare the code of two versions of a kernel).
Writes OUT_JSON and the same rows as a markdown table, OUT.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch
import triton

import kernel_resources  # bench/ is the script directory
from launch_variants import configs_at, preset_shapes

_DEBUG_LINE = re.compile(r"^\s*(\.loc|\.file|//|;)")
_DEBUG_SECTIONS = re.compile(r"^\s*\.section\s+\.debug", re.MULTILINE)  # the rest of the file: DWARF
_SETMAXNREG = re.compile(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)")
_LDS_LOAD = re.compile(r"^\s*(global_load_lds\w*|buffer_load\w*\s[^\n;]*\blds\b)", re.MULTILINE)


def _digest(code: str) -> str:
    """A short digest of ``code`` without its debug information and comments (source line numbers and
    the source file's path differ between two checkouts of the same code)."""
    code = _DEBUG_SECTIONS.split(code, maxsplit=1)[0]
    kept = "\n".join(line for line in code.splitlines() if not _DEBUG_LINE.search(line))
    return hashlib.sha256(kept.encode()).hexdigest()[:12]


def knob_marks(compiled: Any) -> dict[str, Any]:
    """The marks of the compiler knobs in one compiled kernel (see the module docstring)."""
    shared = compiled.metadata.shared
    if "amdgcn" in compiled.asm:
        code = compiled.asm["amdgcn"]
        vgprs = re.search(r"\.vgpr_count:\s+(\d+)", code)
        scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", code)  # spills, per work-item
        lds_loads = len(_LDS_LOAD.findall(code))
        return {"shared_bytes": shared, "s_setprio": code.count("s_setprio"), "lds_direct_loads": lds_loads,
                "vgprs": int(vgprs.group(1)) if vgprs else None, "spilled_bytes": int(scratch.group(1)) if scratch else 0,
                "digest": _digest(code)}
    registers, spilled = kernel_resources._registers_and_spills(compiled, offline=True)
    moved_to = [int(n) for n in _SETMAXNREG.findall(compiled.asm["ptx"])]
    return {"shared_bytes": shared, "registers": registers, "spilled_bytes": spilled,
            "warps": compiled.metadata.num_warps,
            "warp_specialize": compiled.asm["ttgir"].count("ttg.warp_specialize("),
            "setmaxnreg": len(moved_to), "setmaxnreg_range": f"{min(moved_to)}-{max(moved_to)}" if moved_to else "-",
            "digest": _digest(compiled.asm["ptx"])}


def compile_error(exc: Exception) -> str:
    """The exception's type and first line (Triton reports a failed pass, its assertions included, as
    ``RuntimeError: PassManager::run failed``; the pass it names goes to stderr)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def marks_table(rows: list[dict[str, Any]]) -> str:
    """The rows as markdown: one line per compiled Triton kernel of each variant."""
    columns = sorted({name for row in rows for marks in row["triton_kernels"].values() for name in marks} - {"digest"})
    lines = ["| arch | launch | shape | variant | Triton kernel | " + " | ".join(columns) + " | digest |",
             "|---" * (6 + len(columns)) + "|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['arch']} | {row['kernel']} | {row['shape']} | {row['variant']} | "
                         f"does not compile: {row['error']} |" + " |" * (len(columns) + 1))
        for fn, marks in row["triton_kernels"].items():
            lines.append(f"| {row['arch']} | {row['kernel']} | {row['shape']} | {row['variant']} | {fn} | "
                         + " | ".join(str(marks.get(c, "-")) for c in columns) + f" | {marks['digest']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("arch")
    parser.add_argument("kernels")
    parser.add_argument("preset")
    parser.add_argument("shape_text")
    parser.add_argument("variants", help="JSON: variant name -> config over the default; or table:TABLE_JSON")
    args = parser.parse_args()
    kernel_resources._use_offline_arch(args.arch)
    kernel_resources.record_launches(True)
    from kernels import registry

    if args.variants.startswith("table:"):
        entries, variants = json.loads(Path(args.variants.removeprefix("table:")).read_text())["entries"], None
    else:
        entries, variants = {}, json.loads(args.variants)
    rows = []
    for name in args.kernels.split(","):
        kernel = registry.get(name)
        for key, shape in preset_shapes(kernel, [args.preset], args.shape_text).items():
            inputs = kernel.make_inputs(shape, torch.device("cpu"), 3)
            for variant, config in configs_at(kernel, shape, entries.get(name, {}), variants).items():
                kernel_resources._launched.clear()
                row = {"arch": args.arch, "kernel": name, "shape": key, "variant": variant, "config": config}
                try:
                    kernel.run(inputs, config)
                except Exception as exc:  # noqa: BLE001 - a config the compiler rejects is a result
                    row["error"] = compile_error(exc)
                launched = {fn: knob_marks(compiled) for fn, compiled in kernel_resources._launched}
                rows.append({**row, "triton_kernels": launched})
                print(args.arch, name, key, variant, json.dumps(launched), flush=True)
            del inputs
    args.out.write_text(json.dumps({"triton": triton.__version__, "arch": args.arch, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(marks_table(rows))


if __name__ == "__main__":
    main()
