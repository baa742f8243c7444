"""The figures of the 2026-12-02 (second session) H200 write-up that no other summary script prints,
from its committed raw results: the indexer's two kernels under Nsight Compute before (the first
2026-12-02 session) and after each change, the indexer bench before and after, and the per-value
bests of the sweeps that decided LATE_HEAD_SUM, RESCALE_SLACK and the forward's tile lengths. The
attention table and its geomeans come from ``attention_summary.py``, the ncu tables from
``ncu_summary.py``.

Usage: python bench/session_2026_12_02b_summary.py [RESULTS_DIR]  (prints markdown)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ncu_summary import DURATION, kernel_name, kernel_rows, number  # sibling scripts
from session_2026_12_01d_summary import best_per_value

BENCH = Path(__file__).parent
RESULTS = BENCH / "results" / "2026-12-02b-h200"
BEFORE = BENCH / "results" / "2026-12-02-h200"
INDEXER_4096 = "batch=1,seq=4096,topk=512"


def _indexer_ncu_times(folder: Path) -> dict[str, float]:
    """µs of each kernel of the tuned indexer launch at INDEXER_4096 among the ncu launches of ``folder``."""
    for path in sorted(folder.glob("*.csv")):
        launch = json.loads(path.with_suffix(".launch.json").read_text())
        if (launch["kernel"], launch["variant"], launch["shape"]) == ("indexer_fwd", "tuned", INDEXER_4096):
            return {kernel_name(row): number(row[DURATION]) for row in kernel_rows(path)}
    raise FileNotFoundError(f"{folder}: no tuned indexer_fwd launch at {INDEXER_4096}")


def indexer_kernels(results: Path) -> list[str]:
    steps = [("2026-12-02 (32 int64 bisection passes)", BEFORE / "ncu"),
             ("uint32 keys, early stop (call 1)", results / "ncu"),
             ("LATE_HEAD_SUM, re-swept (call 2)", results / "ncu-late-sum")]
    lines = [f"### indexer_fwd at `{INDEXER_4096}`, tuned: kernel durations under ncu, µs", "",
             "| step | scoring | selection | both |", "|---|---|---|---|"]
    for label, folder in steps:
        times = _indexer_ncu_times(folder)
        score, select = times["_score_kernel"], times["_select_kernel"]
        lines.append(f"| {label} | {score:.1f} | {select:.1f} | {score + select:.1f} |")
    return lines + [""]


def _indexer_rows(path: Path) -> dict[str, dict]:
    return {r["shape"]: r for r in json.loads(path.read_text())["rows"] if r["kernel"] == "indexer_fwd"}


def indexer_bench(results: Path) -> list[str]:
    runs = [("before", _indexer_rows(BEFORE / "bench-run-2.json")),
            ("call 1", _indexer_rows(results / "bench-run-1.json")),
            ("call 2", _indexer_rows(results / "bench-run-2.json"))]
    lines = ["### indexer_fwd bench, ms (default / tuned, each pair from one run)", "",
             "| shape | " + " | ".join(f"{name} default | {name} tuned" for name, _ in runs)
             + " | tuned, before / call 2 |",
             "|---|" + "---|---|" * len(runs) + "---|"]
    for shape in runs[0][1]:
        cells = " | ".join(f"{rows[shape]['ms']['default']:.4f} | {rows[shape]['ms']['tuned']:.4f}" for _, rows in runs)
        speedup = runs[0][1][shape]["ms"]["tuned"] / runs[-1][1][shape]["ms"]["tuned"]
        lines.append(f"| {shape} | {cells} | {speedup:.2f} |")
    return lines + [""]


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    lines = ["# 2026-12-02 (second session) H200: per-session figures", ""]
    try:
        lines += indexer_kernels(results) + indexer_bench(results)
        lines += best_per_value(results / "sweep-trials-indexer-late-sum.csv", "indexer_fwd", "LATE_HEAD_SUM")
        lines += best_per_value(results / "sweep-trials-attention-fwd-lazy.csv", "sparse_attn_fwd", "RESCALE_SLACK")
        lines += best_per_value(results / "sweep-trials-attention-fwd-lazy.csv", "sparse_attn_fwd", "TILE_K")
        lines += best_per_value(results / "sweep-trials-attention-fwd-hca.csv", "sparse_attn_fwd", "BLOCK_H")
    except (OSError, KeyError) as error:  # a results folder without this session's files
        print(f"RESULTS_DIR: {error}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
