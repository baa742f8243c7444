"""Search efficiency: TPE gets within 2% of a grid sweep's optimum with at most 20% of its evaluations (random and TPE replayed against stored grid measurements).

Replays random and TPE (``tuner.sweep.replay``) on the CPU over the measurements of finished grid
sweeps in a SQLite database (backed up first: opening it upgrades its schema), at 10%, 20% and 40% of
each grid's evaluations over several seeds. Per (kernel, shape, strategy, fraction): the mean and
worst gap of the best found to the optimum, the score against random's expectation, and the share
of seeds within 2%.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

TARGET_FRACTION = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The database, its grid sweeps and the seeds."""
    parser.add_argument("--db", type=Path, required=True, help="SQLite file holding finished grid sweeps")
    parser.add_argument("--sweeps", required=True, help="grid sweep ids, comma-separated")
    parser.add_argument("--seeds", type=int, default=20)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Replay every sweep asked; the target over the TPE rows at 20%."""
    from db import open_database
    from tuner.sweep.replay import DEFAULT_FRACTIONS, ReplayError, replay_sweep

    if not args.db.is_file():
        raise ValueError(f"--db: no such file {args.db}")
    try:
        sweeps = [int(s) for s in args.sweeps.split(",") if s]
    except ValueError:
        raise ValueError(f"--sweeps: comma-separated sweep ids, got {args.sweeps!r}") from None
    if args.seeds < 1:
        raise ValueError(f"--seeds: at least 1, got {args.seeds}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "replay.db"
        source, target = sqlite3.connect(args.db), sqlite3.connect(copy)
        try:
            source.backup(target)  # a file copy would miss what is still in the write-ahead log
        finally:
            source.close()
            target.close()
        engine = open_database(f"sqlite:///{copy}")
        try:
            rows = [row.as_json() for sweep in sweeps for row in replay_sweep(engine, sweep, DEFAULT_FRACTIONS,
                                                                             args.seeds)]
        except ReplayError as exc:
            raise ValueError(f"--sweeps: {exc}") from None
        finally:
            engine.dispose()
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The target (TPE at 20% within 2% on every seed, per shape) and one table row per replay row."""
    target = [r for r in rows if r["strategy"] == "tpe" and r["fraction"] == TARGET_FRACTION]
    met = [r for r in target if r["within_2pct"] == 1]
    seeds = sorted({r["seeds"] for r in target})
    return {"targets": [{"target": "TPE within 2% of the grid's best with <= 20% of its evaluations",
                         "measured": f"{len(met)} of {len(target)} grids on every one of "
                                     f"{'/'.join(map(str, seeds))} seeds",
                         "status": "met" if target and len(met) == len(target) else "missed"}],
            "replay": {f"{r['kernel']} {r['shape']} {r['strategy']} {r['fraction']:g}": {
                "evaluations": f"{r['budget']}/{r['grid_evaluations']}",
                "random expected gap %": round(100 * (r["random_expectation_ms"] / r["optimum_ms"] - 1), 1),
                "mean gap %": None if r["mean_gap_pct"] is None else round(r["mean_gap_pct"], 1),
                "worst gap %": None if r["worst_gap_pct"] is None else round(r["worst_gap_pct"], 1),
                "score": None if r["score"] is None else round(r["score"], 2),
                "seeds within 2%": r["within_2pct"]} for r in rows}}
