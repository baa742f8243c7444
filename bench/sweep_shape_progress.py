"""Per shape of one sweep in a trials CSV: configs measured, pruned rows, the wall time from the
first trial's start to the last one's end, and the fastest screening median. Compares how two
runs of the same spec spent their time (e.g. before and after a sampler change).

Usage: python bench/sweep_shape_progress.py LABEL=TRIALS_CSV:SWEEP_ID [LABEL=TRIALS_CSV:SWEEP_ID ...]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from trials_csv import read_trials  # bench/ is the script directory


def rows_of(label: str, path: str, sweep_id: str) -> list[str]:
    by_shape: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in read_trials(path):
        if r["sweep_id"] == sweep_id:
            by_shape[r["shape_key"]].append(r)
    lines = []
    for shape, trials in by_shape.items():
        measured = [t for t in trials if t["status"] != "pruned"]
        starts = [datetime.fromisoformat(t["started_at"]) for t in measured if t["started_at"]]
        ends = [datetime.fromisoformat(t["finished_at"]) for t in measured if t["finished_at"]]
        ok = [float(t["median_ms"]) for t in trials if t["status"] == "ok"]
        wall = f"{(max(ends) - min(starts)).total_seconds():.1f}" if starts else "-"
        best = f"{min(ok):.4f}" if ok else "-"
        lines.append(f"| {label} | {shape} | {len(measured)} | {len(trials) - len(measured)} | {wall} | {best} |")
    return lines


def _run_of(arg: str) -> tuple[str, str, str]:
    """(label, trials CSV, sweep id) of one LABEL=TRIALS_CSV:SWEEP_ID argument; exit 2 naming what is wrong."""
    label, _, rest = arg.partition("=")
    path, _, sweep_id = rest.rpartition(":")
    problem = None
    if not (label and path and sweep_id.isdigit()):
        problem = "expected LABEL=TRIALS_CSV:SWEEP_ID with a numeric sweep id"
    elif not Path(path).is_file():
        problem = f"no file {path}"
    if problem:
        print(f"error: {arg!r}: {problem}", file=sys.stderr)
        sys.exit(2)
    return label, path, sweep_id


def main() -> None:
    if len(sys.argv) < 2:
        print(__doc__.split("Usage: ")[1], file=sys.stderr, end="")
        sys.exit(2)
    runs = [_run_of(arg) for arg in sys.argv[1:]]  # every argument checked before any output
    print("| run | shape | measured | pruned rows | wall s (first start to last end) | best ms |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        for line in rows_of(*run):
            print(line)


if __name__ == "__main__":
    main()
