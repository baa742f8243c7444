"""What a sweep won over the heuristic default: per shape, the default's and the winner's median time in one sweep database.

Every sweep measures the kernel's heuristic default first (``tuner.sweep.strategies.default_in_space``),
so a sweep's database holds both sides measured on one device in one run. This benchmark reads
them from such a database (a GPU run's ``sweeps.db``, e.g. from ``bench/gpu/sweep_group.sh``), on
any machine: ``measured_on`` names the device the trials ran on, and ``--db-note`` where the
database came from. Per shape: trials that passed the parity check, the default's and the best's
median ms, their ratio, and the best's GB/s (the kernel's ``bytes_moved``); per kernel, the ratio's
geomean, least and greatest.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, required=True, help="SQLite file of a sweep run")
    parser.add_argument("--kernels", default=None, help="comma-separated kernels (default: every swept one)")
    parser.add_argument("--db-note", default="", help="where the database came from (run, tree, command)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy import select

    from db import Trial, open_database, session_scope
    from kernels import registry
    from search_spaces import load_space
    from tuner.sweep.strategies import default_in_space

    if not args.db.is_file():
        raise ValueError(f"--db: no such file {args.db}")
    wanted = None if args.kernels is None else {k.strip() for k in args.kernels.split(",") if k.strip()}
    with session_scope(open_database(f"sqlite:///{args.db}")) as session:
        trials = [(t.kernel, t.shape_key, t.arch, t.config, t.median_ms, t.gpu_name)
                  for t in session.scalars(select(Trial).where(Trial.status == "ok"))
                  if wanted is None or t.kernel in wanted]
    if not trials:
        raise ValueError(f"--db: {args.db} holds no finished trial" + (f" of {sorted(wanted)}" if wanted else ""))
    by_shape: dict[tuple[str, str, str], list[tuple[dict, float]]] = {}
    for kernel, key, arch, config, median_ms, _ in trials:
        by_shape.setdefault((kernel, key, arch), []).append((config, median_ms))
    rows = []
    for (name, key, arch), measured in sorted(by_shape.items()):
        kernel = registry.get(name)
        shape = registry.parse_shape_key(key)
        default = default_in_space(kernel.default_config(shape), load_space(name), shape, arch)
        default_ms = next((ms for config, ms in measured if config == default), None)
        best_ms = min(ms for _, ms in measured)
        rows.append({"kernel": name, "shape": key, "ok_trials": len(measured), "default_ms": default_ms,
                     "best_ms": best_ms, "best_over_default": None if default_ms is None else default_ms / best_ms,
                     "best_gb_s": kernel.bytes_moved(shape) / (best_ms * 1e6)})
    kernels = {}
    for name in sorted({row["kernel"] for row in rows}):
        ratios = [row["best_over_default"] for row in rows if row["kernel"] == name and row["best_over_default"]]
        kernels[name] = {"shapes": sum(row["kernel"] == name for row in rows), "with_default": len(ratios),
                         "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
                         "least": min(ratios, default=None), "greatest": max(ratios, default=None)}
    return {"measured_on": sorted({gpu for *_, gpu in trials if gpu}), "database": args.db_note or str(args.db.name),
            "kernels": kernels, "shapes": rows}
