"""Host time against device time of registered launches: whether a config is host-bound.

A launch whose Python side (argument checks, TMA descriptors, Triton's dispatch) takes longer than
its kernels starves the GPU when it is called back to back, as an eager training step calls it.
Per (shape, config) this records:

* ``host_us``: the host's time per call over ``CALLS`` back-to-back calls that do not wait for the
  GPU (the queue takes them);
* ``events_ms``: CUDA events around the same back-to-back calls, per call (what a step sees);
* ``device_ms``: ``triton.testing.do_bench``'s median with the L2 flushed between calls (as the sweeps
  time; the flush's kernel runs while the host prepares the next call).

Usage: python bench/launch_host_time.py TABLE OUT_JSON KERNEL PRESETS [--only TEXT] [--configs JSON]
(as ``bench/kernel_resources.py``: default and tuned config per shape, or named configs over the default);
python bench/launch_host_time.py --summary OUT_JSON... prints their rows as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

from kernels import registry
from launch_variants import configs_at, preset_shapes  # bench/ is the script directory

CALLS = 200
WARMUP_CALLS = 20


def host_and_events(fn) -> tuple[float, float]:
    """Host µs a call and events ms a call over CALLS back-to-back calls."""
    for _ in range(WARMUP_CALLS):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    host = (time.perf_counter() - t0) / CALLS * 1e6
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / CALLS


def summary(rows: list[dict]) -> str:
    """One line a (launch, shape, variant): host µs, events ms and device ms a call, and whether
    back-to-back calls wait on the host (its time a call above the device's)."""
    lines = ["| launch | shape | variant | host µs a call | events ms a call | device ms | host-bound |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = "yes" if r["host_us"] / 1e3 > r["device_ms"] else "no"
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['variant']} | {r['host_us']:.1f} | {r['events_ms']:.4f} "
                     f"| {r['device_ms']:.4f} | {bound} |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--summary"]:
        try:
            print(summary([row for path in sys.argv[2:] for row in json.loads(Path(path).read_text())]))
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"OUT_JSON: not a launch_host_time result ({type(error).__name__}: {error})", file=sys.stderr)
            sys.exit(2)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("out")
    parser.add_argument("kernel")
    parser.add_argument("presets")
    parser.add_argument("--only", default="")
    parser.add_argument("--configs", default=None, help="JSON: variant name -> config over the default")
    args = parser.parse_args()
    kernel = registry.get(args.kernel)
    entries = json.loads(Path(args.table).read_text())["entries"].get(args.kernel, {})
    overrides = json.loads(args.configs) if args.configs else None
    rows = []
    for key, shape in preset_shapes(kernel, args.presets.split(","), args.only).items():
        inputs = kernel.make_inputs(shape, torch.device("cuda"), 0)
        for variant, config in configs_at(kernel, shape, entries, overrides).items():
            fn = lambda: kernel.run(inputs, config)  # noqa: E731 - one call of the launch
            host_us, events_ms = host_and_events(fn)
            device_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            row = {"kernel": args.kernel, "shape": key, "variant": variant, "config": config,
                   "host_us": round(host_us, 1), "events_ms": round(events_ms, 4), "device_ms": round(device_ms, 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
