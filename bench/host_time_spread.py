"""How far the host times of one sweep's configs spread, per (kernel, shape): the evidence behind
``tuner.sweep.ranking``'s default of device time. For each shape of a trials CSV: the least, median and
largest ``host_ms`` of its ok trials (µs), and how many of them are host-bound (host above device).

Usage: python bench/host_time_spread.py TRIALS_CSV
"""

from __future__ import annotations

import json
import statistics
import sys

from trials_csv import read_trials  # bench/ is the script directory


def main() -> None:
    spread: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in read_trials(sys.argv[1]):
        host = json.loads(row["metrics"] or "{}").get("host_ms")
        if row["status"] == "ok" and host is not None:
            spread.setdefault((row["kernel"], row["shape_key"]), []).append((host, float(row["median_ms"])))
    print("| launch | shape | trials | host µs: least | median | largest | host-bound |")
    print("|---|---|---|---|---|---|---|")
    for (kernel, shape), pairs in sorted(spread.items()):
        hosts = [h * 1e3 for h, _ in pairs]
        bound = sum(h > d for h, d in pairs)
        print(f"| {kernel} | {shape} | {len(pairs)} | {min(hosts):.1f} | {statistics.median(hosts):.1f} "
              f"| {max(hosts):.1f} | {bound} |")


if __name__ == "__main__":
    main()
