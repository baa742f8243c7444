"""Trials/s the sweep service sustains with a no-op kernel (issue 35 asks >= 50), and how long its queue statements take.

Queues ``--sweeps`` small grid sweeps of ``bench.noop_kernel`` (``--configs`` trials each, every
sweep at its own shape so no trial is answered from another's) from ``--clients`` concurrent
`tuner sweep queue` processes, then drains them with ``--servers`` concurrent `tuner serve --drain`
processes of ``--workers`` device workers each (a local Ray each, kernels under the interpreter),
all on one fresh PostgreSQL database (or SQLite). Figures:

* ``trials_per_s``: trials recorded over the servers' busy window (first trial started to last
  trial recorded), and ``per_worker_trials_per_s``; where it saturates is read off runs with more
  workers or servers (the record's runs).
* the queue's own statements on the filled database, timed from this process: claiming from an
  empty queue, a heartbeat, enqueueing (median and p99 ms over ``--query-reps``).
* ``sweeps_done``, ``duplicate_trials`` (a config measured twice within a sweep) and
  ``sweeps_by_both`` (sweeps with trials from more than one server), which must be 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"warmup_ms": 0.01, "rep_ms": 0.05, "retime_top": 1, "trial_timeout_s": 60}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=os.environ.get("TUNER_TEST_POSTGRES_URL", ""),
                        help="PostgreSQL server URL (a fresh database is made in it; default "
                             "TUNER_TEST_POSTGRES_URL), or 'sqlite' for a SQLite file")
    parser.add_argument("--sweeps", type=int, default=200)
    parser.add_argument("--configs", type=int, default=8, help="trials per sweep (at most 8)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="device workers per server")
    parser.add_argument("--query-reps", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=1800)


def _fresh_database(base: str, folder: Path) -> tuple[str, Any]:
    """A URL of a new empty database, and a function that drops it."""
    if base == "sqlite":
        return f"sqlite:///{folder / 'load.db'}", lambda: None
    from sqlalchemy import create_engine, text

    name = f"tuner_load_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.rsplit("/", 1)[0] + "/" + name, drop


def _env(url: str) -> dict[str, str]:
    modules = ",".join(filter(None, [os.environ.get("TUNER_KERNEL_MODULES"), "bench.noop_kernel"]))
    spaces = os.pathsep.join(filter(None, [os.environ.get("TUNER_SPACES_PATH"), str(ROOT / "bench" / "spaces")]))
    return {**os.environ, "TUNER_DB_URL": url, "RAY_ADDRESS": "", "TUNER_KERNEL_MODULES": modules,
            "TUNER_SPACES_PATH": spaces, "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _specs(folder: Path, sweeps: int, configs: int) -> list[Path]:
    paths = []
    for i in range(sweeps):
        path = folder / f"sweep{i}.yaml"
        path.write_text(yaml.safe_dump({"kernel": "service_noop", "shapes": [{"n": 8 + i}],
                                        "space": {"VARIANT": list(range(configs))}, "strategy": {"name": "grid"},
                                        "timing": TIMING}))
        paths.append(path)
    return paths


def _run_all(commands: list[list[str]], env: dict[str, str], timeout: float) -> tuple[float, list[str]]:
    """Run ``commands`` at once; the wall seconds until the last ended, and their outputs. Raises on a failure."""
    started = time.monotonic()
    procs = [subprocess.Popen(c, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(proc.args)} failed ({proc.returncode}): {err[-2000:]}")
        outputs.append(out)
    return time.monotonic() - started, outputs


def _query_times(url: str, reps: int) -> dict[str, dict[str, float]]:
    """Median and p99 ms of the queue's statements on the filled database."""
    import bench.noop_kernel  # noqa: F401 - registers the kernel the queued specs name, in this process too
    from db import open_database
    from tuner.sweep import queue
    from tuner.sweep.spec import parse_spec

    os.environ["TUNER_SPACES_PATH"] = _env(url)["TUNER_SPACES_PATH"]
    engine = open_database(url)
    spec = parse_spec({"kernel": "service_noop", "shapes": [{"n": 8}], "timing": TIMING})
    held = queue.enqueue(engine, spec)
    assert queue.try_claim(engine, held, "bench")
    actions = {"claim_empty_queue": lambda: queue.claim_next(engine, "bench"),
               "heartbeat": lambda: queue.heartbeat(engine, held, "bench"),
               "enqueue": lambda: queue.enqueue(engine, spec)}
    figures = {}
    for name, action in actions.items():
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            action()
            samples.append((time.perf_counter() - start) * 1e3)
        samples.sort()
        figures[name] = {"median_ms": round(statistics.median(samples), 3),
                         "p99_ms": round(samples[int(0.99 * (len(samples) - 1))], 3)}
    queue.finish(engine, held, "bench", queue.SweepStatus.done)
    engine.dispose()
    return figures


def _outcome(url: str) -> dict[str, Any]:
    from sqlalchemy import func, select

    from db import Sweep, Trial, open_database, session_scope

    engine = open_database(url)
    with session_scope(engine) as session:
        statuses = Counter(session.scalars(select(Sweep.status)))
        rows = session.execute(select(Trial.sweep_id, Trial.identity, Trial.node)).all()
        first, last = session.execute(select(func.min(Trial.started_at), func.max(Trial.finished_at))).one()
    engine.dispose()
    per_identity = Counter((r.sweep_id, r.identity) for r in rows)
    nodes_per_sweep: dict[int, set[str]] = {}
    for r in rows:
        nodes_per_sweep.setdefault(r.sweep_id, set()).add(r.node)
    window = (last - first).total_seconds() if rows else 0.0
    return {"sweeps_done": statuses.get("done", 0), "sweep_statuses": dict(statuses), "trials": len(rows),
            "duplicate_trials": sum(n - 1 for n in per_identity.values()),
            "sweeps_by_both": sum(len(nodes) > 1 for nodes in nodes_per_sweep.values()),
            "busy_window_s": round(window, 2), "trials_per_s": round(len(rows) / window, 1) if window else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.db:
        raise ValueError("--db: give a PostgreSQL server URL (or set TUNER_TEST_POSTGRES_URL), or 'sqlite'")
    if not 1 <= args.configs <= 8:
        raise ValueError(f"--configs: must be between 1 and 8, got {args.configs}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url, drop = _fresh_database(args.db, folder)
        try:
            env = _env(url)
            specs = _specs(folder, args.sweeps, args.configs)
            tuner = [sys.executable, "-m", "tuner.cli"]
            queue_s, _ = _run_all([[*tuner, "sweep", "queue", *map(str, specs[i::args.clients])]
                                   for i in range(args.clients)], env, args.timeout)
            serve_s, outputs = _run_all([[*tuner, "serve", "--drain", "--cpu-workers", str(args.workers)]
                                         for _ in range(args.servers)], env, args.timeout)
            figures = _outcome(url)
            done_lines = Counter(line.split(":")[0] for out in outputs for line in out.splitlines()
                                 if line.startswith("sweep ") and line.endswith(": done"))
            figures.update(
                sweeps=args.sweeps, configs_per_sweep=args.configs, clients=args.clients, servers=args.servers,
                workers_per_server=args.workers, backend=url.split(":", 1)[0], cores=os.cpu_count(),
                queue_wall_s=round(queue_s, 2), serve_wall_s=round(serve_s, 2),
                sweeps_per_server=sorted(sum(1 for line in out.splitlines() if line.endswith(": done"))
                                         for out in outputs),
                sweeps_reported_twice=sum(n > 1 for n in done_lines.values()),
                per_worker_trials_per_s=(round(figures["trials_per_s"] / (args.servers * args.workers), 1)
                                         if figures["trials_per_s"] else None),
                queries=_query_times(url, args.query_reps))
            figures["targets"] = targets(figures)
            return figures
        finally:
            drop()


TRIALS_PER_S = 50.0  # issue 35: the service must never be what GPUs wait on


def targets(figures: dict) -> list[dict[str, str]]:
    """The load target against one run's figures: the rate, and that nothing ran twice or was lost."""
    rate, clean = figures["trials_per_s"] or 0.0, (figures["duplicate_trials"] == 0 and figures["sweeps_by_both"] == 0
                                                   and figures["sweeps_done"] == figures["sweeps"])
    return [{"target": f">= {TRIALS_PER_S:g} trials/s through the service with a no-op benchmark, every sweep done once",
             "measured": (f"{rate:.1f} trials/s, {figures['servers']} server(s) x {figures['workers_per_server']} "
                          f"worker(s), {figures['sweeps_done']}/{figures['sweeps']} sweeps, "
                          f"{figures['duplicate_trials']} duplicate trials, claim {figures['queries']['claim_empty_queue']['median_ms']} ms"),
             "status": "met" if rate >= TRIALS_PER_S and clean else "missed"}]

