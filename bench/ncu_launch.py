"""One call of a registered launch inside a CUDA profiler range, for Nsight Compute to read the
hardware counters of its kernels (``bench/h200_ncu.sh`` runs it under ``ncu
--profile-from-start off``): what bounds a kernel (occupancy, stalls, pipe and memory
utilisation) is then measured rather than guessed.

The launch is warmed up (compiled, autotune-free) outside the range, so only the kernels of
one call are profiled.

Usage (on a GPU): python bench/ncu_launch.py TABLE_JSON KERNEL SHAPE_KEY default|tuned|CONFIG_JSON
(CONFIG_JSON: launch parameters laid over the default, e.g. a losing config of a sweep)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from kernels import registry
from launch_variants import configs_at, preset_shapes  # bench/ is the script directory

WARMUP = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("kernel")
    parser.add_argument("shape", help="a preset shape key, e.g. tokens=4096,hidden=4096")
    parser.add_argument("variant", help="default, tuned, or a JSON object laid over the default")
    args = parser.parse_args()
    try:
        kernel = registry.get(args.kernel)
        entries = json.loads(args.table.read_text())["entries"].get(args.kernel, {})
    except (KeyError, OSError, ValueError) as error:
        parser.error(f"kernel or table: {error}")
    shapes = {key: s for key, s in preset_shapes(kernel, list(kernel.presets)).items() if key == args.shape}
    if not shapes:
        parser.error(f"shape: {args.shape!r} is no preset shape of {args.kernel}")
    shape = shapes[args.shape]
    if args.variant in ("default", "tuned"):
        configs = configs_at(kernel, shape, entries, None)
        if args.variant not in configs:
            parser.error(f"variant: the table has no entry for {args.kernel} at {args.shape}")
    else:
        try:
            configs = configs_at(kernel, shape, entries, {args.variant: json.loads(args.variant)})
        except (json.JSONDecodeError, TypeError) as error:
            parser.error(f"variant: neither default, tuned nor a JSON object of launch parameters ({error})")
    config = configs[args.variant]
    inputs = kernel.make_inputs(shape, torch.device("cuda"), 3)
    for _ in range(WARMUP):
        kernel.run(inputs, config)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    kernel.run(inputs, config)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(json.dumps({"kernel": args.kernel, "shape": args.shape, "variant": args.variant, "config": config}))


if __name__ == "__main__":
    main()
