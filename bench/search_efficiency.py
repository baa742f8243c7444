"""Search efficiency on the H200 grid measurements: random and TPE replayed on the CPU (``tuner.sweep.replay``).

Copies the database first (opening it upgrades its schema), replays the given grid sweeps,
writes the rows as JSON and prints a markdown table with the project's target for the
attention kernels: TPE within 2% of the grid optimum with at most 20% of its evaluations.

Usage: python bench/search_efficiency.py DB OUT_JSON [--sweeps 1,2,3,4] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import optuna

from db import open_database
from tuner.sweep.replay import DEFAULT_FRACTIONS, DEFAULT_STRATEGIES, ReplayRow, replay_sweep

TARGET_FRACTION = 0.2


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(rows: list[ReplayRow]) -> str:
    lines = ["| kernel | shape | strategy | fraction | evals | random E gap % | mean gap % | worst gap % | score "
             "| seeds within 2% |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        random_gap = 100 * (r.random_expectation_ms / r.optimum_ms - 1)
        score = "-" if r.score is None else f"{r.score:.2f}"
        lines.append(f"| {r.kernel} | {r.shape} | {r.strategy} | {r.fraction:g} | {r.budget}/{r.grid_evaluations} "
                     f"| {random_gap:.1f} | {_pct(r.mean_gap_pct)} | {_pct(r.worst_gap_pct)} | {score} "
                     f"| {r.within_2pct:.0%} |")
    target = [r for r in rows if r.strategy == "tpe" and r.fraction == TARGET_FRACTION]
    met = [r for r in target if r.within_2pct == 1]
    lines.append("")
    lines.append(f"TPE at {TARGET_FRACTION:.0%} of the evaluations within 2% of the optimum on every seed: "
                 f"{len(met)} of {len(target)} shapes")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sweeps", default="1,2,3,4")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    sweeps = [int(s) for s in args.sweeps.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "replay.db"
        shutil.copyfile(args.db, copy)
        engine = open_database(f"sqlite:///{copy}")
        rows = [row for sweep in sweeps for row in replay_sweep(engine, sweep, DEFAULT_FRACTIONS, args.seeds)]
        engine.dispose()
    payload = {"source": str(args.db), "sweeps": sweeps, "fractions": list(DEFAULT_FRACTIONS), "seeds": args.seeds,
               "strategies": list(DEFAULT_STRATEGIES), "optuna": optuna.__version__,
               "rows": [r.as_json() for r in rows]}
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
