"""Tuned vs heuristic default vs eager PyTorch (and, for the expert GEMMs, the best peers) on the GPU.

For every kernel and preset shape asked: full-size parity of the tuned and the default config
against the eager reference, then the median time of each variant, interleaved over several
rounds, by two methods: CUDA events around each call (``do_bench``, L2 flushed per
repetition, host launch cost included when it exceeds the kernel's) and, for the memory-bound
launches (the sweep specs' group, and any without a FLOP count: microsecond kernels), CUDA-graph
replay minus the replay of the L2 flushes alone (device time, see ``workers.timing``), as their
sweeps time them. Throughput
is GB/s against the device-to-device copy bandwidth measured in the same run, and TFLOP/s
for kernels that count FLOPs. The memory-bound launches are also timed beside a copy of their own
byte count (``same_size_copy``), the ceiling at their size.

The expert GEMM launches also time their peers on the same inputs (``bench/expert_gemm_peers.py``):
``torch._grouped_mm`` (CUTLASS grouped GEMM), alone and with the eager epilogue the fused
kernel replaces, and a loop of cuBLAS GEMMs over the experts (the eager PyTorch path).

Usage: python bench/kernels_h200.py TABLE_JSON OUT_JSON [KERNEL,KERNEL,...] [PRESET,PRESET,...]
(defaults: the sweep-service kernels, preset v4-flash).
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any, Callable

import torch
import triton.testing

from expert_gemm_peers import peers  # a sibling script of this one
from kernels import registry
from sweep_specs import graph_timed  # a sibling script
from workers.bench_child import as_tuple, mismatch
from workers.device_info import describe_device
from workers.timing import measure_graph

DEFAULT_KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "sinkhorn_fwd", "sinkhorn_bwd")
ROUNDS = 3


def copy_bandwidth_gbps() -> float:
    """Read + write bytes per second of a 4 GiB device-to-device copy."""
    src = torch.randn(1 << 30, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def _time_variants(name: str, key: str, variants: dict[str, Callable[[], Any]], graph: bool) -> tuple[dict, dict]:
    """Median ms per variant by events (and by graph replay if ``graph``), variants interleaved over ROUNDS."""
    samples: dict[str, list[float]] = {v: [] for v in variants}
    graph_samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for variant, fn in variants.items():
            samples[variant].append(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))
            if not graph:
                continue
            try:
                graph_samples[variant].append(measure_graph(fn).median_ms)
            except Exception as exc:  # noqa: BLE001 - e.g. an eager path that syncs cannot be captured
                print(f"{name} {key} {variant}: no graph timing: {exc}")
                torch.cuda.synchronize()
    ms = {v: statistics.median(s) for v, s in samples.items()}
    return ms, {v: statistics.median(s) for v, s in graph_samples.items() if s}


def bench_shape(name: str, shape: dict[str, int], table: dict, ceiling_gbps: float) -> dict[str, Any]:
    """One row: parity and timings of every variant of kernel ``name`` at ``shape``."""
    kernel = registry.get(name)
    key = kernel.shape_key(shape)
    tuned = table["entries"].get(name, {}).get(key, {}).get("config")
    default = kernel.default_config(shape)
    inputs = kernel.make_inputs(shape, torch.device("cuda"), 7)
    reference = as_tuple(kernel.reference(inputs))
    variants: dict[str, Callable[[], Any]] = {"default": lambda c=default: kernel.run(inputs, c)}
    if tuned is not None:
        variants["tuned"] = lambda c=tuned: kernel.run(inputs, c)
    peer_fns, peer_errors = peers(name, inputs)
    variants.update(peer_fns if peer_fns else {"eager": lambda: kernel.reference(inputs)})
    bytes_moved = kernel.bytes_moved(shape)
    memory_bound = graph_timed(name)
    if memory_bound:
        # One device copy of the launch's bytes (half read, half written): what moving them costs at
        # this size, launch ramp and tail included, which the 4 GiB copy's bandwidth leaves out. An
        # elementwise kernel, not copy_: in a CUDA graph copy_ is a memcpy node, which ran 1.5x slower
        # than the same copy timed by events at 0.27-1.9 GB (the 2026-12-01 H200 run).
        src = torch.randn(max(1, bytes_moved // 8), device="cuda")
        dst = torch.empty_like(src)
        variants["same_size_copy"] = lambda: torch.mul(src, 1.0, out=dst)
    parity = {v: mismatch(as_tuple(variants[v]()), reference, kernel.atol, kernel.rtol) or "ok"
              for v in ("default", "tuned") if v in variants}
    # The compute-bound kernels run for milliseconds, where events are exact enough; the
    # microsecond memory-bound ones are also timed by graph replay, without launch cost.
    ms, graph_ms = _time_variants(name, key, variants, graph=memory_bound)
    flops = kernel.flops(shape) if kernel.flops else None
    row: dict[str, Any] = {
        "kernel": name, "shape": key, "tuned_config": tuned, "default_config": default, "parity": parity,
        "peer_errors": peer_errors, "bytes": bytes_moved, "flops": flops, "ms": ms, "graph_ms": graph_ms,
    }
    for suffix, times in (("", ms), ("graph_", graph_ms)):
        row[f"{suffix}gbps"] = {v: bytes_moved / (t * 1e-3) / 1e9 for v, t in times.items()}
        row[f"{suffix}pct_of_copy"] = {v: 100 * g / ceiling_gbps for v, g in row[f"{suffix}gbps"].items()}
        if flops:
            row[f"{suffix}tflops"] = {v: flops / (t * 1e-3) / 1e12 for v, t in times.items()}
    return row


def main() -> None:
    table = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(DEFAULT_KERNELS)
    preset_names = sys.argv[4].split(",") if len(sys.argv) > 4 else ["v4-flash"]
    ceiling = copy_bandwidth_gbps()
    rows = []
    # Each (kernel, shape) once (presets may share shapes), the shortest sequences of every kernel
    # first, so that a time-bounded run has the sequence-4,096 cells of all of them.
    cells = {(name, registry.get(name).shape_key(shape)): (name, preset, shape)
             for name in names for preset in preset_names for shape in registry.get(name).presets.get(preset, [])}
    for name, preset, shape in sorted(cells.values(), key=lambda c: c[2].get("seq", 0)):
        row = bench_shape(name, shape, table, ceiling)
        row["preset"] = preset
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()  # the shape's inputs are gone with bench_shape's frame
        # Written after every row: a crash or a timeout keeps what was measured.
        out.write_text(json.dumps({"date": date.today().isoformat(), "device": describe_device(),
                                   "copy_gbps": ceiling, "rows": rows}, indent=1))
    print(f"copy bandwidth {ceiling:.0f} GB/s")
    nan = float("nan")
    for r in rows:
        t = r["graph_ms"].get("tuned", r["ms"].get("tuned", nan))
        d = r["graph_ms"].get("default", r["ms"]["default"])
        rate = ((r.get("graph_tflops") or r.get("tflops") or {}) if r["flops"] else r["graph_pct_of_copy"]).get("tuned", nan)
        print(f"{r['kernel']:20} {r['shape']:52} default {d:8.4f} tuned {t:8.4f} ms  x{d / t:5.2f}  "
              f"{'TFLOP/s' if r['flops'] else '% copy'} {rate:6.1f}  parity {r['parity']}")


if __name__ == "__main__":
    main()
