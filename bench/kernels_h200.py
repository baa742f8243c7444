"""Tuned vs heuristic default vs eager PyTorch for the project's kernels, on the GPU.

For every kernel and V4-Flash preset shape: full-size parity of the tuned and the default
config against the eager reference, then the median time of each, interleaved over several
rounds, by two methods: CUDA events around each call (``do_bench``, L2 flushed per
repetition, host launch cost included when it exceeds the kernel's) and CUDA-graph replay
minus the replay of the L2 flushes alone (device time, see ``workers.timing``); GB/s
against the device-to-device copy bandwidth measured in the same run.

Usage: python bench/kernels_h200.py TABLE_JSON OUT_JSON
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import date
from pathlib import Path

import torch
import triton.testing

from kernels import registry
from workers.bench_child import mismatch
from workers.device_info import describe_device
from workers.timing import measure_graph

KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "sinkhorn_fwd", "sinkhorn_bwd")
ROUNDS = 5


def copy_bandwidth_gbps() -> float:
    """Read + write bytes per second of a 4 GiB device-to-device copy."""
    src = torch.randn(1 << 30, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def main() -> None:
    table = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    ceiling = copy_bandwidth_gbps()
    rows = []
    for name in KERNELS:
        kernel = registry.get(name)
        for shape in kernel.presets["v4-flash"]:
            key = kernel.shape_key(shape)
            tuned = table["entries"].get(name, {}).get(key, {}).get("config")
            default = kernel.default_config(shape)
            inputs = kernel.make_inputs(shape, torch.device("cuda"), 7)
            reference = kernel.reference(inputs)
            reference = reference if isinstance(reference, tuple) else (reference,)
            variants = {"default": lambda c=default: kernel.run(inputs, c), "eager": lambda: kernel.reference(inputs)}
            if tuned is not None:
                variants["tuned"] = lambda c=tuned: kernel.run(inputs, c)
            parity = {}
            for variant in ("default", "tuned"):
                if variant in variants:
                    result = variants[variant]()
                    result = result if isinstance(result, tuple) else (result,)
                    parity[variant] = mismatch(result, reference, kernel.atol, kernel.rtol) or "ok"
            samples: dict[str, list[float]] = {v: [] for v in variants}
            graph_samples: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(ROUNDS):
                for variant, fn in variants.items():
                    samples[variant].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
                    try:
                        graph_samples[variant].append(measure_graph(fn).median_ms)
                    except Exception as exc:  # noqa: BLE001 - e.g. an eager path that cannot be captured
                        print(f"{name} {key} {variant}: no graph timing: {exc}")
            ms = {v: statistics.median(s) for v, s in samples.items()}
            graph_ms = {v: statistics.median(s) for v, s in graph_samples.items() if s}
            bytes_moved = kernel.bytes_moved(shape)
            gbps = {v: bytes_moved / (t * 1e-3) / 1e9 for v, t in ms.items()}
            graph_gbps = {v: bytes_moved / (t * 1e-3) / 1e9 for v, t in graph_ms.items()}
            row = {"kernel": name, "shape": key, "tuned_config": tuned, "default_config": default, "ms": ms,
                   "gbps": gbps, "pct_of_copy": {v: 100 * g / ceiling for v, g in gbps.items()},
                   "graph_ms": graph_ms, "graph_gbps": graph_gbps,
                   "graph_pct_of_copy": {v: 100 * g / ceiling for v, g in graph_gbps.items()},
                   "parity": parity, "bytes": bytes_moved}
            rows.append(row)
            print(json.dumps(row))
            del inputs, reference
            torch.cuda.empty_cache()
    report = {"date": date.today().isoformat(), "device": describe_device(), "copy_gbps": ceiling, "rows": rows}
    out.write_text(json.dumps(report, indent=1))
    print(f"copy bandwidth {ceiling:.0f} GB/s")
    nan = float("nan")
    for timing, ms_key, pct_key in (("events", "ms", "pct_of_copy"), ("graph", "graph_ms", "graph_pct_of_copy")):
        print(f"[{timing}] {'kernel':14} {'shape':26} {'default ms':>10} {'tuned ms':>9} {'eager ms':>9} {'% copy':>7} {'x dflt':>7}")
        for r in rows:
            t = r[ms_key].get("tuned", nan)
            print(f"[{timing}] {r['kernel']:14} {r['shape']:26} {r[ms_key].get('default', nan):10.4f} {t:9.4f} "
                  f"{r[ms_key].get('eager', nan):9.4f} {r[pct_key].get('tuned', nan):7.1f} "
                  f"{r[ms_key].get('default', nan) / t:7.2f}")


if __name__ == "__main__":
    main()
