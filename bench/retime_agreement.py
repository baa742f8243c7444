"""From a trials CSV: how often the screening's fastest config won the re-timing, and how often
the GPUs disagreed on the winner among the re-timed configs.

Usage: python bench/retime_agreement.py TRIALS_CSV
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from trials_csv import read_trials  # bench/ is the script directory


def main() -> None:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in read_trials(sys.argv[1]):
        cells[(row["kernel"], row["shape_key"])].append(row)
    screen_won = disagree = 0
    for (kernel, shape), rows in sorted(cells.items()):
        ok = [r for r in rows if r["status"] == "ok"]
        fastest = min(ok, key=lambda r: float(r["median_ms"]))
        winner = next(r for r in rows if r["is_winner"] == "1")
        retimed = [r for r in ok if r["retime_ms"]]
        per_gpu = [json.loads(r["metrics"])["retime_per_worker_ms"] for r in retimed]
        gpu_winners = {min(range(len(retimed)), key=lambda i: per_gpu[i][g]) for g in range(len(per_gpu[0]))}
        times = [float(r["retime_ms"]) for r in retimed]
        screen_won += fastest["id"] == winner["id"]
        disagree += len(gpu_winners) > 1
        print(f"{kernel:14} {shape:26} screening-fastest won: {fastest['id'] == winner['id']!s:5} "
              f"GPUs agree: {len(gpu_winners) == 1!s:5} spread of re-timed top {len(retimed)}: "
              f"{100 * (max(times) / min(times) - 1):.1f} %")
    print(f"screening's fastest won the re-timing in {screen_won} of {len(cells)} cells; "
          f"the GPUs disagreed on the winner in {disagree} of {len(cells)}")


if __name__ == "__main__":
    main()
