"""Where the host's time goes in a call of registered launches: the profile behind ``host_ms``.

On the H200 an eager call of the indexer at sequence 4,096 costs 124-150 µs of host time, as long
as its device work (2026-12-03f). This script runs, per launch and preset shape, the table's config
(the default where it has none) ``CALLS`` times back to back under ``cProfile`` and records the
functions that take the host's time (self time, and cumulative time of our own and Triton's entry
points), beside two baselines timed the same way on the same machine: an empty Triton kernel of
one pointer argument, and one with the scoring's argument count (eight tensors or ints and nine
constexprs).

Usage: python bench/launch_host_profile.py TABLE OUT_JSON KERNEL,KERNEL,... PRESETS [--only TEXT]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels import registry
from launch_host_time import CALLS, host_and_events  # bench/ is the script directory
from launch_variants import configs_at, preset_shapes

TOP = 25


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _wide_kernel(a, b, c, d, n0, n1, n2, n3, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr,
                 E: tl.constexpr, F: tl.constexpr, G: tl.constexpr, H: tl.constexpr, I: tl.constexpr):
    pass


def _host_us(fn) -> float:
    """Host µs a call over back-to-back calls, after warm-up (as ``launch_host_time.py`` measures it)."""
    return host_and_events(fn)[0]


def _profile(fn) -> list[dict]:
    """The TOP functions by self time over CALLS calls: µs a call, self and cumulative."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_, calls, self_s, cumulative_s, _) in stats.stats.items():
        rows.append({"function": f"{Path(path).name}:{line}:{name}", "calls_per_call": calls / CALLS,
                     "self_us": self_s / CALLS * 1e6, "cumulative_us": cumulative_s / CALLS * 1e6})
    return sorted(rows, key=lambda r: -r["self_us"])[:TOP]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("out")
    parser.add_argument("kernels")
    parser.add_argument("presets")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    x = torch.zeros(16, device="cuda")
    wide = dict(zip("ABCDEFGHI", (16, 32, 64, 1, 0, 1, 2, 4, 8)))
    baselines = {"empty_kernel_us": _host_us(lambda: _empty_kernel[(1,)](x)),
                 "wide_kernel_us": _host_us(lambda: _wide_kernel[(64, 2, 1)](x, x, x, x, 4096, 1024, 64, 128, **wide)),
                 "torch_empty_us": _host_us(lambda: torch.empty(4096, 1024, device="cuda"))}
    print(json.dumps(baselines), flush=True)
    rows = []
    for name in args.kernels.split(","):
        kernel = registry.get(name)
        entries = json.loads(Path(args.table).read_text())["entries"].get(name, {})
        for key, shape in preset_shapes(kernel, args.presets.split(","), args.only).items():
            inputs = kernel.make_inputs(shape, torch.device("cuda"), 0)
            configs = configs_at(kernel, shape, entries, None)
            config = configs.get("tuned", configs["default"])
            fn = lambda: kernel.run(inputs, config)  # noqa: E731 - one call of the launch
            row = {"kernel": name, "shape": key, "config": config, "host_us": _host_us(fn), "top": _profile(fn)}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("kernel", "shape", "host_us")}), flush=True)
    Path(args.out).write_text(json.dumps({"baselines": baselines, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
