"""Dump every trial of a sweep database to CSV (the raw results committed under bench/results/).

Usage: python bench/trials_to_csv.py SQLITE_FILE OUT_CSV  (OUT_CSV ending in .gz is gzip-compressed)
"""

from __future__ import annotations

import sqlite3
import sys

from trials_csv import COLUMNS, write_trials


def main() -> None:
    rows = sqlite3.connect(sys.argv[1]).execute(f"select {','.join(COLUMNS)} from tuner_trials order by id").fetchall()
    write_trials(sys.argv[2], rows)
    print(f"{len(rows)} trials")


if __name__ == "__main__":
    main()
