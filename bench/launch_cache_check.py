"""The compiled-kernel cache of ``kernels.launch`` on the GPU: do cached launches compute the same
results, and how much host time a call does the cache save.

Per registered launch and shape of PRESETS, with each of its configs (the default; at the V4
presets also the table's tuned one), on fresh seeded inputs:

1. parity: the launch once (Triton's path: it compiles, and the cache keeps the compiled kernel),
   then again on fresh inputs of the same seed, which must go through the cached launcher (counted:
   a launch whose every kernel launch was cached); its outputs against the eager reference, within
   the launch's registered tolerance;
2. host µs a call (V4 presets only, at their 4,096-token shapes): back-to-back calls that do not
   wait for the GPU, the least of ROUNDS rounds of CALLS, with the cache off and on in alternate
   rounds, beside an empty Triton launch each way.

Usage: python bench/launch_cache_check.py TABLE OUT_JSON [PRESET,PRESET,...] [KERNEL,KERNEL,...]
(defaults: small,v4-flash over every registered launch);
python bench/launch_cache_check.py --summary OUT_JSON... prints a markdown table of the results.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from kernels import launch as launch_module
from kernels import registry
from launch_variants import configs_at, preset_shapes  # bench/ is the script directory
from workers.bench_child import as_tuple, mismatch
from workers.timing import host_ms

CALLS = 100
ROUNDS = 6


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


class _CachedLaunches:
    """Counts the launches that went through the cached launcher."""

    def __init__(self) -> None:
        self.count = 0
        self._launch_compiled = launch_module._launch_compiled

    def __call__(self, *args: Any) -> None:
        self.count += 1
        self._launch_compiled(*args)


def host_us(fn: Callable[[], object]) -> dict[str, float]:
    """The least host µs a call with the cache off and on (``workers.timing.host_ms``, one round at a
    time), over alternating rounds."""
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for mode in ("off", "on"):
            launch_module.CACHE_COMPILED = mode == "on"
            fn()  # the first call after switching modes stays out of the timed round
            samples[mode].append(host_ms(fn, calls=CALLS, rounds=1) * 1e3)
    launch_module.CACHE_COMPILED = True
    return {mode: round(min(times), 1) for mode, times in samples.items()}


def check(kernel: registry.TunableKernel, shape: dict[str, int], variant: str, config: dict[str, Any],
          cached: _CachedLaunches, timed: bool) -> dict[str, Any]:
    """One row: the cached launches of a second call and its parity, and with ``timed`` host µs."""
    device = torch.device("cuda")
    kernel.run(kernel.make_inputs(shape, device, 1), config)  # compiles; the cache keeps it
    inputs = kernel.make_inputs(shape, device, 1)
    before = cached.count
    outputs = as_tuple(kernel.run(inputs, config))
    row: dict[str, Any] = {"kernel": kernel.name, "shape": kernel.shape_key(shape), "variant": variant,
                           "config": config, "cached_launches": cached.count - before,
                           "parity": mismatch(outputs, as_tuple(kernel.reference(inputs)), kernel.atol, kernel.rtol)
                           or "ok"}
    if timed:
        row["host_us"] = host_us(lambda: kernel.run(inputs, config))
    return row


def summary(reports: list[dict[str, Any]]) -> str:
    """Markdown: parity and cached launches over every row, then host µs a call off/on per timed row."""
    rows = [row for report in reports for row in report["rows"]]
    failed = [f"{r['kernel']} {r['shape']} {r['variant']}: {r.get('error') or r['parity']}"
              for r in rows if r.get("parity") != "ok"]
    uncached = [f"{r['kernel']} {r['shape']} {r['variant']}" for r in rows if r.get("cached_launches") == 0]
    lines = [f"{len(rows)} launches checked; parity failed: {len(failed)}"
             + "".join(f"\n- {line}" for line in failed),
             f"launches with no cached kernel launch: {len(uncached)}" + "".join(f"\n- {line}" for line in uncached),
             "empty Triton launch, host µs a call off / on: "
             + "; ".join(f"{r['empty_launch_host_us']['off']} / {r['empty_launch_host_us']['on']}" for r in reports),
             ""]
    timed = [r for r in rows if "host_us" in r and r["cached_launches"]]
    if timed:
        ratios = [r["host_us"]["on"] / r["host_us"]["off"] for r in timed]
        saved = [r["host_us"]["off"] - r["host_us"]["on"] for r in timed]
        lines += [f"timed launches with cached kernel launches: {len(timed)}; faster with the cache: "
                  f"{sum(ratio < 1 for ratio in ratios)}; host µs a call saved, median: {statistics.median(saved):.1f}, "
                  f"a Triton launch: {statistics.median(s / r['cached_launches'] for s, r in zip(saved, timed)):.1f}; "
                  f"on / off {min(ratios):.2f}-{max(ratios):.2f}, geomean "
                  f"{math.exp(statistics.fmean(math.log(ratio) for ratio in ratios)):.2f}", ""]
    lines += ["| launch | shape | config | Triton launches | host µs off | on | on / off |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "host_us" in r:
            off, on = r["host_us"]["off"], r["host_us"]["on"]
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['variant']} | {r['cached_launches']} | {off} | {on} | "
                         f"{on / off:.2f} |")
    return "\n".join(lines)


def _fail(field: str, reason: str) -> None:
    print(f"{field}: {reason}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    if len(sys.argv) < 3:
        _fail("usage", __doc__.split("Usage: ")[1].strip())
    if sys.argv[1] == "--summary":
        try:
            reports = [json.loads(Path(path).read_text()) for path in sys.argv[2:]]
            if any(report.get("switch", "cache") != "cache" for report in reports):
                _fail("OUT_JSON", "a report of another switch (the TMA descriptor memo of 91e7914, since removed; "
                      "its summary is in its run's log): this script times the compiled-kernel cache")
            print(summary(reports))
        except (OSError, ValueError, KeyError, TypeError) as error:
            _fail("OUT_JSON", f"not a launch_cache_check result ({type(error).__name__}: {error})")
        return
    try:
        table = json.loads(Path(sys.argv[1]).read_text())["entries"]
    except (OSError, ValueError, KeyError) as error:
        _fail("TABLE", f"not a tuned table ({type(error).__name__}: {error})")
    out = Path(sys.argv[2])
    presets = sys.argv[3].split(",") if len(sys.argv) > 3 else ["small", "v4-flash"]
    names = sys.argv[4].split(",") if len(sys.argv) > 4 else registry.names()
    unknown = [name for name in names if name not in registry.names()]
    if unknown:
        _fail("KERNEL", f"not registered: {', '.join(unknown)}")
    cached = _CachedLaunches()
    launch_module._launch_compiled = cached
    x = torch.zeros(16, device="cuda")
    empty = lambda: launch_module.launch(_empty_kernel, (1,), (x, 16), {"BLOCK": 16}, {})  # noqa: E731
    report: dict[str, Any] = {"empty_launch_host_us": host_us(empty), "rows": []}
    print(json.dumps(report), flush=True)
    for name in names:
        kernel = registry.get(name)
        for preset in presets:
            shapes = list(preset_shapes(kernel, [preset]).values())
            if preset != "small":  # the 4,096-token shapes: the shortest launches, where the host counts most
                shapes = [s for s in shapes if 4096 in s.values()] or shapes[:1]
            for shape in shapes:
                overrides = None if preset != "small" else {"default": {}}
                for variant, config in configs_at(kernel, shape, table.get(name, {}), overrides).items():
                    try:
                        row = check(kernel, shape, variant, config, cached, timed=preset != "small")
                    except Exception as error:  # a config this shape cannot run: reported, not fatal
                        row = {"kernel": name, "shape": kernel.shape_key(shape), "variant": variant,
                               "error": f"{type(error).__name__}: {error}"[:300]}
                    report["rows"].append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
                    out.write_text(json.dumps(report, indent=1))  # a timed-out run keeps what finished


if __name__ == "__main__":
    main()
