"""Run claimed training runs on the Ray cluster and store them; the serve loop's training turn.

On a server the sweep pool's device workers hold every GPU (or, without GPUs, a CPU each), which
a training run's placement group needs. ``training_turn`` therefore stops the pool's device
workers for the length of the run and starts fresh ones afterwards (a restart costs the
workers' start, seconds, against a run of minutes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import ray
from sqlalchemy import Engine

from db.training import TrainStatus
from tuner.train import queue as train_queue
from tuner.sweep.serve import owner_name
from v4.pipeline import RunConfig
from workers.pool import WorkerPool
from workers.train_runner import RunCancelled, run_training


def connect_ray(address: str | None) -> bool:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start a local Ray; True when started here."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False)
    return True


def resolve_device(asked: str) -> str:
    """``auto`` is CUDA when the cluster has a GPU, else CPU; an explicit choice stays."""
    if asked != "auto":
        return asked
    return "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"


def execute(engine: Engine, run_id: int, owner: str, on_phase: Callable[[str], None] = lambda _: None) -> str:
    """Run the training run ``owner`` has claimed and store it; the status it ends with."""
    row = train_queue.get_run(engine, run_id)
    try:
        run = RunConfig.model_validate({**row.request, "device": resolve_device(row.device)})
        outcome = run_training(run, row.world, keep_alive=lambda: train_queue.heartbeat(engine, run_id, owner),
                               on_phase=on_phase)
    except RunCancelled:
        return train_queue.get_run(engine, run_id).status
    except Exception as exc:  # noqa: BLE001 - Ray or the request broke before any rank ran: stored, not raised
        train_queue.finish(engine, run_id, owner, TrainStatus.error, f"{type(exc).__name__}: {exc}")
        return TrainStatus.error.value
    return train_queue.record(engine, run_id, owner, run, outcome)


@contextmanager
def devices_released(pool: WorkerPool, ray_address: str | None, cpu_workers: int) -> Iterator[None]:
    """Stop ``pool``'s device workers while the body runs, then give the pool fresh ones."""
    for actor in pool.workers:
        ray.kill(actor)
    try:
        yield
    finally:
        fresh = WorkerPool.start(ray_address, cpu_workers=cpu_workers)
        pool.workers, pool.infos = fresh.workers, fresh.infos


def training_turn(engine: Engine, pool: WorkerPool, ray_address: str | None, cpu_workers: int, lease_s: float,
                  on_done: Callable[[int, str], None]) -> Callable[[], bool]:
    """The serve loop's ``other_job``: claim the oldest queued training run and run it; True when one ran."""
    owner = owner_name()

    def turn() -> bool:
        run_id = train_queue.claim_next(engine, owner, lease_s)
        if run_id is None:
            return False
        with devices_released(pool, ray_address, cpu_workers):
            status = execute(engine, run_id, owner)
        on_done(run_id, status)
        return True

    return turn
