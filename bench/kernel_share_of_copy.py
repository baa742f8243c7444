"""How close one GPU kernel of a launch comes to the copy bandwidth on its own, beside the whole launch.

From a bench run (``bench/kernels_h200.py`` output: the launch's bytes, its graph-replayed time and
the copy bandwidth of the same run) and a profile of the same call (``bench/launch_profile.py``
output: each CUDA kernel's device time), per shape of the launch: the named kernel's time for the
tuned config, the launch's bytes over that time as a share of the copy bandwidth, and the whole
launch's share. It says how much of a launch's gap to the copy is its side launches.

Usage: python bench/kernel_share_of_copy.py BENCH_JSON LAUNCHES_JSON LAUNCH KERNEL_NAME_PART
(e.g. ... mhc_glue_fwd _glue_fwd_kernel)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def share_table(bench: dict, launches: dict, launch: str, kernel_part: str) -> str:
    """A markdown row per shape that both files have for ``launch``'s tuned config; ValueError if there
    is none, or if no profiled kernel's name holds ``kernel_part``."""
    copy_gbps = bench["copy_gbps"]
    profiled = {r["shape"]: r["launches"] for r in launches["rows"] if r["kernel"] == launch and r["variant"] == "tuned"}
    lines = [f"copy bandwidth of the run: {copy_gbps:.0f} GB/s", "",
             f"| shape | launch MB | `{kernel_part}` µs | its % of copy | whole launch µs (graph) | whole % of copy |",
             "|---|---|---|---|---|---|"]
    for row in bench["rows"]:
        if row["kernel"] != launch or row["shape"] not in profiled:
            continue
        kernel_ms = sum(v["median_ms"] * v["count"] for name, v in profiled[row["shape"]].items() if kernel_part in name)
        if not kernel_ms:
            raise ValueError(f"KERNEL_NAME_PART: no kernel of {launch} at {row['shape']} is named with {kernel_part!r}")
        whole_ms = row["graph_ms"]["tuned"]
        lines.append(f"| {row['shape']} | {row['bytes'] / 1e6:.1f} | {kernel_ms * 1e3:.1f} | "
                     f"{100 * row['bytes'] / (kernel_ms * 1e-3) / 1e9 / copy_gbps:.0f}% | {whole_ms * 1e3:.1f} | "
                     f"{row['graph_pct_of_copy']['tuned']:.0f}% |")
    if len(lines) == 4:
        raise ValueError(f"LAUNCH: no tuned rows of {launch!r} in both files")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("launches_json", type=Path)
    parser.add_argument("launch", help="a registered launch, e.g. mhc_glue_fwd")
    parser.add_argument("kernel_part", help="text in the CUDA kernel's name, e.g. _glue_fwd_kernel")
    args = parser.parse_args()
    files = {}
    for field, path in (("BENCH_JSON", args.bench_json), ("LAUNCHES_JSON", args.launches_json)):
        try:
            files[field] = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"{field}: cannot read {path} ({error})")
    try:
        table = share_table(files["BENCH_JSON"], files["LAUNCHES_JSON"], args.launch, args.kernel_part)
    except (KeyError, TypeError) as error:
        parser.error(f"BENCH_JSON / LAUNCHES_JSON: not a bench and a launch profile ({type(error).__name__}: {error})")
    except ValueError as error:
        parser.error(str(error))
    print(table)


if __name__ == "__main__":
    main()
