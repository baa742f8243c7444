"""The figures of the 2026-12-01 CPU session's write-up, derived from committed results.

1. The MMA rate of the mHC glue, from the H200 times of 2026-12-01 (``bench/results/2026-12-01-h200-b``)
   and the MMAs the kernels issue per element of h (padded to the 32-row logit tile):
   forward, two bf16 products of the [tokens, 4D] x [4D, 32] projection (fn split in two, h exact);
   backward, three products for dx = d_proj @ fn at fp32 accuracy and two for dfn = d_proj^T @ h.
2. The sparse-attention backward at 16 against 32 heads a block, same config otherwise, in the
   2026-11-30 exhaustive grid: what halving the head blocks (each gathers every entry once and
   adds its gradient atomically) saved, in the kernel of that date.
3. Per launch variant, what its sm_90 compile (offline, Triton 3.6) holds, at one shape per probe.

Usage: python bench/session_2026_12_01c_summary.py [RESULTS_DIR]  (prints markdown)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from trials_csv import read_trials  # bench/ is the script directory

H200_RESULTS = Path(__file__).parent / "results" / "2026-12-01-h200-b"
OFFLINE_RESULTS = Path(__file__).parent / "results" / "2026-12-01-cpu-offline-resources"
ATTENTION_TRIALS = Path(__file__).parent / "results" / "2026-11-30-h200-attention" / "sweep-trials.csv.gz"
FLASH_CSA = "batch=1,seq=4096,heads=64,ratio=4,topk=512,window=128"
LOGIT_TILE = 32
MMA_PRODUCTS = {"forward": 2, "backward": 3 + 2}
BYTES_PER_ELEMENT = {"forward": 2, "backward": 4}  # h read; h read and dh written (bf16)


def _elements(shape_key: str) -> int:
    fields = dict(part.split("=") for part in shape_key.split(","))
    return int(fields["tokens"]) * 4 * int(fields["hidden"])


def glue_mma_rates(h200: Path) -> list[str]:
    """TFLOP/s of MMA each measured glue time means, and what 80% of the copy bandwidth needs."""
    launches = json.loads((h200 / "glue-launches-one-split.json").read_text())
    backward = json.loads((h200 / "glue-bwd-bench.json").read_text())
    copy_gbps = backward["copy_gbps"]
    lines = ["| direction | shape | timed | ms | MMA TFLOP/s | needed at 80% of copy |", "|---|---|---|---|---|---|"]

    def line(direction: str, shape: str, timed: str, ms: float) -> str:
        flop_per_element = 2 * LOGIT_TILE * MMA_PRODUCTS[direction]
        rate = _elements(shape) * flop_per_element / (ms * 1e-3) / 1e12
        needed = 0.8 * copy_gbps * 1e9 / BYTES_PER_ELEMENT[direction] * flop_per_element / 1e12
        return f"| {direction} | {shape} | {timed} | {ms:.4f} | {rate:.0f} | {needed:.0f} |"

    for row in launches["rows"]:
        ms = next(v["median_ms"] for name, v in row["launches"].items() if "glue_fwd_kernel" in name)
        lines.append(line("forward", row["shape"], "projection kernel, profiler", ms))
    for row in backward["rows"]:
        if row["kernel"] == "mhc_glue_bwd":
            lines.append(line("backward", row["shape"], "whole backward (3 launches), events, tuned", row["ms"]["tuned"]))
    return lines


# The shape each probe is shown at: V4-Flash's CSA layer, the glue at 4,096 tokens x 4,096, Flash's top-k.
PROBE_SHAPES = {"attention-bwd-transposed": "heads=64,ratio=4,", "glue-bwd-transposed": "tokens=4096,hidden=4096",
                "indexer-key-tiles": "topk=512"}


def variant_compiles(offline: Path) -> list[str]:
    """One line per (launch, variant) at each probe's shape, from the offline compiles."""
    lines = ["| launch (Triton kernel) | shape | variant | registers | spilled B | shared KiB | wgmma | mma.sync |",
             "|---|---|---|---|---|---|---|---|"]
    for probe, shape_text in PROBE_SHAPES.items():
        for r in json.loads((offline / f"{probe}.json").read_text())["rows"]:
            if shape_text not in r["shape"]:
                continue
            for fn, k in r["triton_kernels"].items():
                if fn.startswith("_select"):  # the indexer's selection: the same in every variant
                    continue
                lines.append(f"| {r['kernel']} ({fn}) | {r['shape']} | {r['variant']} | {k['n_regs']} "
                             f"| {k['spilled_bytes']} | {k['shared_bytes'] / 1024:.0f} | {k['hgmma']} | {k['hmma']} |")
    return lines


def head_block_effect(trials_csv: Path) -> list[str]:
    """The 2026-11-30 exhaustive grid of the backward at the Flash CSA shape: each config at 16 heads
    a block (4 blocks of V4-Flash's 64) beside the same config at 32 (2 blocks): time ratio."""
    times: dict[tuple, dict[int, float]] = {}
    for r in read_trials(trials_csv):
        if r["kernel"] != "sparse_attn_bwd" or r["status"] != "ok" or r["shape_key"] != FLASH_CSA:
            continue
        c = json.loads(r["config"])
        rest = tuple(sorted((k, str(v)) for k, v in c.items() if k != "BLOCK_H"))
        times.setdefault(rest, {})[c["BLOCK_H"]] = float(r["median_ms"])
    pairs = sorted((t[16] / t[32], t[16], t[32], dict(rest)) for rest, t in times.items() if {16, 32} <= set(t))
    best = min(pairs, key=lambda p: p[2])
    ratios = [p[0] for p in pairs]
    return [f"{len(pairs)} configs timed at both: 16 / 32 heads a block {min(ratios):.2f}-{max(ratios):.2f}x "
            f"(median {statistics.median(ratios):.2f}x); at the fastest 32-head config ({best[3]}): "
            f"{best[1]:.2f} -> {best[2]:.2f} ms."]


def main() -> None:
    offline = Path(sys.argv[1]) if len(sys.argv) > 1 else OFFLINE_RESULTS
    print("### mHC glue: MMA rate of the 2026-12-01 H200 times\n")
    print("\n".join(glue_mma_rates(H200_RESULTS)))
    print("\n### Sparse-attention backward: heads a block, the 2026-11-30 grid (Flash CSA)\n")
    print("\n".join(head_block_effect(ATTENTION_TRIALS)))
    print("\n### Launch variants compiled for sm_90 (offline, Triton 3.6)\n")
    print("\n".join(variant_compiles(offline)))


if __name__ == "__main__":
    main()
