"""A markdown table of what bounds each profiled kernel, from the raw Nsight Compute CSVs that
``bench/h200_ncu.sh`` writes (one per launch, beside its ``.launch.json``).

Per kernel that takes at least 1% of its launch's time: duration; registers, shared memory and
the resource that caps resident blocks; theoretical and achieved occupancy; issue-slot
utilisation and a warp's cycles per issued instruction; tensor pipe, L1, L2 and DRAM
utilisation; spill instructions; and the three largest warp-stall reasons (cycles a warp spends
stalled per issued instruction, the counters' own unit).

Usage: python bench/ncu_summary.py NCU_DIR [OUT_MD]
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

MIN_SHARE = 0.01
DURATION = "gpu__time_duration.sum"
US_PER = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
MMA_FLOOR = 0.1  # % of the pipe's peak under which a kernel is taken to run no such MMAs (counter noise)
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
LIMITS = ("registers", "shared_mem", "warps", "blocks")
METRICS = {  # column -> ncu metric (percentages of the peak but for cycles/issue)
    "theor. occ %": "sm__maximum_warps_per_active_cycle_pct",
    "achieved occ %": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue %": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "cycles/issue": "smsp__average_warp_latency_per_inst_issued.ratio",  # a warp's, stalls included
    "tensor %": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "L1 %": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "L2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM %": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
}


def number(text: str) -> float:
    """An ncu cell as a float ("1,234.5" -> 1234.5; "no data" or "" -> 0)."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernel_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's kernels as {metric: cell}, in launch order, durations in µs (ncu picks the
    duration's unit per report; the second line holds the units)."""
    with path.open() as f:
        lines = list(csv.reader(f))
    header, units = lines[0], lines[1]
    unit = units[header.index(DURATION)]
    if unit not in US_PER:
        raise ValueError(f"{path}: {DURATION} is in {unit!r}, not one of {sorted(US_PER)}")
    rows = []
    for cells in lines[2:]:
        row = dict(zip(header, cells))
        row[DURATION] = str(number(row[DURATION]) * US_PER[unit])
        rows.append(row)
    return rows


def mma_kind(row: dict[str, str]) -> str:
    """Which tensor instructions ran: wgmma (gmma), mma.sync (hmma), both or none."""
    gmma = number(row.get("sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active", "0")) > MMA_FLOOR
    hmma = number(row.get("sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active", "0")) > MMA_FLOOR
    return {(True, True): "both", (True, False): "wgmma", (False, True): "mma.sync"}.get((gmma, hmma), "-")


def block_limit(row: dict[str, str]) -> str:
    """Resident blocks per SM and what caps them (ties named together)."""
    limits = {name: number(row[f"launch__occupancy_limit_{name}"]) for name in LIMITS}
    least = min(limits.values())
    return f"{least:.0f} ({'+'.join(n for n, v in limits.items() if v == least)})"


def top_stalls(row: dict[str, str], count: int = 3) -> str:
    stalls = {m.group(1): number(v) for k, v in row.items() if (m := STALL.fullmatch(k))}
    stalls.pop("selected", None)  # the issuing cycle itself, not a stall
    best = sorted(stalls.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{name} {value:.1f}" for name, value in best)


def kernel_name(row: dict[str, str]) -> str:
    """The kernel's function name, without its namespace, template and argument list."""
    name = row["Kernel Name"].removeprefix("void ").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    return re.split(r"[<(]", name)[0]


def summary(folder: Path) -> str:
    head = ["launch", "kernel", "µs", "regs", "smem KB", "blocks/SM (cap)", *METRICS, "MMA", "spill inst", "top stalls"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for path in sorted(folder.glob("*.csv")):
        launch = json.loads(path.with_suffix(".launch.json").read_text())
        rows = kernel_rows(path)
        total = sum(number(r[DURATION]) for r in rows)
        label = f"{launch['kernel']} {launch['variant']} `{launch['shape']}`"
        for row in rows:
            us = number(row[DURATION])
            if us < MIN_SHARE * total:
                continue
            cells = [label, kernel_name(row), f"{us:.1f}", row["launch__registers_per_thread"],
                     f"{number(row['launch__shared_mem_per_block']):.1f}", block_limit(row),
                     *(f"{number(row[m]):.1f}" for m in METRICS.values()), mma_kind(row),
                     f"{number(row['sass__inst_executed_register_spilling']):,.0f}", top_stalls(row)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) not in (2, 3):
        print(__doc__.split("Usage: ")[1], file=sys.stderr, end="")
        sys.exit(2)
    try:
        text = summary(Path(sys.argv[1]))
    except (OSError, ValueError, KeyError) as error:  # a missing .launch.json, an unknown unit, a CSV without a metric
        print(f"NCU_DIR: {error}", file=sys.stderr)
        sys.exit(2)
    if len(sys.argv) == 3:
        Path(sys.argv[2]).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
