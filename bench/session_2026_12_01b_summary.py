"""The derived figures of bench/2026-12-01-h200-gather-glue-rope-router.md, from its committed raw results.

Prints, as markdown:
1. the sparse-attention gather variants (``gather-variants.json``), and the Flash CSA forward of
   the reverted one-table kernel against the morning's benchmark of the project kernel;
2. the glue forward's best sweep device time per shape: the morning's sweep, the fn-split TPE
   sweep (call 3), the 4,096-token grid (call 4);
3. the glue forward's launches (``glue-launches*.json``): the whole forward and the projection
   kernel as a share of the copy bandwidth;
4. the glue backward against the 2026-11-30 benchmark (two runs);
5. the router's time growth from 4,096 to 16,384 tokens (CUDA-graph device time, tuned).

Usage: python bench/session_2026_12_01b_summary.py [RESULTS_DIR]  (default bench/results/2026-12-01-h200-b)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from session_2026_12_01_summary import _best, _ok_trials  # bench/ is the script directory

BENCH = Path(__file__).resolve().parent
MORNING = BENCH / "results" / "2026-12-01-h200"
BLOCK_BEFORE = BENCH / "results" / "2026-11-30-h200-block-kernels-memory.json"
FLASH_CSA = "batch=1,seq=4096,heads=64,ratio=4,topk=512,window=128"


def _rows(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data["rows"] if isinstance(data, dict) else data


def gather_variants(results: Path) -> list[str]:
    by_config: dict[tuple, dict] = defaultdict(dict)
    for r in _rows(results / "gather-variants.json"):
        by_config[tuple(r["config"])][r["variant"]] = r
    lines = ["| config (BLOCK_H, TILE_K, warps, stages) | " + " | ".join(
        f"{v} ms | TFLOP/s | regs/spills | shared KiB" for v in ("two bases", "one table, masked", "unpredicated")) + " |",
        "|---|" + "---|" * 12]
    for config, variants in by_config.items():
        cells = [f"{r['ms']:.3f} | {r['tflops']:.0f} | {r['n_regs']}/{r['n_spills']} | {r['shared'] / 1024:.0f}"
                 for r in (variants["old_two_bases"], variants["table_masked"], variants["table_unmasked"])]
        lines.append(f"| {', '.join(map(str, config))} | " + " | ".join(cells) + " |")
    table = {r["shape"]: r for r in _rows(results / "attention-bench-entry-table.json") if r["kernel"] == "sparse_attn_fwd"}
    morning = {r["shape"]: r for r in _rows(MORNING / "attention-bench.json") if r["kernel"] == "sparse_attn_fwd"}
    lines.append(f"\nFlash CSA forward, tuned: project kernel {morning[FLASH_CSA]['ms']['tuned']:.3f} ms (morning), "
                 f"one-table kernel {table[FLASH_CSA]['ms']['tuned']:.3f} ms (call 1)")
    return lines


def glue_forward_sweeps(results: Path) -> list[str]:
    sources = {"morning": MORNING / "glue-and-bwd-sweep-trials.csv",
               "fn split, TPE (call 3)": results / "glue-rope-router-sweep-trials.csv.gz",
               "4,096-token grid (call 4)": results / "glue-4096-sweep-trials.csv"}
    best = {name: {} for name in sources}
    for name, path in sources.items():
        trials = [t for t in _ok_trials(path) if t["kernel"] == "mhc_glue_fwd"]
        for shape in {t["shape_key"] for t in trials}:
            best[name][shape] = _best(t for t in trials if t["shape_key"] == shape)
    lines = ["| shape | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
    for shape in sorted(best["morning"], key=lambda k: (len(k), k)):
        cells = []
        for name in sources:
            t = best[name].get(shape)
            cells.append("-" if t is None else f"{t['median_ms']:.4f} ms ({json.dumps(t['config'], sort_keys=True)})")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return lines


def glue_launches(results: Path) -> list[str]:
    lines = ["| profile | shape | whole forward µs | % of copy | projection µs | % of copy | other launches µs |",
             "|---|---|---|---|---|---|---|"]
    for name in ("glue-launches.json", "glue-launches-one-split.json"):
        data = json.loads((results / name).read_text())
        for r in data["rows"]:
            whole = r["sum_of_launches_ms"]
            project = next(v["median_ms"] for n, v in r["launches"].items() if "glue_fwd_kernel" in n)
            lines.append(f"| {name} | {r['shape']} | {whole * 1e3:.1f} | "
                         f"{100 * r['h_bytes'] / whole / 1e6 / data['copy_gbps']:.1f}% | {project * 1e3:.1f} | "
                         f"{r['projection_pct_of_copy_reading_h']:.1f}% | {(whole - project) * 1e3:.1f} |")
    return lines


def glue_backward(results: Path) -> list[str]:
    before = {r["shape"]: r for r in _rows(BLOCK_BEFORE) if r["kernel"] == "mhc_glue_bwd"}
    lines = ["| shape | 2026-11-30 default ms | 2026-11-30 tuned ms | default ms | tuned ms | tuned % of copy | "
             "old tuned / new tuned | new default / old default |", "|---|---|---|---|---|---|---|---|"]
    for r in _rows(results / "glue-bwd-bench.json"):
        old = before[r["shape"]]
        lines.append(f"| {r['shape']} | {old['ms']['default']:.4f} | {old['ms']['tuned']:.4f} | "
                     f"{r['ms']['default']:.4f} | {r['ms']['tuned']:.4f} | {r['pct_of_copy']['tuned']:.0f}% | "
                     f"{old['ms']['tuned'] / r['ms']['tuned']:.2f} | {old['ms']['default'] / r['ms']['default']:.2f} |")
    return lines


def router_growth(results: Path) -> list[str]:
    rows = {(r["kernel"], r["shape"]): r for r in _rows(results / "glue-rope-router-bench.json")}
    lines = ["| launch | experts | tuned µs at 4,096 | at 16,384 | ratio |", "|---|---|---|---|---|"]
    for kernel in ("router_fwd", "router_bwd", "router_hash_fwd"):
        for experts in (256, 384):
            small, large = (rows[(kernel, f"tokens={t},experts={experts},topk=6")]["graph_ms"]["tuned"]
                            for t in (4096, 16384))
            lines.append(f"| {kernel} | {experts} | {small * 1e3:.1f} | {large * 1e3:.1f} | {large / small:.2f} |")
    return lines


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else BENCH / "results" / "2026-12-01-h200-b"
    for title, lines in (("Sparse-attention gather variants, Flash CSA seq 4096", gather_variants(results)),
                         ("mHC glue forward, best sweep device time (CUDA graphs)", glue_forward_sweeps(results)),
                         ("mHC glue forward, device time per launch (profiler)", glue_launches(results)),
                         ("mHC glue backward, events (two runs)", glue_backward(results)),
                         ("Router, tuned device time against the tokens", router_growth(results))):
        print(f"## {title}\n")
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
