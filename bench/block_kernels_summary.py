"""Markdown tables of the block kernels' H200 results (bench/kernels_h200.py output), per kernel family.

Expert GEMMs: TFLOP/s of the heuristic default, the swept config, and the peers, with the
project kernel's best (default or swept) as a share of ``torch._grouped_mm``. Memory-bound
kernels: share of the copy bandwidth measured in the same run (CUDA-graph device time where
measured, else events). Speedups are tuned over default, measured in the same run.

Usage: python bench/block_kernels_summary.py RESULT_JSON [RESULT_JSON ...] > summary.md
(a row of a later file replaces the same kernel and shape of an earlier one)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _short(shape_key: str) -> str:
    return shape_key.replace("tokens=", "T=").replace("experts=", "E=").replace("hidden=", "D=").replace(
        "ffn=", "F=").replace(",", " ")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def gemm_table(rows: list[dict]) -> list[str]:
    lines = ["| launch | shape | default | swept | `_grouped_mm` | `_grouped_mm` + eager epilogue | cuBLAS loop + epilogue "
             "| best ours / `_grouped_mm` | swept / default |", "|" + "---|" * 9]
    for r in rows:
        t = r["tflops"]
        ours = max(t["default"], t.get("tuned", 0.0))
        peer = t.get("grouped_mm")
        lines.append(
            f"| {r['kernel']} | {_short(r['shape'])} | {t['default']:.0f} | {t.get('tuned', float('nan')):.0f} "
            f"| {peer or float('nan'):.0f} | {t.get('grouped_mm+epilogue', float('nan')):.0f} "
            f"| {t.get('cublas_loop', float('nan')):.0f} | {100 * ours / peer if peer else float('nan'):.0f}% "
            f"| {r['ms']['default'] / r['ms']['tuned'] if 'tuned' in r['ms'] else float('nan'):.2f} |")
    return lines


def memory_table(rows: list[dict]) -> list[str]:
    lines = ["| launch | shape | timing | default % copy | swept % copy | eager % copy | swept / default |",
             "|" + "---|" * 7]
    for r in rows:
        timing, pct, ms = ("graph", r["graph_pct_of_copy"], r["graph_ms"]) if r["graph_ms"] else (
            "events", r["pct_of_copy"], r["ms"])
        lines.append(f"| {r['kernel']} | {_short(r['shape'])} | {timing} | {pct['default']:.0f}% "
                     f"| {pct.get('tuned', float('nan')):.0f}% | {pct.get('eager', float('nan')):.1f}% "
                     f"| {ms['default'] / ms['tuned'] if 'tuned' in ms else float('nan'):.2f} |")
    return lines


def main() -> None:
    latest: dict[tuple[str, str], dict] = {}  # a later file's row replaces an earlier one's
    for path in sys.argv[1:]:
        for row in json.loads(Path(path).read_text())["rows"]:
            latest[row["kernel"], row["shape"]] = row
    rows = list(latest.values())
    gemms = [r for r in rows if r["flops"] and r["kernel"].startswith("expert_")]
    others = [r for r in rows if r not in gemms]
    speedups = [r["ms"]["default"] / r["ms"]["tuned"] for r in rows if "tuned" in r["ms"]]
    failed = [(r["kernel"], r["shape"], v, p) for r in rows for v, p in r["parity"].items() if p != "ok"]
    print("### Expert GEMMs (TFLOP/s)\n")
    print("\n".join(gemm_table(gemms)))
    print("\n### Memory-bound kernels (share of the measured copy bandwidth)\n")
    print("\n".join(memory_table(others)))
    print(f"\nSwept over default, geometric mean over the {len(speedups)} cells with a swept config: "
          f"{_geomean(speedups):.3f}x (min {min(speedups):.2f}x, max {max(speedups):.2f}x).")
    print(f"Full-size parity failures against the eager reference: {failed or 'none'}.")


if __name__ == "__main__":
    main()
