"""Device time of each launch of the mHC glue forward, so the write-up can say where its time goes.

The forward is three steps: fn split into bf16 high and low parts (a few small torch ops), the
projection kernel, and with SPLIT_K > 1 the kernel that adds the partial sums and applies the
gates. This runs the forward with a given table's config at each preset shape under the torch
profiler (after warm-up) and reports each CUDA kernel's median device time over the repeats, with
the projection kernel's share of the copy bandwidth measured in the same run.

Usage (on a GPU): python bench/glue_launches.py TABLE_JSON OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kernels_h200 import copy_bandwidth_gbps  # bench/ is the script directory
from launch_profile import launch_times
from kernels import registry


def main() -> None:
    table = json.loads(Path(sys.argv[1]).read_text())["entries"]["mhc_glue_fwd"]
    kernel = registry.get("mhc_glue_fwd")
    copy_gbps = copy_bandwidth_gbps()
    rows = []
    for shape in kernel.presets["v4-flash"] + kernel.presets["v4-pro"]:
        key = kernel.shape_key(shape)
        config = table[key]["config"]
        inputs = kernel.make_inputs(shape, torch.device("cuda"), 0)
        h_bytes = inputs["h"].numel() * inputs["h"].element_size()
        launches = launch_times(kernel, inputs, config)
        project = next(v["median_ms"] for n, v in launches.items() if "glue_fwd_kernel" in n)
        row = {"shape": key, "config": config, "launches": launches, "h_bytes": h_bytes,
               "projection_pct_of_copy_reading_h": 100 * h_bytes / project / 1e6 / copy_gbps,
               "sum_of_launches_ms": sum(v["median_ms"] * v["count"] for v in launches.values())}
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(sys.argv[2]).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
