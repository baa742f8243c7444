"""Device time of each GPU kernel that one call of a registered launch runs, so that a write-up
can say which of its launches the time goes to (e.g. the indexer's scoring against its
selection).

For every kernel and preset shape asked, the heuristic default and the table's config (or the
configs of ``--configs``) each run under the torch profiler after warm-up; the result is each
CUDA kernel's median device time over the repeats and how many times a call launches it.

Usage (on a GPU): python bench/launch_profile.py TABLE_JSON OUT_JSON KERNEL,KERNEL,... [PRESET,...]
           [--configs CONFIGS_JSON] [--only SHAPE_TEXT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from kernels import registry
from launch_variants import configs_at, preset_shapes  # bench/ is the script directory

REPEATS = 50
WARMUP = 10


def launch_times(kernel: registry.TunableKernel, inputs: Any, config: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per CUDA kernel a call of ``kernel`` launches: median device ms and launches per call."""
    for _ in range(WARMUP):
        kernel.run(inputs, config)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            kernel.run(inputs, config)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name].append(event.device_time / 1000)
    return {name: {"median_ms": statistics.median(t), "count": len(t) // REPEATS} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("kernels")
    parser.add_argument("presets", nargs="?", default="v4-flash")
    parser.add_argument("--configs", default=None, help="JSON: variant name -> config over the default")
    parser.add_argument("--only", default="", help="only the shapes whose key contains this text")
    args = parser.parse_args()
    table = json.loads(args.table.read_text())["entries"]
    overrides = json.loads(args.configs) if args.configs else None
    rows = []
    for name in args.kernels.split(","):
        kernel = registry.get(name)
        for key, shape in preset_shapes(kernel, args.presets.split(","), args.only).items():
            inputs = kernel.make_inputs(shape, torch.device("cuda"), 3)
            for variant, config in configs_at(kernel, shape, table.get(name, {}), overrides).items():
                launches = launch_times(kernel, inputs, config)
                row = {"kernel": name, "shape": key, "variant": variant, "config": config, "launches": launches,
                       "sum_of_launches_ms": sum(v["median_ms"] * v["count"] for v in launches.values())}
                print(json.dumps(row), flush=True)
                rows.append(row)
            del inputs
            torch.cuda.empty_cache()
            args.out.write_text(json.dumps({"rows": rows}, indent=1))  # after every shape: a timeout keeps them


if __name__ == "__main__":
    main()
