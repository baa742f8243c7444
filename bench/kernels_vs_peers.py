"""Kernels vs peers: tuned vs heuristic default vs eager PyTorch and torch._grouped_mm, and each against the copy bandwidth.

For every launch and preset shape asked: full-size parity of the tuned and the default config
against the eager reference, then the median time of each variant, interleaved over several
rounds, by CUDA events around each call (``do_bench``, L2 flushed per repetition) and, for the
memory-bound launches (``bench.sweep_specs.graph_timed``), by CUDA-graph replay minus the replay of
the L2 flushes alone, as their sweeps time them. Throughput is GB/s against the device-to-device copy
bandwidth measured in the same run (and a copy of the launch's own byte count, the ceiling at its
size), and TFLOP/s for launches that count FLOPs. The expert GEMMs also time their peers on the same
inputs (``bench/expert_gemm_peers.py``). ``summarize`` turns the rows into the figures the README's
targets are stated in, one table per launch family with every cell's figures. A cell that runs out of
device memory is named among the cells not measured, and the others go on; the figures so far are kept
after each cell (``<record>.partial``), so a run stopped at its time limit keeps its finished cells.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from typing import Any, Callable

from kernels import registry

ROUNDS = 3
ATTENTION = ("sparse_attn_fwd", "sparse_attn_bwd")
FLOORED = ("compressor_fwd", "compressor_bwd", "indexer_fwd")
LAYER_TYPES = {0: "window", 4: "CSA", 128: "HCA"}
# V4-Flash at EP 8 (256 / 8 experts), a 4,096-token micro-batch routed top-6, tokens spread evenly.
GEMM_TARGET_SHAPE = "tokens=24576,experts=32,hidden=4096,ffn=2048,skew=0"
GROUPS = {"attention": ATTENTION + FLOORED,
          "gemm": ("expert_up_fwd", "expert_down_fwd", "expert_up_bwd_dx", "expert_down_bwd_dx",
                   "expert_up_bwd_dw", "expert_down_bwd_dw"),
          "memory": ("mhc_glue_fwd", "mhc_glue_bwd", "mhc_collapse_fwd", "mhc_collapse_bwd", "mhc_expand_fwd",
                     "mhc_expand_bwd", "rope_fwd", "rope_bwd", "router_fwd", "router_bwd", "router_hash_fwd")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which launches and shapes, and the rates the floors are taken at."""
    parser.add_argument("--kernels", default="attention,gemm,memory",
                        help=f"launches or groups ({', '.join(GROUPS)}), comma-separated")
    parser.add_argument("--presets", default="v4-flash,v4-pro", help="model presets whose shapes to run")
    parser.add_argument("--gemm-tflops", type=float, default=750.0,
                        help="bf16 dense-GEMM rate of the device, the indexer's compute floor")
    parser.add_argument("--compile-workers", type=int, default=8,
                        help="processes that compile every cell's default and table config first (0: none)")
    parser.add_argument("--no-peers", action="store_true",
                        help="time only the heuristic default and the table's config (the tuned-over-default "
                             "figures, in about half the time; no peer, eager or same-size-copy column)")


def _launches(spec: str) -> list[str]:
    names = [n for part in spec.split(",") if part for n in GROUPS.get(part, (part,))]
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise ValueError(f"--kernels: unknown launch or group {', '.join(unknown)}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Bench every (launch, preset shape) on this GPU with the running arch's table, then summarize."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("kernels_vs_peers times kernels on a GPU; none is visible")
    from kernels.arch import current_arch
    from kernels.tuning import load_table

    names = _launches(args.kernels)
    presets = [p for p in args.presets.split(",") if p]
    table = load_table(current_arch()) or {"entries": {}}
    ceiling = copy_bandwidth_gbps()
    cells = {(name, registry.get(name).shape_key(shape)): (name, preset, shape)
             for name in names for preset in presets for shape in registry.get(name).presets.get(preset, [])}
    precompile([(name, shape) for name, _, shape in cells.values()], table, args.compile_workers)
    save_partial = getattr(args, "save_partial", lambda _figures: None)  # the runner's; absent in a direct call
    rows: list[dict] = []
    unmeasured: list[dict[str, Any]] = []
    ordered = sorted(cells.values(), key=lambda c: c[2].get("seq", 0))
    for done, (name, preset, shape) in enumerate(ordered, start=1):
        try:
            rows.append({**bench_shape(name, shape, table, ceiling, with_peers=not args.no_peers), "preset": preset})
        except torch.cuda.OutOfMemoryError:
            unmeasured.append(_unmeasured(table, name, shape, "out of device memory"))
        torch.cuda.empty_cache()
        # the cells still to run count as not measured in the partial record: a run stopped here says so
        pending = [_unmeasured(table, n, s, "not reached: the run stopped first") for n, _, s in ordered[done:]]
        save_partial(summarize(rows, ceiling, table["entries"], args.gemm_tflops, unmeasured + pending))
    return summarize(rows, ceiling, table["entries"], args.gemm_tflops, unmeasured)


def _unmeasured(table: dict, name: str, shape: dict[str, int], reason: str) -> dict[str, Any]:
    """A cell not measured, why, and whether the table holds a config for it (``targets``: a tuned cell not
    measured leaves the geomean incomplete)."""
    return {"kernel": name, "shape": registry.get(name).shape_key(shape), "reason": reason,
            "table_config": table_config(table, name, shape) is not None}


def precompile(cells: list[tuple[str, dict[str, int]]], table: dict, workers: int) -> None:
    """Compile each cell's heuristic default and table config into Triton's cache in ``workers`` processes
    (``workers.compiler.compile_one``, as a sweep's compile workers do), so that the timing loop loads
    binaries rather than compiling some 240 configs one after another. What fails here is met again, and
    reported, by the cell's own run."""
    if workers < 1:
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, wait

    from workers.compiler import compile_one

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_one_thread) as pool:
        futures = [pool.submit(compile_one, *job) for job in compile_jobs(cells, table)]
        wait(futures)
    lost = [f.exception() for f in futures if f.exception() is not None]  # a compile process that died
    if lost:
        print(f"kernels_vs_peers: {len(lost)} configs not compiled ahead ({lost[0]!r}); their cells compile them",
              file=sys.stderr)


def compile_jobs(cells: list[tuple[str, dict[str, int]]], table: dict) -> list[tuple[str, dict, dict]]:
    """``(launch, shape, config)`` for each cell's heuristic default and its table config (where it has one),
    the configs ``bench_shape`` runs."""
    jobs = []
    for name, shape in cells:
        configs = (registry.get(name).default_config(shape), table_config(table, name, shape))
        jobs += [(name, shape, config) for config in configs if config is not None]
    return jobs


def table_config(table: dict, name: str, shape: dict[str, int]) -> dict | None:
    """The config ``table`` holds for launch ``name`` at exactly ``shape``, or None."""
    return table["entries"].get(name, {}).get(registry.get(name).shape_key(shape), {}).get("config")


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def copy_bandwidth_gbps() -> float:
    """Read + write bytes per second of a 4 GiB device-to-device copy."""
    import torch
    import triton.testing

    src = torch.randn(1 << 30, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def _time_variants(variants: dict[str, Callable[[], Any]], graph: bool) -> tuple[dict, dict]:
    """Median ms per variant by events (and by graph replay if ``graph``), variants interleaved over ROUNDS."""
    import triton.testing

    from workers.timing import measure_graph

    samples: dict[str, list[float]] = {v: [] for v in variants}
    graph_samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for variant, fn in variants.items():
            samples[variant].append(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))
            if graph:
                try:
                    graph_samples[variant].append(measure_graph(fn).median_ms)
                except Exception:  # noqa: BLE001 - an eager path that syncs cannot be captured: events only
                    pass
    return ({v: statistics.median(s) for v, s in samples.items()},
            {v: statistics.median(s) for v, s in graph_samples.items() if s})


def variant_calls(name: str, shape: dict[str, int], inputs: Any, default: dict, tuned: dict | None,
                  with_peers: bool) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The calls timed at one cell, by variant: the heuristic default and the table's config; with
    ``with_peers`` also the peers (``torch._grouped_mm`` forms for the expert GEMMs, else the eager
    reference) and, for a memory-bound launch, a copy of its bytes. And the peers' errors."""
    import torch

    from bench.expert_gemm_peers import peers
    from bench.sweep_specs import graph_timed

    kernel = registry.get(name)
    variants: dict[str, Callable[[], Any]] = {"default": lambda c=default: kernel.run(inputs, c)}
    if tuned is not None:
        variants["tuned"] = lambda c=tuned: kernel.run(inputs, c)
    if not with_peers:
        return variants, {}
    peer_fns, peer_errors = peers(name, inputs)
    variants.update(peer_fns or {"eager": lambda: kernel.reference(inputs)})
    if graph_timed(name):
        # One elementwise device copy of the launch's bytes: moving them at this size, ramp and tail
        # included. Not copy_: in a CUDA graph that is a memcpy node, 1.5x slower than by events.
        device = next(t.device for t in inputs.values() if isinstance(t, torch.Tensor))
        src = torch.randn(max(1, kernel.bytes_moved(shape) // 8), device=device)
        dst = torch.empty_like(src)
        variants["same_size_copy"] = lambda: torch.mul(src, 1.0, out=dst)
    return variants, peer_errors


def bench_shape(name: str, shape: dict[str, int], table: dict, ceiling_gbps: float,
                with_peers: bool = True) -> dict[str, Any]:
    """One raw row: parity and timings of every variant of launch ``name`` at ``shape``."""
    import torch

    from bench.sweep_specs import graph_timed
    from workers.bench_child import as_tuple, mismatch

    kernel = registry.get(name)
    key = kernel.shape_key(shape)
    tuned = table_config(table, name, shape)
    default = kernel.default_config(shape)
    inputs = kernel.make_inputs(shape, torch.device("cuda"), 7)
    reference = as_tuple(kernel.reference(inputs))
    variants, peer_errors = variant_calls(name, shape, inputs, default, tuned, with_peers)
    bytes_moved = kernel.bytes_moved(shape)
    memory_bound = graph_timed(name)
    parity = {v: mismatch(as_tuple(variants[v]()), reference, kernel.atol, kernel.rtol) or "ok"
              for v in ("default", "tuned") if v in variants}
    ms, graph_ms = _time_variants(variants, graph=memory_bound)
    flops = kernel.flops(shape) if kernel.flops else None
    row: dict[str, Any] = {"kernel": name, "shape": key, "tuned_config": tuned, "default_config": default,
                           "parity": parity, "peer_errors": peer_errors, "bytes": bytes_moved, "flops": flops,
                           "ms": ms, "graph_ms": graph_ms}
    for suffix, times in (("", ms), ("graph_", graph_ms)):
        row[f"{suffix}gbps"] = {v: bytes_moved / (t * 1e-3) / 1e9 for v, t in times.items()}
        row[f"{suffix}pct_of_copy"] = {v: 100 * g / ceiling_gbps for v, g in row[f"{suffix}gbps"].items()}
        if flops:
            row[f"{suffix}tflops"] = {v: flops / (t * 1e-3) / 1e12 for v, t in times.items()}
    return row


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _best_ms(row: dict) -> dict[str, float]:
    return row["graph_ms"] or row["ms"]


def _speedup(row: dict) -> float | None:
    ms = _best_ms(row)
    return ms["default"] / ms["tuned"] if "tuned" in ms else None


def _status(ok: bool) -> str:
    return "met" if ok else "missed"


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def attention_cells(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per (model, layer type, sequence): TFLOP/s of default, swept and eager, and swept over default."""
    cells: dict[str, dict[str, Any]] = {}
    for row in sorted((r for r in rows if r["kernel"] in ATTENTION),
                      key=lambda r: (r["preset"], LAYER_TYPES[registry.parse_shape_key(r["shape"])["ratio"]],
                                     registry.parse_shape_key(r["shape"])["seq"])):
        shape = registry.parse_shape_key(row["shape"])
        cell = cells.setdefault(f"{row['preset']} {LAYER_TYPES[shape['ratio']]} {shape['seq']}", {})
        d = "fwd" if row["kernel"].endswith("fwd") else "bwd"
        for variant in ("default", "tuned", "eager"):
            cell[f"{d} {variant} TFLOP/s"] = _r(row["tflops"].get(variant), 1)
        cell[f"{d} tuned/default"] = _r(_speedup(row))
    return cells


def floor_cells(rows: list[dict], copy_gbps: float, gemm_tflops: float) -> dict[str, dict[str, Any]]:
    """Compressor and indexer: best time over the floor (bytes at the copy bandwidth, or FLOPs at
    ``gemm_tflops``) and over a copy of the launch's own bytes timed in the same run."""
    cells = {}
    for row in (r for r in rows if r["kernel"] in FLOORED):
        floor = row["bytes"] / (copy_gbps * 1e9) * 1e3
        if row["flops"]:
            floor = max(floor, row["flops"] / (gemm_tflops * 1e12) * 1e3)
        ms = _best_ms(row)
        best = ms.get("tuned", ms["default"])
        copy = ms.get("same_size_copy")
        cells[f"{row['kernel']} {row['shape']}"] = {
            "floor ms": _r(floor, 4), "same-size copy ms": _r(copy, 4), "default ms": _r(ms["default"], 4),
            "tuned ms": _r(ms.get("tuned"), 4), "best/floor": _r(best / floor, 2),
            "best/copy": None if copy is None else _r(best / copy, 2)}
    return cells


def gemm_cells(rows: list[dict], entries: dict) -> dict[str, dict[str, Any]]:
    """Expert GEMMs: TFLOP/s of default, swept and each peer; the best of ours as a share of ``_grouped_mm``."""
    cells = {}
    for row in (r for r in rows if r["kernel"].startswith("expert_")):
        t = row["tflops"]
        peer = t.get("grouped_mm")
        entry = entries.get(row["kernel"], {}).get(row["shape"])
        cells[f"{row['kernel']} {row['shape']}"] = {
            **{f"{v} TFLOP/s": _r(t.get(v), 1) for v in ("default", "tuned", "grouped_mm", "grouped_mm+epilogue",
                                                          "cublas_loop")},
            "best/grouped_mm %": _r(100 * max(t["default"], t.get("tuned", 0.0)) / peer, 1) if peer else None,
            "tuned/default": _r(_speedup(row)),
            "table entry": None if "tuned" not in t else (
                f"sweep {entry['sweep_id']}" if entry and entry["config"] == row["tuned_config"] else "not in table")}
    return cells


def memory_cells(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Memory-bound launches: share of the copy bandwidth of default, swept, eager and a same-size copy."""
    cells = {}
    for row in (r for r in rows if r["kernel"] not in ATTENTION + FLOORED and not r["kernel"].startswith("expert_")):
        timing, pct = ("graph", row["graph_pct_of_copy"]) if row["graph_ms"] else ("events", row["pct_of_copy"])
        cells[f"{row['kernel']} {row['shape']}"] = {
            "timing": timing, **{f"{v} % copy": _r(pct.get(v), 1) for v in ("default", "tuned", "eager",
                                                                            "same_size_copy")},
            "tuned/default": _r(_speedup(row))}
    return cells


def targets(rows: list[dict], copy_gbps: float, gemm_tflops: float,
            unmeasured: list[dict[str, Any]] = ()) -> list[dict[str, str]]:
    """The README's kernel targets, each measured from ``rows`` and marked met or missed (or incomplete,
    where a cell of the target's is among ``unmeasured``). A block cell without a table config counts at
    1.00x in the geomean, measured or not: its default is what the table gives it."""
    out = []
    attention = attention_cells(rows)
    csa = attention.get("v4-flash CSA 4096")
    if csa:
        fwd, bwd = csa.get("fwd tuned TFLOP/s"), csa.get("bwd tuned TFLOP/s")
        out.append({"target": "Flash CSA attention at 4,096: forward >= 350, backward >= 150 TFLOP/s",
                    "measured": f"{fwd:.0f} / {bwd:.0f}", "status": _status(fwd >= 350 and bwd >= 150)})
    at_4096 = [_speedup(r) for r in rows if r["kernel"] in ATTENTION and "tuned" in r["ms"]
               and registry.parse_shape_key(r["shape"])["seq"] == 4096]
    if at_4096:
        g = _geomean(at_4096)
        out.append({"target": f"attention tuned over default, geomean of the {len(at_4096)} cells at 4,096 >= 1.3x",
                    "measured": f"{g:.3f}x", "status": _status(g >= 1.3)})
    floors = floor_cells(rows, copy_gbps, gemm_tflops)
    compressor = {k: v for k, v in floors.items() if k.startswith("compressor") and v["best/copy"] is not None}
    if compressor:
        missed = {k: v["best/copy"] for k, v in compressor.items() if v["best/copy"] > 2}
        out.append({"target": "compressor within 2x of a same-size copy",
                    "measured": f"{len(compressor) - len(missed)} of {len(compressor)} launches" + "".join(
                        f"; {k.replace('batch=1,', '')} {x:.2f}x" for k, x in missed.items()),
                    "status": _status(not missed)})
    indexer = {k: v["best/floor"] for k, v in floors.items() if k.startswith("indexer")}
    if indexer:
        by_seq: dict[int, list[float]] = {}
        for key, x in indexer.items():
            by_seq.setdefault(registry.parse_shape_key(key.split(" ")[1])["seq"], []).append(x)
        met_at = [seq for seq, xs in sorted(by_seq.items()) if max(xs) <= 2]
        out.append({"target": "indexer call within 2x of its floor",
                    "measured": "; ".join(f"{seq}: " + " / ".join(f"{x:.2f}x" for x in xs)
                                          for seq, xs in sorted(by_seq.items())),
                    "status": "met" if len(met_at) == len(by_seq) else "met at " + ", ".join(map(str, met_at))
                    if met_at else "missed"})
    memory = memory_cells(rows)
    if memory:
        best = {k: max(v["default % copy"] or 0, v["tuned % copy"] or 0) for k, v in memory.items()}
        low = sorted({k.split(" ")[0] for k, p in best.items() if p < 80})
        out.append({"target": "memory-bound block kernels >= 80% of the copy bandwidth",
                    "measured": f"{sum(p >= 80 for p in best.values())} of {len(best)} cells"
                                + (f"; below at some shape: {', '.join(low)}" if low else ""),
                    "status": _status(not low)})
    gemm = [r for r in rows if r["kernel"] == "expert_up_fwd" and r["shape"] == GEMM_TARGET_SHAPE]
    if gemm:
        t = gemm[0]["tflops"]
        ours, share = max(t["default"], t.get("tuned", 0.0)), None
        if t.get("grouped_mm"):
            share = 100 * ours / t["grouped_mm"]
        # without the peer timed (--no-peers) the share is unknown: the target is incomplete, not missed
        out.append({"target": "grouped expert GEMM forward >= 500 TFLOP/s and >= 90% of torch._grouped_mm",
                    "measured": f"{ours:.0f} TFLOP/s" + (f", {share:.0f}%" if share else "; torch._grouped_mm not timed"),
                    "status": _status(ours >= 500 and share >= 90) if share else
                    ("incomplete" if ours >= 500 else "missed")})
    block = [r for r in rows if r["kernel"] not in ATTENTION + FLOORED]
    unmeasured_block = [u for u in unmeasured if u["kernel"] not in ATTENTION + FLOORED]
    missing = [u for u in unmeasured_block if u["table_config"]]
    untuned_unmeasured = len(unmeasured_block) - len(missing)
    if block:
        swept = [_speedup(r) for r in block if _speedup(r)]
        every = _geomean([_speedup(r) or 1.0 for r in block] + [1.0] * untuned_unmeasured)
        untuned = len(block) - len(swept) + untuned_unmeasured
        out.append({"target": "block kernels tuned over default, geomean of every cell >= 1.2x",
                    "measured": f"{every:.3f}x over {len(block) + untuned_unmeasured} cells ({untuned} without a "
                                f"tuned config, counted at 1.00x"
                                + (f", {untuned_unmeasured} of them not measured here" if untuned_unmeasured else "")
                                + f"); {_geomean(swept):.3f}x over the {len(swept)} tuned"
                                + (f"; {len(missing)} tuned cells not measured" if missing else ""),
                    "status": "incomplete" if missing else _status(every >= 1.2)})
    return out


def summarize(rows: list[dict], copy_gbps: float, entries: dict, gemm_tflops: float,
              unmeasured: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The figures of a run: targets, then one table per launch family, parity failures and the cells
    that could not be measured (``unmeasured``, each with its reason)."""
    failures = [f"{r['kernel']} {r['shape']} {v}: {p}" for r in rows for v, p in r["parity"].items() if p != "ok"]
    figures: dict[str, Any] = {"copy GB/s": _r(copy_gbps, 0), "cells": len(rows),
                               "cells not measured": [f"{u['kernel']} {u['shape']}: {u['reason']}"
                                                      for u in unmeasured or []] or "none",
                               "parity failures": failures or "none",
                               "targets": targets(rows, copy_gbps, gemm_tflops, unmeasured or [])}
    for name, cells in (("attention", attention_cells(rows)), ("compressor and indexer against their floor",
                                                                floor_cells(rows, copy_gbps, gemm_tflops)),
                        ("expert GEMMs", gemm_cells(rows, entries)), ("memory-bound kernels", memory_cells(rows))):
        if cells:
            figures[name] = cells
    return figures
