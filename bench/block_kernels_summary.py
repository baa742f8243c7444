"""Markdown tables of the block kernels' H200 results (bench/kernels_h200.py output), per kernel family.

Expert GEMMs: TFLOP/s of the heuristic default, the swept config, and the peers, with the
project kernel's best (default or swept) as a share of ``torch._grouped_mm``. Memory-bound
kernels: share of the copy bandwidth measured in the same run. Speedups are tuned over default,
measured in the same run (CUDA-graph device time where measured, else events).

With ``--table``, each row says whether the swept config it timed is the committed table's entry
(and from which sweep), and the geomeans are split accordingly: a benchmark run with a table
exported without skips times entries that the committed table leaves out. ``--pre-fix-sweep N``
counts committed entries of sweep N apart (a sweep that ran before a fix of the sweep service).

Usage: python bench/block_kernels_summary.py [--table kernels/tables/sm_90.json [--pre-fix-sweep N ...]]
       [--skip-kernel K ...] RESULT_JSON [RESULT_JSON ...] > summary.md
(a row of a later file replaces the same kernel and shape of an earlier one)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

NOT_IN_TABLE = "not in table"


def _short(shape_key: str) -> str:
    return shape_key.replace("tokens=", "T=").replace("experts=", "E=").replace("hidden=", "D=").replace(
        "ffn=", "F=").replace(",", " ")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _speedup(r: dict) -> float:
    ms = r["graph_ms"] or r["ms"]
    return ms["default"] / ms["tuned"] if "tuned" in ms else float("nan")


def committed_entry(row: dict, entries: dict) -> dict | None:
    """The committed table's entry for the row's cell if it is the swept config the row timed."""
    entry = entries.get(row["kernel"], {}).get(row["shape"])
    return entry if entry and "tuned" in row["ms"] and entry["config"] == row["tuned_config"] else None


def table_mark(row: dict, entries: dict, pre_fix: set[int] = frozenset()) -> str:
    """``sweep N`` (``sweep N, pre-fix`` for a sweep in ``pre_fix``) if the swept config the row
    timed is the committed entry, else NOT_IN_TABLE; ``-`` for a row without a swept config."""
    if "tuned" not in row["ms"]:
        return "-"
    entry = committed_entry(row, entries)
    if entry is None:
        return NOT_IN_TABLE
    return f"sweep {entry['sweep_id']}" + (", pre-fix" if entry["sweep_id"] in pre_fix else "")


def _with_mark(header: str, cells: list[str], rows: list[dict], entries: dict | None, pre_fix: set[int]
               ) -> list[str]:
    """The table, with a 'committed entry' column when a table was given."""
    cols = header.count("|") - 1 + (entries is not None)
    lines = [header + (" committed entry |" if entries is not None else ""), "|" + "---|" * cols]
    for cell, r in zip(cells, rows):
        lines.append(cell + (f" {table_mark(r, entries, pre_fix)} |" if entries is not None else ""))
    return lines


def gemm_table(rows: list[dict], entries: dict | None = None, pre_fix: set[int] = frozenset()) -> list[str]:
    cells = []
    for r in rows:
        t = r["tflops"]
        ours = max(t["default"], t.get("tuned", 0.0))
        peer = t.get("grouped_mm")
        cells.append(
            f"| {r['kernel']} | {_short(r['shape'])} | {t['default']:.0f} | {t.get('tuned', float('nan')):.0f} "
            f"| {peer or float('nan'):.0f} | {t.get('grouped_mm+epilogue', float('nan')):.0f} "
            f"| {t.get('cublas_loop', float('nan')):.0f} | {100 * ours / peer if peer else float('nan'):.0f}% "
            f"| {_speedup(r):.2f} |")
    return _with_mark("| launch | shape | default | swept | `_grouped_mm` | `_grouped_mm` + eager epilogue "
                      "| cuBLAS loop + epilogue | best ours / `_grouped_mm` | swept / default |", cells, rows, entries,
                     pre_fix)


def memory_table(rows: list[dict], entries: dict | None = None, pre_fix: set[int] = frozenset()) -> list[str]:
    """% of the copy bandwidth per variant; benchmarks that also timed a copy of each launch's own
    bytes get its column, the ceiling at that size."""
    pcts = [("graph", r["graph_pct_of_copy"]) if r["graph_ms"] else ("events", r["pct_of_copy"]) for r in rows]
    same_size = any("same_size_copy" in pct for _, pct in pcts)
    cells = []
    for r, (timing, pct) in zip(rows, pcts):
        copy_cell = (f" {pct['same_size_copy']:.0f}% |" if "same_size_copy" in pct else " - |") if same_size else ""
        cells.append(f"| {r['kernel']} | {_short(r['shape'])} | {timing} | {pct['default']:.0f}% "
                     f"| {pct.get('tuned', float('nan')):.0f}% | {pct.get('eager', float('nan')):.1f}% |{copy_cell}"
                     f" {_speedup(r):.2f} |")
    header = ("| launch | shape | timing | default % copy | swept % copy | eager % copy |"
              + (" same-size copy % copy |" if same_size else "") + " swept / default |")
    return _with_mark(header, cells, rows, entries, pre_fix)


def _geomean_line(label: str, rows: list[dict]) -> str:
    s = [_speedup(r) for r in rows]
    if not s:
        return f"{label}: no cells."
    return f"{label}, over {len(s)} cells: {_geomean(s):.3f}x (min {min(s):.2f}x, max {max(s):.2f}x)."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench/kernels_h200.py output files")
    parser.add_argument("--table", type=Path, help="the committed tuned table, to mark which swept configs it holds")
    parser.add_argument("--pre-fix-sweep", type=int, action="append", default=[], metavar="N",
                        help="with --table: count committed entries of sweep N apart (repeatable)")
    parser.add_argument("--skip-kernel", action="append", default=[], metavar="K",
                        help="leave launch K's rows out, e.g. the attention rows of a mixed run (repeatable)")
    args = parser.parse_args()
    if args.pre_fix_sweep and not args.table:
        parser.error("--pre-fix-sweep needs --table")
    pre_fix = set(args.pre_fix_sweep)
    entries = json.loads(args.table.read_text())["entries"] if args.table else None
    every_row = [row for path in args.results for row in json.loads(path.read_text())["rows"]]
    unknown = sorted(set(args.skip_kernel) - {row["kernel"] for row in every_row})
    if unknown:
        parser.error(f"--skip-kernel: no rows of {unknown} in the result files")
    latest: dict[tuple[str, str], dict] = {}  # a later file's row replaces an earlier one's
    for row in every_row:
        if row["kernel"] not in args.skip_kernel:
            latest[row["kernel"], row["shape"]] = row
    rows = list(latest.values())
    gemms = [r for r in rows if r["flops"] and r["kernel"].startswith("expert_")]
    others = [r for r in rows if r not in gemms]
    swept = [r for r in rows if "tuned" in r["ms"]]
    failed = [(r["kernel"], r["shape"], v, p) for r in rows for v, p in r["parity"].items() if p != "ok"]
    if gemms:
        print("### Expert GEMMs (TFLOP/s)\n")
        print("\n".join(gemm_table(gemms, entries, pre_fix)) + "\n")
    if others:
        print("### Memory-bound kernels (share of the measured copy bandwidth)\n")
        print("\n".join(memory_table(others, entries, pre_fix)) + "\n")
    print(_geomean_line("Swept over default, geometric mean of every cell with a swept config", swept))
    if len(swept) < len(rows):  # cells a target over all cells counts too: they run the default
        unswept = [r for r in rows if r not in swept]
        counts = ", ".join(f"`{k}` {sum(r['kernel'] == k for r in unswept)}"
                           for k in dict.fromkeys(r["kernel"] for r in unswept))
        every = [_speedup(r) if r in swept else 1.0 for r in rows]
        print(f"Over every cell, one without a swept config counted at 1.00x (it runs the default; {counts}), "
              f"over {len(every)} cells: {_geomean(every):.3f}x.")
    if entries is not None:
        held = [r for r in swept if committed_entry(r, entries)]
        pre = [r for r in held if committed_entry(r, entries)["sweep_id"] in pre_fix]
        print(_geomean_line("- cells whose swept config is the committed table's entry" + (
            ", from a sweep not listed as pre-fix" if pre_fix else ""), [r for r in held if r not in pre]))
        if pre_fix:
            print(_geomean_line("- cells whose swept config is the committed entry of a pre-fix sweep", pre))
        print(_geomean_line("- cells whose swept config the committed table does not hold (it runs the default "
                            "there)", [r for r in swept if r not in held]))
    for kernel in dict.fromkeys(r["kernel"] for r in swept):
        print(_geomean_line(f"- `{kernel}`", [r for r in swept if r["kernel"] == kernel]))
    print(f"\nFull-size parity failures against the eager reference: {failed or 'none'}.")


if __name__ == "__main__":
    main()
