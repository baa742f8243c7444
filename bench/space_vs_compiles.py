"""Checks a search space's constraints against offline compiles: which configs the space admits that
spill or would not load, and which it prunes that compile cleanly.

The spaces prune configs before anything is compiled, with register and shared-memory estimates,
some of them never checked against a compile. This draws configs from the space's full grid at one
preset shape (a seeded sample, or all of them), compiles each without a GPU for ``--arch`` (default
sm_90, as ``kernel_resources.py --offline-arch`` does: with the GPU image's Triton 3.6 the compiles
equal the H200's; or an AMD arch, gfx942 / gfx950, whose spills are the scratch a work-item spills to
and whose limit is the LDS a workgroup may take) and sorts them by the space's verdict against what
the compile holds.

Usage: python bench/space_vs_compiles.py KERNEL PRESET SHAPE_TEXT OUT_JSON [--sample N] [--seed S] [--admitted-only]
           [--arch ARCH]
(SHAPE_TEXT picks the preset's first shape whose key contains it). Writes OUT_JSON and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import kernel_resources  # bench/ is the script directory
from offline_compiler_knobs import knob_marks


def compile_outcome(launched: dict[str, dict[str, Any]],
                    shared_limit: int = kernel_resources.SM90_SHARED_PER_SM) -> str:
    """``fits``, ``spills`` or ``over shared memory`` (would not load: more than ``shared_limit`` bytes),
    from every compiled kernel of a run."""
    if any(k["shared_bytes"] > shared_limit for k in launched.values()):
        return "over shared memory"
    return "spills" if any(k["spilled_bytes"] for k in launched.values()) else "fits"


def _compile(kernel: Any, inputs: Any, config: dict[str, Any], arch: str) -> dict[str, dict[str, Any]]:
    """Every Triton kernel one run of ``config`` compiles for ``arch``: sm_90's resources
    (``kernel_resources``), or for another arch its shared memory and spills (``knob_marks``)."""
    if arch == "sm_90":
        return kernel_resources._measure(kernel, inputs, config, kernel_resources.SM90_SHARED_PER_SM, True)
    kernel_resources._launched.clear()
    kernel.run(inputs, config)
    return {fn: knob_marks(compiled) for fn, compiled in kernel_resources._launched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel")
    parser.add_argument("preset")
    parser.add_argument("shape_text")
    parser.add_argument("out", type=Path)
    parser.add_argument("--sample", type=int, default=0, help="configs drawn from the grid (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--admitted-only", action="store_true",
                        help="draw only configs the space admits (pruned ones can take minutes to compile)")
    parser.add_argument("--arch", default="sm_90", help="compile for this arch (sm_90, gfx942, gfx950, ...)")
    args = parser.parse_args()
    arch = args.arch
    kernel_resources._use_offline_arch(arch)
    kernel_resources.record_launches(True)
    from kernels import registry
    from search_spaces import arch_facts, load_space

    kernel, space = registry.get(args.kernel), load_space(args.kernel)
    shape = next(s for s in kernel.presets[args.preset] if args.shape_text in kernel.shape_key(s))
    grid = space.grid(arch)
    # sm_90: what an H200 reports a multiprocessor holds, as in the committed 2026-12-01 results
    shared_limit = kernel_resources.SM90_SHARED_PER_SM if arch == "sm_90" else arch_facts(arch)["smem_bytes"]
    pool = [c for c in grid if space.violation(c, shape, arch) is None] if args.admitted_only else grid
    configs = random.Random(args.seed).sample(pool, args.sample) if 0 < args.sample < len(pool) else pool
    inputs = kernel.make_inputs(shape, torch.device("cpu"), 3)
    rows = []
    for n, config in enumerate(configs, 1):
        verdict = space.violation(config, shape, arch)
        try:
            launched = _compile(kernel, inputs, config, arch)
            outcome = compile_outcome(launched, shared_limit)
        except Exception as exc:  # noqa: BLE001 - a config the compiler rejects is an outcome to record
            launched, outcome = {}, f"compile error: {type(exc).__name__}"
        rows.append({"config": config, "admitted": verdict is None, "violation": verdict, "outcome": outcome,
                     "triton_kernels": launched})
        print(f"{n}/{len(configs)} {'admitted' if verdict is None else 'pruned'} {outcome} {json.dumps(config)}",
              flush=True)
        args.out.write_text(json.dumps({"kernel": args.kernel, "shape": kernel.shape_key(shape), "grid": len(grid),
                                        "rows": rows}, indent=1))
    counts = Counter((r["admitted"], r["outcome"]) for r in rows)
    drawn = f"{len(rows)} of the {len(pool)} configs it admits" if args.admitted_only else \
        f"{len(rows)} of the {len(grid)} grid configs"
    lines = [f"{args.kernel} at {kernel.shape_key(shape)}: {drawn} compiled for {arch}", "",
             "| space | compile | configs |", "|---|---|---|"]
    lines += [f"| {'admitted' if admitted else 'pruned'} | {outcome} | {count} |"
              for (admitted, outcome), count in sorted(counts.items(), key=lambda c: (not c[0][0], c[0][1]))]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
