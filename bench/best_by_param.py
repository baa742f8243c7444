"""What one launch parameter is worth in a sweep: per (kernel, shape), the best ok time at each of its
values, and that best against the best at a reference value, from a trials CSV
(``bench/trials_to_csv.py``). A grid that varies the parameter over the same other configs shows it
directly; the rows say how many trials each best was taken from.

Usage: python bench/best_by_param.py TRIALS_CSV PARAM [--kernel KERNEL] [--reference VALUE] > table.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from trials_csv import read_trials  # bench/ is the script directory


def best_by_value(rows: list[dict], param: str, kernel: str | None) -> dict[tuple[str, str], dict[str, tuple[float, int]]]:
    """``{(kernel, shape): {value: (best ms, ok trials)}}`` over ok trials whose config names ``param``."""
    found: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        config = json.loads(r["config"])
        if r["status"] != "ok" or param not in config or (kernel and r["kernel"] != kernel):
            continue
        found[(r["kernel"], r["shape_key"])][json.dumps(config[param])].append(float(r["median_ms"]))
    return {key: {v: (min(ms), len(ms)) for v, ms in values.items()} for key, values in found.items()}


def table(best: dict[tuple[str, str], dict[str, tuple[float, int]]], param: str, reference: str) -> list[str]:
    values = sorted({v for by_value in best.values() for v in by_value}, key=lambda v: json.loads(v) or 0)
    lines = ["| kernel | shape | " + " | ".join(f"{param}={v} ms (trials)" for v in values)
             + f" | best / best at {param}={reference} |", "|" + "---|" * (3 + len(values))]
    for (kernel, shape), by_value in sorted(best.items()):
        cells = [f"{by_value[v][0]:.4f} ({by_value[v][1]})" if v in by_value else "-" for v in values]
        top = min(ms for ms, _ in by_value.values())
        ratio = f"{top / by_value[reference][0]:.3f}" if reference in by_value else "-"
        lines.append(f"| {kernel} | {shape} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials_csv", type=Path)
    parser.add_argument("param")
    parser.add_argument("--kernel")
    parser.add_argument("--reference", default="0", help="the value the others are compared with (JSON)")
    args = parser.parse_args()
    if not args.trials_csv.is_file():
        print(f"error: TRIALS_CSV: no file {args.trials_csv}", file=sys.stderr)
        sys.exit(2)
    best = best_by_value(read_trials(args.trials_csv), args.param, args.kernel)
    if not best:
        print(f"error: PARAM: no ok trial of {args.trials_csv} has {args.param!r} in its config", file=sys.stderr)
        sys.exit(2)
    print("\n".join(table(best, args.param, args.reference)))


if __name__ == "__main__":
    main()
