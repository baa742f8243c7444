"""CLI latency: tuner --help, every sub-command's --help, sweep list, sweep status, tables show and train list each answer in under 1 s.

Each command runs as a user runs it, a fresh ``python -m tuner.cli`` process (interpreter start-up
included), ``--runs`` times; the figure is the median wall time per command. The database is a
SQLite file made and upgraded beforehand holding one finished sweep of rmsnorm_fwd with a few
trials (what ``sweep list`` and ``sweep status 1`` read); the user tables folder is empty, so
``tables show`` renders the shipped tables. The machine's load average is recorded beside the
figures: the CPU machine is shared, and a loaded one slows every process alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_S = 1.0
LISTING = (["sweep", "list"], ["sweep", "status", "1"], ["tables", "show"], ["train", "list"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="runs per command (median taken)")


def _help_commands() -> list[list[str]]:
    """``--help`` of the top command and of every group and command under it."""
    import typer.main

    from tuner.cli.main import app

    found: list[list[str]] = [["--help"]]

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            found.append([*path, name, "--help"])
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _seed_database(url: str) -> None:
    """One finished rmsnorm_fwd sweep with three trials, as ``tuner sweep run`` would leave it."""
    from db import Sweep, Trial, open_database, session_scope

    spec = {"kernel": "rmsnorm_fwd", "shapes": [{"tokens": 64, "hidden": 128}], "arch": "auto", "space": {},
            "strategy": {"name": "random", "seed": 0}, "budget": {"max_trials": 3, "max_minutes": None},
            "timing": {}, "tolerance": None}
    with session_scope(open_database(url)) as session:
        sweep = Sweep(kernel="rmsnorm_fwd", arch="interp", spec=spec, status="done")
        session.add(sweep)
        session.flush()
        for i, warps in enumerate((1, 2, 4)):
            session.add(Trial(sweep_id=sweep.id, kernel="rmsnorm_fwd", shape_key="tokens=64,hidden=128", arch="interp",
                              config={"BLOCK_M": 1, "num_warps": warps}, identity=str(i), status="ok",
                              median_ms=1.0 + i, metrics={}, versions={}))


def _time(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tuner.cli", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"tuner {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    with tempfile.TemporaryDirectory(prefix="cli-latency-") as folder:
        url = f"sqlite:///{Path(folder) / 'tuner.db'}"
        _seed_database(url)
        env = {**os.environ, "TUNER_DB_URL": url, "TUNER_TABLES_DIR": str(Path(folder) / "tables"),
               "COLUMNS": "80"}
        commands = [*_help_commands(), *LISTING]
        load_before = os.getloadavg()[0]
        times: dict[str, list[float]] = {" ".join(c): [] for c in commands}
        for _ in range(args.runs):  # round-robin: a burst of load spreads over every command
            for command in commands:
                times[" ".join(command)].append(_time(command, env))
        load_after = os.getloadavg()[0]
    medians = {f"tuner {name}": statistics.median(values) for name, values in times.items()}
    slowest = max(medians, key=medians.get)
    return {"median_s": medians, "runs": args.runs, "slowest": slowest, "slowest_median_s": medians[slowest],
            "target_s": TARGET_S, "all_under_target": medians[slowest] < TARGET_S, "cpus": os.cpu_count(),
            "load_average_1m": {"before": load_before, "after": load_after}}
