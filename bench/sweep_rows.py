"""Benchmark rows (the ``bench/kernels_h200.py`` format) from the sweeps themselves, default vs swept.

Every sweep measures the kernel's heuristic default first, on the same worker and with the same
timing as the configs it searches, so a sweep already holds "default vs swept" for each of its
shapes: the default's trial and the best ok trial. This turns those into rows that the summary
scripts (``bench/attention_summary.py``) render, for when the separate benchmark did not run.
There is no eager variant (the sweeps do not time the reference), and no copy bandwidth is
measured: ``--copy-gbps`` names the one to compare against, and the output says where it is from.

Usage: python bench/sweep_rows.py DB OUT_JSON --sweeps 61,62,... --copy-gbps 4250 --copy-source TEXT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from db import open_database, session_scope
from db.models import Trial, TrialStatus
from kernels import registry
from search_spaces import load_space
from tuner.sweep.strategies import default_in_space


def preset_of(kernel: str, shape: dict[str, int]) -> str:
    """The first V4 preset holding ``shape`` (the compressor's presets share theirs)."""
    presets = registry.get(kernel).presets
    return next((p for p in ("v4-flash", "v4-pro") if shape in presets.get(p, [])), "other")


def rows_of(trials: list[Trial], arch: str) -> list[dict[str, Any]]:
    """One row per (kernel, shape) that has an ok default trial, with the best ok trial as tuned."""
    cells: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        if t.status == TrialStatus.ok.value and t.arch == arch:
            cells.setdefault((t.kernel, t.shape_key), []).append(t)
    rows = []
    for (name, key), ok in sorted(cells.items()):
        kernel, shape = registry.get(name), registry.parse_shape_key(key)
        default = default_in_space(kernel, load_space(name), shape, arch)
        default_trials = [t for t in ok if t.config == default]
        if not default_trials:
            continue
        best = min(ok, key=lambda t: t.median_ms)
        ms = {"default": min(t.median_ms for t in default_trials), "tuned": best.median_ms}
        flops = kernel.flops(shape) if kernel.flops else None
        rows.append({
            "kernel": name, "shape": key, "preset": preset_of(name, shape), "tuned_config": best.config,
            "default_config": default, "trials_ok": len(ok), "gpu": best.gpu_name, "bytes": kernel.bytes_moved(shape),
            "flops": flops, "ms": ms, "graph_ms": {},
            "tflops": {v: flops / (t * 1e-3) / 1e12 for v, t in ms.items()} if flops else {},
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("out")
    parser.add_argument("--sweeps", required=True, help="comma-separated sweep ids")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--copy-gbps", type=float, required=True)
    parser.add_argument("--copy-source", required=True, help="where the copy bandwidth was measured")
    args = parser.parse_args()
    ids = [int(s) for s in args.sweeps.split(",")]
    with session_scope(open_database(f"sqlite:///{args.db}")) as session:
        trials = list(session.scalars(select(Trial).where(Trial.sweep_id.in_(ids))))
        rows = rows_of(trials, args.arch)
    Path(args.out).write_text(json.dumps({"source": f"sweeps {ids} of {args.db}", "copy_gbps": args.copy_gbps,
                                          "copy_source": args.copy_source, "rows": rows}, indent=1))
    print(f"{len(rows)} rows from {len(trials)} trials of sweeps {ids}")


if __name__ == "__main__":
    main()
