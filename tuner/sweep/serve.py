"""The serve loop: claim queued sweeps one after another and run them on the worker pool."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable

import optuna
from sqlalchemy import Engine

from db import SweepStatus
from tuner.sweep import queue
from tuner.sweep.runner import ProgressFn, SweepRunner
from workers.pool import WorkerPool


def owner_name() -> str:
    """Who holds a claim: host, process and a random suffix, unique per server."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's study storage in the tuner's own database (so optuna-dashboard can open it)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def run_sweep(engine: Engine, url: str, sweep_id: int, owner: str, pool: WorkerPool,
              on_progress: ProgressFn | None = None) -> SweepStatus:
    """Run a sweep ``owner`` has claimed; a failure marks it ``failed`` with the error."""
    try:
        return SweepRunner(engine, optuna_storage(url), sweep_id, owner, pool, on_progress).run()
    except Exception as exc:
        queue.finish(engine, sweep_id, owner, SweepStatus.failed, error=f"{type(exc).__name__}: {exc}")
        raise


def serve(engine: Engine, url: str, pool: WorkerPool, drain: bool, lease_s: float, poll_s: float,
          on_sweep: Callable[[int], ProgressFn], on_done: Callable[[int, SweepStatus], None],
          other_job: Callable[[], bool] = lambda: False) -> int:
    """Claim and run sweeps until the queue is empty (``drain``) or forever; how many jobs ran.

    Sweeps come first: ``other_job`` (a queued training run) is tried only when no sweep is
    claimable, and returns True when it ran one.
    """
    owner = owner_name()
    ran = 0
    while True:
        sweep_id = queue.claim_next(engine, owner, lease_s)
        if sweep_id is None:
            if other_job():
                ran += 1
                continue
            if drain:
                return ran
            time.sleep(poll_s)
            continue
        try:
            status = run_sweep(engine, url, sweep_id, owner, pool, on_sweep(sweep_id))
        except Exception:  # noqa: BLE001 - recorded on the sweep; the server carries on
            status = SweepStatus.failed
        on_done(sweep_id, status)
        ran += 1
