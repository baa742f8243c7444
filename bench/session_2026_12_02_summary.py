"""The figures of the 2026-12-02 H200 write-up that no other summary script prints, from its
committed raw results: the glue backward before and after its closing sums kernel (call 1's
bench against call 4's), the glue forward by events and by graph replay, the per-value bests of
the indexer-select and glue-bwd-slabs sweeps, and the Flash CSA backward's best trial per
(num_warps, maxnreg) over every committed attention sweep. The ncu table comes from
``ncu_summary.py``, the geomean from ``block_kernels_summary.py``, the indexer's floor from
``attention_summary.py``.

Usage: python bench/session_2026_12_02_summary.py [RESULTS_DIR]  (prints markdown)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from session_2026_12_01d_summary import best_per_value  # a sibling script
from trials_csv import read_trials

BENCH = Path(__file__).parent
RESULTS = BENCH / "results" / "2026-12-02-h200"
FLASH_CSA_4096 = "batch=1,seq=4096,heads=64,ratio=4,topk=512,window=128"


def _rows(path: Path, kernel: str) -> dict[str, dict]:
    return {r["shape"]: r for r in json.loads(path.read_text())["rows"] if r["kernel"] == kernel}


def glue_bwd_before_after(results: Path) -> list[str]:
    before, after, again = (_rows(results / f"bench-run-{n}.json", "mhc_glue_bwd") for n in (1, 2, 3))
    lines = ["### mhc_glue_bwd, tuned, graph device time: call 1 (torch sums) against call 4 (sums kernel), "
             "and call 5 (after the re-sweep)", "",
             "| shape | before µs | after µs | speedup | % of copy before | after | default / tuned (call 4) | call 5 µs |",
             "|---|---|---|---|---|---|---|---|"]
    for shape, b in before.items():
        a = after[shape]
        tb, ta = b["graph_ms"]["tuned"] * 1e3, a["graph_ms"]["tuned"] * 1e3
        lines.append(f"| {shape} | {tb:.1f} | {ta:.1f} | {tb / ta:.2f} | {b['graph_pct_of_copy']['tuned']:.1f} | "
                     f"{a['graph_pct_of_copy']['tuned']:.1f} | {a['graph_ms']['default'] / a['graph_ms']['tuned']:.2f} | "
                     f"{again[shape]['graph_ms']['tuned'] * 1e3:.1f} |")
    return lines + [""]


def glue_fwd_timing_methods(results: Path) -> list[str]:
    lines = ["### mhc_glue_fwd (call 1): events against graph replay, µs", "",
             "| shape | default events | tuned events | default graph | tuned graph |", "|---|---|---|---|---|"]
    for shape, r in _rows(results / "bench-run-1.json", "mhc_glue_fwd").items():
        ms, graph = r["ms"], r["graph_ms"]
        lines.append(f"| {shape} | {ms['default'] * 1e3:.1f} | {ms['tuned'] * 1e3:.1f} | "
                     f"{graph['default'] * 1e3:.1f} | {graph['tuned'] * 1e3:.1f} |")
    return lines + [""]


def attention_bwd_forms(results_root: Path) -> list[str]:
    """The Flash CSA 4,096 backward's fastest trial per (num_warps, maxnreg), over every committed sweep."""
    best: dict[tuple, tuple[float, str]] = {}
    for path in sorted(results_root.glob("**/*sweep-trials*.csv*")):
        for r in read_trials(path):
            if r["kernel"] != "sparse_attn_bwd" or r["status"] != "ok" or r["shape_key"] != FLASH_CSA_4096:
                continue
            config = json.loads(r["config"])
            key = (config.get("num_warps"), config.get("maxnreg"))
            ms = float(r["median_ms"])
            if key not in best or ms < best[key][0]:
                best[key] = (ms, str(path.relative_to(results_root)))
    lines = [f"### sparse_attn_bwd at `{FLASH_CSA_4096}`: fastest trial per (num_warps, maxnreg)", "",
             "| num_warps | maxnreg | ms | trials file |", "|---|---|---|---|"]
    for (warps, maxnreg), (ms, path) in sorted(best.items(), key=lambda kv: kv[1][0]):
        lines.append(f"| {warps} | {maxnreg} | {ms:.3f} | {path} |")
    return lines + [""]


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    lines = ["# 2026-12-02 H200: per-session figures", ""]
    lines += glue_bwd_before_after(results) + glue_fwd_timing_methods(results)
    trials = results / "sweep-trials-select-and-slabs.csv"
    lines += best_per_value(trials, "indexer_fwd", "SELECT_WARPS") + best_per_value(trials, "mhc_glue_bwd", "SLABS")
    lines += best_per_value(results / "sweep-trials-glue-bwd-slabs-with-sums.csv", "mhc_glue_bwd", "SLABS")
    lines += attention_bwd_forms(results.parent)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
