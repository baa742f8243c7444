"""Wall time of one exhaustive sweep through the service vs ``@triton.autotune``, both cold.

Same kernel (RMSNorm forward, V4-Flash 16384 x 4096 bf16), same configs (the space's grid
after its constraints). The service runs twice: with its default timing (every config
screened at warm-up 5 ms / rep 20 ms, the best 5 re-timed at 25 / 100 ms three times, interleaved, on
both GPUs) and with every config timed at 25 / 100 ms like the autotuner. Each run gets an
empty Triton cache and an empty database. The service runs as a user would run it (``tuner sweep run``, a
local Ray on every GPU of the host, compilation ahead on the CPU workers); the autotuner
compiles and benchmarks every config serially in this one process. Then the two winners
are timed against each other here, interleaved.

Usage: python bench/service_vs_autotune.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = {"tokens": 16384, "hidden": 4096}
SPEC = """kernel: rmsnorm_fwd
shapes: [{tokens: 16384, hidden: 4096}]
strategy: {name: grid}
"""
SERVICE_TIMINGS = {"default": "", "autotune_timing": "timing: {warmup_ms: 25, rep_ms: 100}\n"}


def run_service(workdir: Path, name: str) -> dict:
    spec = workdir / f"{name}.yaml"
    spec.write_text(SPEC + SERVICE_TIMINGS[name])
    db = f"sqlite:///{workdir / f'{name}.db'}"
    env = {**os.environ, "TRITON_CACHE_DIR": str(workdir / f"cache-{name}"), "TUNER_DB_URL": db}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tuner.cli", "sweep", "run", str(spec)], env=env, check=True)
    command_s = time.perf_counter() - start

    from sqlalchemy import select

    from db import Sweep, Trial, open_database, session_scope

    import torch

    gpus = torch.cuda.device_count()
    with session_scope(open_database(db)) as session:
        sweep = session.scalars(select(Sweep)).one()
        trials = session.scalars(select(Trial)).all()
        sweep_s = (sweep.finished_at - sweep.started_at).total_seconds()
        busy = sum(t.metrics.get("busy_s", 0.0) + sum(t.metrics.get("retime_busy_s", [])) for t in trials)
        benched = [t for t in trials if t.status not in ("pruned",)]
        winner = next(t for t in trials if t.is_winner)
        return {
            "command_wall_s": command_s, "sweep_wall_s": sweep_s, "gpus": gpus,
            "gpu_busy_fraction": busy / (gpus * sweep_s),
            "trials": len(trials), "evaluated": len(benched), "statuses": {s: sum(t.status == s for t in trials) for s in {t.status for t in trials}},
            "gpu_busy_s": busy, "winner": winner.config, "winner_median_ms": winner.median_ms,
        }


def autotune_configs() -> list[dict]:
    from search_spaces import load_space

    space = load_space("rmsnorm_fwd")
    return [c for c in space.grid("sm_90") if space.violation(c, SHAPE, "sm_90") is None]


def run_autotune(workdir: Path, configs: list[dict]) -> dict:
    os.environ["TRITON_CACHE_DIR"] = str(workdir / "cache-autotune")
    import torch
    import triton

    from kernels import rmsnorm

    n_rows, n_cols = SHAPE["tokens"], SHAPE["hidden"]
    whole = triton.next_power_of_2(n_cols)
    triton_configs = []
    for c in configs:
        block_d = min(c["BLOCK_D"] or whole, whole)
        triton_configs.append(triton.Config(
            {"BLOCK_M": c["BLOCK_M"], "BLOCK_D": block_d, "ONE_PASS": block_d >= n_cols, "HAS_WEIGHT": True},
            num_warps=c["num_warps"], num_stages=c["num_stages"], maxnreg=c.get("maxnreg")))
    tuned = triton.autotune(configs=triton_configs, key=["n_rows", "n_cols"], warmup=25, rep=100)(
        rmsnorm._rmsnorm_fwd_kernel)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n_cols, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, device="cuda", dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]),)  # noqa: E731
    torch.cuda.synchronize()
    start = time.perf_counter()
    tuned[grid](x, w, y, rstd, n_rows, n_cols, 1e-6)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    best = tuned.best_config
    return {"wall_s": wall, "configs": len(triton_configs),
            "winner": {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages,
                       "maxnreg": best.maxnreg}}


def compare_winners(winners: dict[str, dict], autotune_winner: dict) -> dict:
    import torch
    import triton

    from kernels import registry

    kernel = registry.get("rmsnorm_fwd")
    inputs = kernel.make_inputs(SHAPE, torch.device("cuda"), 1)
    autotune_as_space = {"BLOCK_M": autotune_winner["BLOCK_M"],
                         "BLOCK_D": 0 if autotune_winner["ONE_PASS"] else autotune_winner["BLOCK_D"],
                         "num_warps": autotune_winner["num_warps"], "num_stages": autotune_winner["num_stages"],
                         "maxnreg": autotune_winner["maxnreg"]}
    configs = {**winners, "autotune": autotune_as_space}
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(10):
        for name, cfg in configs.items():
            samples[name].append(triton.testing.do_bench(lambda: kernel.run(inputs, cfg), warmup=25, rep=100))
    return {name: statistics.median(v) for name, v in samples.items()} | {"autotune_config": autotune_as_space}


def main() -> None:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        services = {name: run_service(workdir, name) for name in SERVICE_TIMINGS}
        autotune = run_autotune(workdir, autotune_configs())
    result = {"shape": SHAPE, "service": services, "autotune": autotune,
              "winners_ms": compare_winners({f"service_{n}": s["winner"] for n, s in services.items()},
                                            autotune["winner"])}
    for name, service in services.items():
        service["speedup_vs_autotune_command"] = autotune["wall_s"] / service["command_wall_s"]
        service["speedup_vs_autotune_sweep"] = autotune["wall_s"] / service["sweep_wall_s"]
    out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
