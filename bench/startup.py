"""One-shot start-up: where the seconds of `tuner sweep run` go besides the sweep itself (imports, database, Ray, workers, shutdown); at most 10 s on a one-GPU host.

Two measurements, each in fresh processes with an empty database:

* ``command``: ``python -m tuner.cli sweep run SPEC`` as a user runs it; its wall time less the
  sweep's own (the sweep row's started_at to finished_at) is the start-up and tear-down it added;
  ``pool_line`` is what the command said its Ray and workers cost, the rest of the overhead being
  the checks and imports the pool's start did not hide, and the shutdown.
  With ``--with-running-ray``, ``command_joining_a_running_ray``: the same while this machine
  already runs a Ray (``ray start --head``, started by the benchmark and stopped after), which the
  command finds and joins, as a user's would, instead of starting and stopping its own. The
  benchmark refuses to run where a Ray already runs: every command would join it.
* ``steps``: the same steps one by one in a probe process, timed apart: importing the CLI,
  validating the spec (imports torch and the kernels), opening the database, importing the sweep
  runner (Optuna, Ray), the worker pool's start (Ray, the device workers; ``WorkerPool.timings``),
  the sweep, and the pool's shutdown. ``pool_start_milestones``: when, after the pool's start began, the
  last device worker's actor started and the last pre-warmed child it adopted was ready (whichever is
  later is what the workers' step waited on), how long a child spent preparing the sweep's first
  problem, as ``tuner sweep run`` has it do, and on a GPU host when the last compile worker had warmed
  up (``compile_workers_ready_s``; the benchmarking child compiles its configs itself until then) and
  the last local compile process was ready (``local_compilers_ready_s``); ``local_compilers_offline_arch``:
  the arch those processes compiled for without opening the GPU, or null where they opened it.

The sweep is small on purpose (``--trials`` configs of RMSNorm forward at one shape): the figure
is what surrounds it. Without a GPU the kernels run under the Triton interpreter on a small shape.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workers.pool import running_local_ray

TARGET_OVERHEAD_S = 10.0
GPU_SHAPE = {"tokens": 16384, "hidden": 4096}
CPU_SHAPE = {"tokens": 64, "hidden": 128}

# The probe repeats what ``tuner sweep run`` does, with a clock between its steps.
PROBE = """
import json, sys, time
clock = time.perf_counter
steps = {}
began = last = clock()
def step(name):
    global last
    now = clock(); steps[name] = now - last; last = now
import tuner.cli.main
step("import_cli_s")
from pathlib import Path
from tuner.sweep.spec import first_problem, load_spec
spec = load_spec(Path(sys.argv[1]))
step("validate_spec_s")
from tuner.cli.errors import open_engine
engine = open_engine(sys.argv[2])
step("open_database_s")
from tuner.sweep import queue
from tuner.sweep.serve import owner_name, run_sweep
from workers.pool import WorkerPool
step("import_runner_s")
pool = WorkerPool.start(first_problem=first_problem(spec))
step("pool_start_s")
sweep_id = queue.enqueue(engine, spec)
owner = owner_name()
assert queue.try_claim(engine, sweep_id, owner)
status = run_sweep(engine, sys.argv[2], sweep_id, owner, pool)
step("sweep_s")
pool.note_compile_workers_ready()
step("waiting_for_compile_workers_s")  # the benchmark's own wait, which the command never makes
offline_arch = pool.local_compilers.offline_arch if pool.local_compilers is not None else None
pool.shutdown()
step("shutdown_s")
print(json.dumps({"steps": steps, "pool": pool.timings, "milestones": pool.milestones, "arch": pool.arch, "workers": len(pool.workers),
                  "local_compilers_offline_arch": offline_arch, "status": status.value, "total_s": clock() - began}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=1, help="runs of each measurement (median taken)")
    parser.add_argument("--trials", type=int, default=4, help="configs the sweep evaluates")
    parser.add_argument("--smoke", action="store_true", help="the CPU shape even on a GPU host (a quick check)")
    parser.add_argument("--with-running-ray", action="store_true",
                        help="also time the command joining a Ray this benchmark starts (ray start --head)")


def _spec(folder: Path, trials: int, gpu: bool) -> Path:
    shape = GPU_SHAPE if gpu else CPU_SHAPE
    spec = folder / "spec.yaml"
    spec.write_text(f"kernel: rmsnorm_fwd\nshapes: [{{tokens: {shape['tokens']}, hidden: {shape['hidden']}}}]\n"
                    f"strategy: {{name: random, seed: 0}}\nbudget: {{max_trials: {trials}}}\n"
                    "timing: {warmup_ms: 1, rep_ms: 5, retime_top: 2, retime_rounds: 1, retime_warmup_ms: 1, "
                    "retime_rep_ms: 5}\n")
    return spec


def _sweep_seconds(url: str) -> float:
    from sqlalchemy import select

    from db import Sweep, open_database, session_scope

    with session_scope(open_database(url)) as session:
        sweep = session.scalars(select(Sweep)).one()
        if sweep.status != "done":
            raise RuntimeError(f"the sweep ended {sweep.status}: {sweep.error}")
        return (sweep.finished_at - sweep.started_at).total_seconds()


# Joins the Ray this machine runs, as the pool does without an address; exits 1 when none runs.
JOIN_RUNNING = "import ray; ray.init(address='auto', log_to_driver=False); ray.shutdown()"
JOIN_TIMEOUT_S = 120


@contextlib.contextmanager
def _running_ray() -> Iterator[None]:
    """A Ray head of this benchmark's own (``ray start --head --block``, Ray's default temp dir, where
    a command finds it), up and joinable; stopped on leaving."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             f"--port={port}", "--include-dashboard=false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            if running_local_ray():
                joined = subprocess.run([sys.executable, "-c", JOIN_RUNNING], capture_output=True, text=True)
                if joined.returncode == 0:
                    break
                last = (joined.stderr.strip().splitlines() or ["?"])[-1]
            else:
                last = "no head answers at the address Ray's temp dir names"
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"could not join the Ray head started on port {port}: {last}")
            time.sleep(1)
        yield
    finally:
        head.terminate()  # ``ray start --block`` drains the node and stops the processes it started
        try:
            head.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)  # whatever of its session is left


def _command(folder: Path, spec: Path, env: dict[str, str], name: str = "command") -> dict[str, float]:
    url = f"sqlite:///{folder / f'{name}.db'}"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tuner.cli", "--db", url, "sweep", "run", str(spec)], env=env,
                            capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"tuner sweep run exited {result.returncode}: {result.stderr[-3000:]}")
    sweep = _sweep_seconds(url)
    said = [line.strip() for line in result.stdout.splitlines() if "worker(s) up in" in line]
    return {"command_wall_s": wall, "sweep_s": sweep, "overhead_s": wall - sweep, "pool_line": said[0] if said else None}


def _median_command(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over ``runs``, with the pool's start line (what the command said its
    Ray and workers cost) of the run nearest that median."""
    median: dict[str, Any] = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "pool_line"}
    nearest = min(runs, key=lambda r: abs(r["overhead_s"] - median["overhead_s"]))
    return {**median, "pool_line": nearest["pool_line"]}


def _steps(folder: Path, spec: Path, env: dict[str, str]) -> dict[str, Any]:
    url = f"sqlite:///{folder / 'probe.db'}"
    result = subprocess.run([sys.executable, "-c", PROBE, str(spec), url], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the start-up probe exited {result.returncode}: {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def targets(own: dict[str, Any], joined: dict[str, Any] | None, gpu: bool) -> list[dict[str, str]]:
    """The 10 s target, starting a Ray of its own and joining a running one: met or missed on a GPU
    host, for information on the CPU (the target is a one-GPU host's)."""
    rows = []
    for how, figures in (("starting its own Ray", own), ("joining a running Ray", joined)):
        if figures is None:
            continue
        overhead = figures["overhead_s"]
        status = ("met" if overhead <= TARGET_OVERHEAD_S else "missed") if gpu else "not a GPU host"
        rows.append({"target": f"tuner sweep run adds <= {TARGET_OVERHEAD_S:g} s to its sweep on a one-GPU host, "
                               f"{how}",
                     "measured": f"{overhead:.1f} s around a {figures['sweep_s']:.1f} s sweep", "status": status})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runs < 1 or args.trials < 1:
        raise ValueError("--runs and --trials must be >= 1")
    if running_local_ray():
        raise RuntimeError("a Ray already runs on this machine, which the commands would join: stop it (ray stop) "
                           "to time a command that starts its own")
    gpu = _gpus() > 0 and not args.smoke
    commands, joining, probes = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="startup-") as name:
            folder = Path(name)
            env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "triton-cache"),
                   "TUNER_TABLES_DIR": str(folder / "tables")}
            env.pop("RAY_ADDRESS", None)
            spec = _spec(folder, args.trials, gpu)
            commands.append(_command(folder, spec, env))
            probes.append(_steps(folder, spec, env))
            if args.with_running_ray:
                with _running_ray():
                    joining.append(_command(folder, spec, env, "joining"))
    median, joined = _median_command(commands), _median_command(joining) if joining else None
    steps = {key: statistics.median(p["steps"][key] for p in probes) for key in probes[0]["steps"]}
    pool = {key: statistics.median(p["pool"][key] for p in probes) for key in probes[0]["pool"]}
    milestones = {key: statistics.median(p["milestones"][key] for p in probes) for key in probes[0]["milestones"]}
    return {"targets": targets(median, joined, gpu), "command": median, "command_joining_a_running_ray": joined,
            "steps": steps, "pool_start": pool, "pool_start_milestones": milestones,
            "arch": probes[0]["arch"], "workers": probes[0]["workers"], "trials": args.trials, "runs": args.runs,
            "local_compilers_offline_arch": probes[0]["local_compilers_offline_arch"],
            "shape": GPU_SHAPE if gpu else CPU_SHAPE, "target_overhead_s": TARGET_OVERHEAD_S,
            "overhead_within_target": median["overhead_s"] <= TARGET_OVERHEAD_S,
            "joining_overhead_within_target": joined["overhead_s"] <= TARGET_OVERHEAD_S if joined else None,
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0]}
