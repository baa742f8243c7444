"""The sweep-trial CSVs committed under bench/results/: one row a trial, plain or gzip-compressed.

Large trial dumps are committed as ``.csv.gz``: every tracked file travels to the GPU host with
each device call, under a cap the plain CSVs had pushed the tree past.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

COLUMNS = ["id", "sweep_id", "kernel", "shape_key", "config", "status", "median_ms", "p20_ms", "p80_ms", "reps",
           "retime_ms", "is_winner", "metrics", "error", "gpu_name", "sm_count", "versions", "started_at",
           "finished_at"]


def _open(path: Path, mode: str) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", newline="")
    return path.open(mode, newline="")


def read_trials(path: Path | str) -> list[dict[str, str]]:
    """Every row of a trials CSV (``.csv`` or ``.csv.gz``), as the strings it holds."""
    with _open(Path(path), "r") as f:
        return list(csv.DictReader(f))


def write_trials(path: Path | str, rows: Iterable[Sequence[Any]]) -> None:
    """Rows in ``COLUMNS`` order, under a header; gzip-compressed when ``path`` ends in ``.gz``."""
    with _open(Path(path), "w") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
