"""The serve loop: claim queued sweeps one after another and run them on the worker pool.

Faults it rides out: the database out of reach (each statement is retried with backoff; what
Optuna was doing when it broke is redone by resuming the sweep, as a restarted server would,
once the database answers again), and a lease lost to another server (the runner stops; the
other server finishes the sweep). A killed server leaves none of its processes running
(``workers.reaper``). A server on a cluster whose head stops answering puts its sweep back in
the queue and exits with a message (``workers.cluster_watch``); started again once the cluster
is back, a server resumes the sweep where the trials recorded so far leave it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable

import optuna
import ray
from sqlalchemy import Engine, text

from db import SweepStatus, make_engine, retrying, schema_lock, session_scope
from db.engine import is_disconnect
from tuner.sweep import queue
from tuner.sweep.kernel_facts import KernelFacts
from tuner.sweep.runner import ProgressFn, SweepRunner
from workers.cluster_watch import ClusterWatch
from workers.pool import WorkerPool
from workers.reaper import Reaper

log = logging.getLogger(__name__)
CLUSTER_LOST_EXIT = 3
_storages: dict[str, optuna.storages.RDBStorage] = {}


def owner_name() -> str:
    """Who holds a claim: host, process and a random suffix, unique per server."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's study storage in the tuner's own database (so optuna-dashboard can open it), one per URL
    and process. Created under the schema lock: Optuna stamps its own version table, and two servers
    starting together on a fresh database both did, and one failed."""
    if url not in _storages:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        lock_engine = make_engine(url)  # Optuna builds its own engine from the URL
        try:
            with schema_lock(lock_engine):
                _storages[url] = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        finally:
            lock_engine.dispose()
    return _storages[url]


def run_sweep(engine: Engine, url: str, sweep_id: int, owner: str, pool: WorkerPool,
              on_progress: ProgressFn | None = None, lease_s: float = queue.DEFAULT_LEASE_S,
              facts: KernelFacts | None = None) -> SweepStatus:
    """Run a sweep ``owner`` has claimed; a failure marks it ``failed`` with the error. The database going
    out of reach is no failure of the sweep: that error is raised and the sweep left ``running``.
    ``facts``: its kernel's, when the caller read them already (``SweepRunner``)."""
    try:
        return SweepRunner(engine, optuna_storage(url), sweep_id, owner, pool, on_progress, lease_s, facts).run()
    except Exception as exc:
        if not is_disconnect(exc):
            queue.finish(engine, sweep_id, owner, SweepStatus.failed, error=f"{type(exc).__name__}: {exc}")
        raise


def wait_for_database(engine: Engine) -> None:
    """Return once the database answers; ``DatabaseError`` when it stays out of reach (``TUNER_DB_RETRY_S``)."""
    def ping() -> None:
        with session_scope(engine) as session:
            session.execute(text("SELECT 1"))

    retrying(ping, "waiting for the database")


def serve(engine: Engine, url: str, pool: WorkerPool, drain: bool, lease_s: float, poll_s: float,
          on_sweep: Callable[[int], ProgressFn], on_done: Callable[[int, SweepStatus], None],
          other_job: Callable[[], bool] = lambda: False) -> int:
    """Claim and run sweeps until the queue is empty (``drain``) or forever; how many jobs ran.

    Sweeps come first: ``other_job`` (a queued training run) is tried only when no sweep is
    claimable, and returns True when it ran one.
    """
    owner = owner_name()
    ran = 0
    reaper = Reaper()
    address = ray.get_runtime_context().gcs_address if ray.is_initialized() else "(none)"

    def cluster_lost(message: str) -> None:
        """Ray would end this process on its own within a minute, unexplained; end it here, in words."""
        put_back = queue.release(engine, owner)
        again = f"; sweep(s) {', '.join(map(str, put_back))} back in the queue" if put_back else ""
        print(f"error: {message}{again}; start `tuner serve` again once the cluster is up", file=sys.stderr,
              flush=True)
        os._exit(CLUSTER_LOST_EXIT)

    watch = ClusterWatch(address, cluster_lost).start()
    try:
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
            on_done(sweep_id, _run_held(engine, url, sweep_id, owner, pool, on_sweep, lease_s))
            ran += 1
    finally:
        watch.stop()
        reaper.release()


def _run_held(engine: Engine, url: str, sweep_id: int, owner: str, pool: WorkerPool,
              on_sweep: Callable[[int], ProgressFn], lease_s: float) -> SweepStatus:
    """Run a claimed sweep, resuming it after each database outage for as long as ``owner`` holds it."""
    while True:
        try:
            return run_sweep(engine, url, sweep_id, owner, pool, on_sweep(sweep_id), lease_s)
        except Exception as exc:  # noqa: BLE001 - recorded on the sweep; the server carries on
            if not is_disconnect(exc):
                return SweepStatus.failed
            log.warning("sweep %s: database out of reach (%s); resuming it once it answers", sweep_id,
                        str(exc).splitlines()[0][:200])
        wait_for_database(engine)
        if not queue.heartbeat(engine, sweep_id, owner):
            return SweepStatus(queue.get_sweep(engine, sweep_id).status)
