"""The derived figures of bench/2026-12-01-h200-tma-and-triton-attention.md, from its committed raw results.

Prints, as markdown:
1. per shape, the best TMA config against the best pointer-load config of the TMA grid sweeps
   (screening medians, ``tma-sweep-trials.csv`` and ``glue-and-bwd-sweep-trials.csv``);
2. the mHC glue forward: best of the 2026-11-30 sweep, best today with SPLIT_K 1 and with any
   SPLIT_K, and today's best as a share of the copy bandwidth measured in the same call;
3. tuned over default, geomean: the sparse-attention cells at sequence 4,096
   (``attention-bench.json``) and every cell benchmarked with a tuned config in calls 4 and 6
   (graph timing where the benchmark has it, events otherwise).

Usage: python bench/session_2026_12_01_summary.py [RESULTS_DIR]  (default bench/results/2026-12-01-h200)
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

from trials_csv import read_trials  # bench/ is the script directory

BENCH = Path(__file__).resolve().parent
GLUE_BEFORE = BENCH / "results" / "2026-11-30-h200-block-sweep-trials.csv.gz"


def _ok_trials(path: Path) -> list[dict]:
    rows = [r for r in read_trials(path) if r["status"] == "ok"]
    for r in rows:
        r["config"], r["metrics"], r["median_ms"] = json.loads(r["config"]), json.loads(r["metrics"]), float(r["median_ms"])
    return rows


def _best(rows: Iterable[dict]) -> dict | None:
    return min(rows, key=lambda r: r["median_ms"], default=None)


def _geomean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def tma_against_pointers(trials: list[dict]) -> list[str]:
    lines = ["| launch | shape | best pointer ms | best TMA ms | pointer / TMA |", "|---|---|---|---|---|"]
    for kernel, shape in sorted({(r["kernel"], r["shape_key"]) for r in trials if "TMA" in r["config"]}):
        cell = [r for r in trials if (r["kernel"], r["shape_key"]) == (kernel, shape)]
        pointer, tma = (_best(r for r in cell if r["config"]["TMA"] == flag) for flag in (0, 1))
        lines.append(f"| {kernel} | {shape} | {pointer['median_ms']:.4f} | {tma['median_ms']:.4f} | "
                     f"{pointer['median_ms'] / tma['median_ms']:.3f} |")
    return lines


def glue_split(today: list[dict], before: list[dict], copy_gbps: float) -> list[str]:
    lines = ["| shape | 2026-11-30 best ms | SPLIT_K 1 best ms | best ms (SPLIT_K) | speed-up | % of copy |",
             "|---|---|---|---|---|---|"]
    glue = [r for r in today if r["kernel"] == "mhc_glue_fwd"]
    for shape in sorted({r["shape_key"] for r in glue}, key=lambda k: (len(k), k)):
        cell = [r for r in glue if r["shape_key"] == shape]
        old = _best(r for r in before if r["kernel"] == "mhc_glue_fwd" and r["shape_key"] == shape)
        whole, best = _best(r for r in cell if r["config"]["SPLIT_K"] == 1), _best(cell)
        lines.append(f"| {shape} | {old['median_ms']:.4f} | {whole['median_ms']:.4f} | {best['median_ms']:.4f} "
                     f"({best['config']['SPLIT_K']}) | {old['median_ms'] / best['median_ms']:.2f} | "
                     f"{100 * best['metrics']['gbps'] / copy_gbps:.0f}% |")
    return lines


def tuned_over_default(rows: list[dict]) -> list[float]:
    ratios = []
    for r in rows:
        if "tuned" in r["ms"]:
            times = r["graph_ms"] if "tuned" in r["graph_ms"] and "default" in r["graph_ms"] else r["ms"]
            ratios.append(times["default"] / times["tuned"])
    return ratios


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else BENCH / "results" / "2026-12-01-h200"
    tma, glue = _ok_trials(results / "tma-sweep-trials.csv"), _ok_trials(results / "glue-and-bwd-sweep-trials.csv")
    print("## Best TMA over best pointer config (screening medians)\n")
    print("\n".join(tma_against_pointers(tma + glue)))
    call6 = json.loads((results / "glue-and-bwd-gemm-bench.json").read_text())
    print("\n## mHC glue forward, sweep device time (CUDA graphs)\n")
    print("\n".join(glue_split(glue, _ok_trials(GLUE_BEFORE), call6["copy_gbps"])))
    attention = json.loads((results / "attention-bench.json").read_text())["rows"]
    at_4096 = tuned_over_default([r for r in attention if ",seq=4096," in r["shape"]])
    print(f"\nsparse attention, tuned / default at seq 4096: geomean {_geomean(at_4096):.3f} over {len(at_4096)} cells")
    rows = json.loads((results / "expert-gemm-tma-bench.json").read_text())["rows"] + call6["rows"]
    ratios = tuned_over_default(rows)
    print(f"calls 4 and 6, tuned / default: geomean {_geomean(ratios):.3f} over {len(ratios)} cells "
          f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
