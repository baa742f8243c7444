"""Markdown tables of the attention kernels' H200 results (bench/kernels_h200.py output), Primus-style.

One row per (model, layer type, sequence), forward and backward: ``ms | TFLOP/s`` of the heuristic
default, the swept config and the eager reference, and swept over default measured in the same
run. FLOPs follow FlashMLA's convention (``kernels/sparse_attention.py``). Compressor and indexer
rows give the time against their floor: bytes moved at the copy bandwidth measured in the same
run, or for the indexer the larger of that and its FLOPs at the bf16 dense-GEMM rate measured on
this machine (``--gemm-tflops``, default 750, bench/2026-11-29 notes: 700-790); and, for the
graph-timed compressor, against a copy of its own bytes timed in the same run (results from
2026-12-02c on).

Usage: python bench/attention_summary.py RESULT_JSON... [--gemm-tflops 750] > summary.md
(several runs: each launch's row from the last file that has it; the compressor and indexer floors
use the last file's copy bandwidth)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from kernels import registry

LAYER_TYPES = {0: "window", 4: "CSA", 128: "HCA"}


def _cell(row: dict, variant: str) -> str:
    ms = row["ms"].get(variant)
    tflops = row.get("tflops", {}).get(variant)
    return f"{ms:.3f} \\| {tflops:.0f}" if ms is not None and tflops is not None else "-"


def attention_table(rows: list[dict]) -> tuple[list[str], dict[int, list[float]]]:
    """Table lines and, per sequence length, the swept/default speedups of the cells with a swept config."""
    by_shape: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["kernel"] in ("sparse_attn_fwd", "sparse_attn_bwd"):
            shape = registry.parse_shape_key(r["shape"])
            key = (r["preset"], LAYER_TYPES[shape["ratio"]], shape["seq"])
            by_shape.setdefault(key, {})["fwd" if r["kernel"].endswith("fwd") else "bwd"] = r
    lines = ["| model | layer | seq | fwd default | fwd swept | fwd eager | fwd x | bwd default | bwd swept "
             "| bwd eager | bwd x |", "|" + "---|" * 11]
    speedups: dict[int, list[float]] = {}
    for (preset, layer, seq), directions in sorted(by_shape.items()):
        cells = []
        for direction in ("fwd", "bwd"):
            r = directions.get(direction)
            if r is None:
                cells += ["-"] * 4
                continue
            x = r["ms"]["default"] / r["ms"]["tuned"] if "tuned" in r["ms"] else None
            if x is not None:
                speedups.setdefault(seq, []).append(x)
            cells += [_cell(r, "default"), _cell(r, "tuned"), _cell(r, "eager"), f"{x:.2f}" if x else "-"]
        lines.append(f"| {preset} | {layer} | {seq} | " + " | ".join(cells) + " |")
    return lines, speedups


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def floor_table(rows: list[dict], copy_gbps: float, gemm_tflops: float) -> list[str]:
    """Each compressor and indexer launch against its floor (bytes at the copy bandwidth, or FLOPs at
    ``gemm_tflops``) and, where the run timed one, against a device copy of its own bytes, which
    adds the launch ramp and tail that a microsecond kernel cannot avoid either."""
    lines = ["| launch | shape | floor ms | same-size copy ms | default ms | swept ms | swept / floor | swept / copy |",
             "|" + "---|" * 8]
    for r in rows:
        if r["kernel"] not in ("compressor_fwd", "compressor_bwd", "indexer_fwd"):
            continue
        floor = r["bytes"] / (copy_gbps * 1e9) * 1e3
        if r["flops"]:
            floor = max(floor, r["flops"] / (gemm_tflops * 1e12) * 1e3)
        ms = r["graph_ms"] or r["ms"]
        best, note = (ms["tuned"], "") if "tuned" in ms else (ms["default"], " (default)")
        copy = ms.get("same_size_copy")
        cells = [r["kernel"], r["shape"], f"{floor:.4f}", "-" if copy is None else f"{copy:.4f}",
                 f"{ms['default']:.4f}", f"{ms['tuned']:.4f}" if "tuned" in ms else "-",
                 f"{best / floor:.2f}{note}", "-" if copy is None else f"{best / copy:.2f}{note}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("result", nargs="+", help="bench results; a later file's row of a launch replaces an earlier's")
    parser.add_argument("--gemm-tflops", type=float, default=750.0)
    args = parser.parse_args()
    reports = [json.loads(Path(path).read_text()) for path in args.result]
    report = {"rows": list({(r["kernel"], r["shape"]): r for rep in reports for r in rep["rows"]}.values()),
              "copy_gbps": reports[-1]["copy_gbps"]}
    lines, speedups = attention_table(report["rows"])
    print("### Sparse attention (`ms | TFLOP/s`)\n")
    print("\n".join(lines))
    every = [x for xs in speedups.values() for x in xs]
    if every:
        print(f"\nSwept over default, geometric mean over {len(every)} cells: {_geomean(every):.3f}x", end="")
        print("".join(f"; at sequence {seq}, over {len(xs)} cells: {_geomean(xs):.3f}x"
                      for seq, xs in sorted(speedups.items())) + ".")
    print("\n### Compressor and indexer against their floor\n")
    print("\n".join(floor_table(report["rows"], report["copy_gbps"], args.gemm_tflops)))


if __name__ == "__main__":
    main()
