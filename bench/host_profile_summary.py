"""Markdown table of host µs a call, before and after, from two sets of ``launch_host_profile.py`` outputs.

Usage: python bench/host_profile_summary.py BEFORE_JSON,... AFTER_JSON,...
(the same launches in both sets; each file's empty-launch baselines are listed too)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rows(paths: str) -> tuple[dict[tuple[str, str], float], list[dict]]:
    hosts, baselines = {}, []
    for path in paths.split(","):
        data = json.loads(Path(path).read_text())
        baselines.append(data["baselines"])
        hosts |= {(r["kernel"], r["shape"]): r["host_us"] for r in data["rows"]}
    return hosts, baselines


def main() -> None:
    before, before_base = _rows(sys.argv[1])
    after, after_base = _rows(sys.argv[2])
    print("| launch | shape | host µs a call before | after | after / before |")
    print("|---|---|---|---|---|")
    for key in before:
        if key in after:
            print(f"| {key[0]} | {key[1]} | {before[key]:.1f} | {after[key]:.1f} | {after[key] / before[key]:.2f} |")
    for name, bases in (("before", before_base), ("after", after_base)):
        empty = ", ".join(f"{b['empty_kernel_us']:.1f}" for b in bases)
        wide = ", ".join(f"{b['wide_kernel_us']:.1f}" for b in bases)
        print(f"\nBaselines of the {name} runs (µs a call, one per file): empty Triton launch {empty}; "
              f"13-argument launch {wide}.")


if __name__ == "__main__":
    main()
