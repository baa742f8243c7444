"""The ``tuner`` command line: queue and run sweeps, serve the queue, export and show tables."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from sqlalchemy import Engine, func, select

from db import DatabaseError, Sweep, Trial, default_url, open_database, session_scope
from kernels import registry
from kernels.tuning import PACKAGED_TABLES, table_path
from search_spaces import SpaceError, UnknownArchError
from tuner.cli import display
from tuner.sweep import queue
from tuner.cli.errors import reporting
from tuner.sweep.export import NothingToExport, export_table, host_bound_entries
from tuner.cli.plan import plan_app
from tuner.cli import plan_validate as plan_validate_cli  # noqa: F401 - adds ``tuner plan validate`` to plan_app
from tuner.sweep.quickstart import quickstart_specs
from tuner.sweep.ranking import DEFAULT_RANK
from tuner.cli.replay import replay
from tuner.sweep.serve import owner_name, run_sweep, serve as serve_loop
from tuner.sweep.spec import SpecError, SweepSpec, load_spec
from tuner.cli.train import register as register_training
from tuner.train.serve import training_turn
from workers.pool import PoolError, WorkerPool

app = typer.Typer(help=__doc__, no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
sweep_app = typer.Typer(help="Queue, run, list, inspect and cancel sweeps.", no_args_is_help=True)
tables_app = typer.Typer(help="Inspect exported tuned tables.", no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")
app.add_typer(tables_app, name="tables")
app.add_typer(plan_app, name="plan")
register_training(app)  # tuner train ..., tuner profile layers
app.command()(replay)

USER_ERRORS = (SpecError, SpaceError, UnknownArchError, DatabaseError, queue.SweepNotFound,
               NothingToExport, PoolError, FileNotFoundError)


user_errors = reporting(USER_ERRORS)


class State:
    """The database of the command being run. Engines are kept per URL, so that commands run one after
    another in one process (tests, scripts calling the app) each reach their own ``--db``."""

    db_url: str = ""

    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}

    @property
    def engine(self) -> Engine:
        if self.db_url not in self._engines:
            self._engines[self.db_url] = open_database(self.db_url)
        return self._engines[self.db_url]


state = State()
RayAddress = Annotated[Optional[str], typer.Option("--ray-address", envvar="RAY_ADDRESS",
                                                   help="join this Ray cluster (default: start a local one)")]
CpuWorkers = Annotated[int, typer.Option(help="device workers on a cluster without GPUs (interpreter)", min=1)]


@app.callback()
def main(db: Annotated[Optional[str], typer.Option("--db", envvar="TUNER_DB_URL",
                                                   help="SQLAlchemy URL (default: SQLite in the user data dir)")] = None) -> None:
    state.db_url = db or default_url()


def _run_with_pool(pool: WorkerPool, sweep_ids: list[int], owner: str) -> None:
    with display.sweep_progress() as progress:
        for sweep_id in sweep_ids:
            if not queue.try_claim(state.engine, sweep_id, owner):
                display.console.print(f"sweep {sweep_id} is taken by another server; skipped")
                continue
            sweep = queue.get_sweep(state.engine, sweep_id)
            callback = display.progress_callback(progress, sweep_id, sweep.kernel)
            status = run_sweep(state.engine, state.db_url, sweep_id, owner, pool, callback)
            progress.console.print(f"sweep {sweep_id}: {status.value}")


@sweep_app.command("queue")
@user_errors
def sweep_queue(specs: list[Path] = typer.Argument(..., metavar="SPEC...")) -> None:
    """Validate every SPEC, then store each as a queued sweep (none if any is bad); prints their ids."""
    parsed = [load_spec(spec) for spec in specs]
    for spec in parsed:
        typer.echo(queue.enqueue(state.engine, spec))


@sweep_app.command("run")
@user_errors
def sweep_run(spec: Path, ray_address: RayAddress = None, cpu_workers: CpuWorkers = 1) -> None:
    """Queue SPEC and run it right here, with a progress bar."""
    parsed = load_spec(spec)
    engine = state.engine
    pool = WorkerPool.start(ray_address, cpu_workers=cpu_workers)
    try:
        sweep_id = queue.enqueue(engine, parsed)
        display.console.print(f"sweep {sweep_id} queued; running on {len(pool.workers)} {pool.arch} worker(s)")
        _run_with_pool(pool, [sweep_id], owner_name())
    finally:
        pool.shutdown()


@sweep_app.command("list")
@user_errors
def sweep_list() -> None:
    """All sweeps with their status and trial counts."""
    with session_scope(state.engine) as session:
        sweeps = session.scalars(select(Sweep).order_by(Sweep.id)).all()
        counts: dict[int, Counter] = {}
        for sweep_id, status, n in session.execute(
            select(Trial.sweep_id, Trial.status, func.count()).group_by(Trial.sweep_id, Trial.status)
        ):
            counts.setdefault(sweep_id, Counter())[status] = n
    display.console.print(display.sweeps_table(list(sweeps), counts))


@sweep_app.command("status")
@user_errors
def sweep_status(sweep_id: int) -> None:
    """Trials done, failed and remaining per shape, and the best so far."""
    sweep = queue.get_sweep(state.engine, sweep_id)
    spec = SweepSpec.model_validate(sweep.spec)
    kernel_shapes = spec.resolved_shapes()
    kernel = registry.get(spec.kernel)
    arch = sweep.arch if sweep.arch != "auto" else "interp"
    with session_scope(state.engine) as session:
        trials = list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)).all())
    budgets = {kernel.shape_key(s): spec.trial_budget(arch) for s in kernel_shapes}
    display.console.print(display.status_table(sweep, trials, budgets))


@sweep_app.command("cancel")
@user_errors
def sweep_cancel(sweep_id: int) -> None:
    """Cancel a queued or running sweep (a running one stops at its next heartbeat)."""
    typer.echo(f"sweep {sweep_id}: {queue.cancel(state.engine, sweep_id)}")


@app.command()
@user_errors
def serve(ray_address: RayAddress = None, drain: bool = typer.Option(False, help="stop when the queue is empty"),
          lease_seconds: float = typer.Option(queue.DEFAULT_LEASE_S, help="take over sweeps silent this long"),
          poll_seconds: float = typer.Option(5.0, help="queue poll interval when idle"),
          cpu_workers: CpuWorkers = 1) -> None:
    """Claim queued sweeps, and queued training runs when no sweep waits, and run them on the Ray cluster."""
    engine = state.engine
    pool = WorkerPool.start(ray_address, cpu_workers=cpu_workers)
    display.console.print(f"serving with {len(pool.workers)} {pool.arch} worker(s); database {engine.url!r}")
    try:
        with display.sweep_progress() as progress:
            ran = serve_loop(
                engine, state.db_url, pool, drain, lease_seconds, poll_seconds,
                on_sweep=lambda i: display.progress_callback(progress, i, queue.get_sweep(engine, i).kernel),
                on_done=lambda i, s: progress.console.print(f"sweep {i}: {s.value}"),
                other_job=training_turn(engine, pool, ray_address, cpu_workers, lease_seconds,
                                        lambda i, s: progress.console.print(f"training run {i}: {s}")))
    finally:
        pool.shutdown()
    display.console.print(f"queue drained after {ran} job(s)")


@app.command()
@user_errors
def export(arch: Annotated[str, typer.Option(help="arch to export, e.g. sm_90")],
           out: Annotated[Optional[Path], typer.Option(help="folder (default: kernels/tables)")] = None,
           skip_kernel: Annotated[Optional[list[str]], typer.Option(
               help="leave this kernel out of the table (repeatable), e.g. until it is re-swept")] = None,
           fastest: Annotated[Optional[list[str]], typer.Option(
               help="for this kernel (repeatable; 'all': every kernel) take the fastest winner of any sweep, "
                    "not the newest sweep's: for kernels unchanged since the older sweep")] = None,
           merge: Annotated[bool, typer.Option(
               help="keep the existing table's entries for (kernel, shape) pairs the database has no trial for, "
                    "and its faster entries of the kernels given to --fastest")] = False,
           rank: Annotated[str, typer.Option(
               help="device: compare configs by device time; eager: by the longer of device and host time a "
                    "call (back-to-back eager calls), within 10% by device time")] = DEFAULT_RANK,
           ) -> None:
    """Write the tuned table of ARCH from the database; warn where an older sweep's winner was faster,
    and where an entry's eager calls wait on the host."""
    path, slower = export_table(state.engine, arch, out, skip_kernel or (), fastest or (), merge, rank)
    typer.echo(f"wrote {path}")
    for line in slower:
        typer.echo(f"warning: {line} (--fastest KERNEL takes the faster one)", err=True)
    for line in host_bound_entries(json.loads(path.read_text())):
        typer.echo(f"warning: {line}", err=True)


@tables_app.command("show")
@user_errors
def tables_show(arch: Annotated[Optional[str], typer.Option(help="only this arch")] = None,
                directory: Annotated[Optional[Path], typer.Option("--dir", help="folder of tables")] = None) -> None:
    """Print exported tables."""
    folder = directory or PACKAGED_TABLES
    paths = [table_path(arch, folder)] if arch else sorted(folder.glob("*.json"))
    if not paths or not all(p.exists() for p in paths):
        raise FileNotFoundError(f"no tuned table {'for ' + arch if arch else ''} in {folder}")
    for path in paths:
        display.console.print(display.tuned_table(json.loads(path.read_text())))


@app.command()
@user_errors
def quickstart(ray_address: RayAddress = None,
               out: Annotated[Optional[Path], typer.Option(help="folder for the table")] = None) -> None:
    """Tune the project's kernels here (GPUs if any, else the interpreter on small shapes), export, show."""
    pool = WorkerPool.start(ray_address)
    try:
        specs = quickstart_specs(on_gpu=pool.compile_ahead)
        ids = [queue.enqueue(state.engine, spec) for spec in specs]
        display.console.print(f"queued sweeps {ids} on {len(pool.workers)} {pool.arch} worker(s)")
        _run_with_pool(pool, ids, owner_name())
        arch = pool.arch
    finally:
        pool.shutdown()
    path, _ = export_table(state.engine, arch, out)
    display.console.print(f"wrote {path}")
    display.console.print(display.tuned_table(json.loads(path.read_text())))


if __name__ == "__main__":
    sys.exit(app())
