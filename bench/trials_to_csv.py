"""Dump every trial of a sweep database to CSV (the raw results committed under bench/results/).

Usage: python bench/trials_to_csv.py SQLITE_FILE OUT_CSV
"""

from __future__ import annotations

import csv
import sqlite3
import sys

COLUMNS = ["id", "sweep_id", "kernel", "shape_key", "config", "status", "median_ms", "p20_ms", "p80_ms", "reps",
           "retime_ms", "is_winner", "metrics", "error", "gpu_name", "sm_count", "versions", "started_at",
           "finished_at"]


def main() -> None:
    rows = sqlite3.connect(sys.argv[1]).execute(f"select {','.join(COLUMNS)} from tuner_trials order by id").fetchall()
    with open(sys.argv[2], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    print(f"{len(rows)} trials")


if __name__ == "__main__":
    main()
