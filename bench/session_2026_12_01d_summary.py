"""The per-form figures of the 2026-12-01 evening H200 write-up, from its committed sweep trials.

For each sweep group, per shape, the fastest ``ok`` trial (re-timed where the sweep re-timed it)
for each value of the tunable the group compares: the transposed forms against the old ones, the
indexer's key tiles, its selection's rows and warps, and every config of the sequence-8,192
backward grid. Bench-derived figures come from ``attention_summary.py`` and
``block_kernels_summary.py`` instead.

Usage: python bench/session_2026_12_01d_summary.py [RESULTS_DIR]  (prints markdown)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "2026-12-01-h200-c"
# (trials file, kernel, the tunable compared)
COMPARISONS = [
    ("sweep-trials-transposed-and-key-tiles.csv", "sparse_attn_bwd", "DE_TRANSPOSED"),
    ("sweep-trials-transposed-and-key-tiles.csv", "mhc_glue_bwd", "DFN_TRANSPOSED"),
    ("sweep-trials-transposed-and-key-tiles.csv", "indexer_fwd", "KEY_TILES"),
    ("sweep-trials-wide-glue-and-select.csv", "mhc_glue_bwd", "SLABS"),
    ("sweep-trials-wide-glue-and-select.csv", "indexer_fwd", "SELECT_ROWS"),
    ("sweep-trials-wide-glue-and-select.csv", "indexer_fwd", "SELECT_WARPS"),
]
TILING = ("BLOCK_H", "TILE_K", "BLOCK_N", "BLOCK_K", "BLOCK_S", "BLOCK_T", "num_warps", "num_stages")


def _ok_trials(path: Path, kernel: str) -> list[tuple[str, float, dict]]:
    """(shape, ms, config) of the kernel's ok trials, re-timed ms where there is one."""
    with path.open() as f:
        return [(r["shape_key"], float(r["retime_ms"] or r["median_ms"]), json.loads(r["config"]))
                for r in csv.DictReader(f) if r["kernel"] == kernel and r["status"] == "ok"]


def _tiling(config: dict) -> str:
    return " ".join(f"{k}={config[k]}" for k in TILING if k in config)


def best_per_value(path: Path, kernel: str, tunable: str) -> list[str]:
    """A table: per shape, the fastest trial at each value of ``tunable``, with its tiling."""
    best: dict[str, dict] = {}
    for shape, ms, config in _ok_trials(path, kernel):
        value = config.get(tunable)
        if value not in best.setdefault(shape, {}) or ms < best[shape][value][0]:
            best[shape][value] = (ms, config)
    lines = [f"### {kernel}: fastest trial per {tunable} ({path.name})", "",
             "| shape | " + tunable + " | ms | tiling |", "|---|---|---|---|"]
    for shape in sorted(best):
        for value, (ms, config) in sorted(best[shape].items(), key=lambda item: item[1][0]):
            lines.append(f"| {shape} | {value} | {ms:.4f} | {_tiling(config)} |")
    return lines + [""]


def every_trial(path: Path, kernel: str) -> list[str]:
    """A table of every ok trial, fastest first per shape."""
    lines = [f"### {kernel}: every ok trial ({path.name})", "", "| shape | ms | tiling | transposed |",
             "|---|---|---|---|"]
    for shape, ms, config in sorted(_ok_trials(path, kernel), key=lambda t: (t[0], t[1])):
        lines.append(f"| {shape} | {ms:.3f} | {_tiling(config)} | {config.get('DE_TRANSPOSED')} |")
    return lines + [""]


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    lines = ["# 2026-12-01 evening H200 sweeps: per-form bests", ""]
    for name, kernel, tunable in COMPARISONS:
        lines += best_per_value(results / name, kernel, tunable)
    lines += every_trial(results / "sweep-trials-attention-bwd-8192.csv", "sparse_attn_bwd")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
