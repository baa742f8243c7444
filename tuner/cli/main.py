"""The ``tuner`` command line: queue and run sweeps, serve the queue, export and show tables.

The entry imports typer and rich only: each command imports what it needs (the database, Ray,
Optuna, torch and the kernels) when it runs, so that ``tuner --help`` and the listing commands
answer at once. tests/test_cli_imports.py keeps it so.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from tuner.cli import display
from tuner.cli.errors import ID_MAX, open_engine, reporting
from tuner.cli.plan import plan_app
from tuner.cli.profile import profile_app
from tuner.cli import plan_validate as plan_validate_cli  # noqa: F401 - adds ``tuner plan validate`` to plan_app
from tuner.cli.replay import replay
from tuner.cli.shapes import sweep_shapes
from tuner.cli.train import register as register_training

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tuner.sweep.kernel_facts import KernelFacts
    from workers.pool import WorkerPool

app = typer.Typer(help=display.summary_help(__doc__), no_args_is_help=True, pretty_exceptions_enable=False,
                  add_completion=False)
sweep_app = typer.Typer(help="Queue, run, list, inspect and cancel sweeps.", no_args_is_help=True)
tables_app = typer.Typer(help="Inspect the tuned tables (yours over the shipped ones) and reset yours.",
                         no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")
sweep_app.command("shapes")(sweep_shapes)
app.add_typer(tables_app, name="tables")
app.add_typer(plan_app, name="plan")
register_training(app)  # tuner train ...
app.add_typer(profile_app, name="profile")
app.command()(replay)


# What the sweep and table commands report in words.
USER_ERRORS = ("tuner.sweep.spec:SpecError", "search_spaces.space:SpaceError", "search_spaces.arch_facts:UnknownArchError",
               "tuner.sweep.queue:SweepNotFound", "tuner.sweep.export:ExportError", "kernels.tuning:TableError",
               "workers.pool:PoolError")
user_errors = reporting(USER_ERRORS)


class State:
    """The database of the command being run. Engines are kept per URL, so that commands run one after
    another in one process (tests, scripts calling the app) each reach their own ``--db``."""

    db: str | None = None  # --db as given; None: TUNER_DB_URL or the default

    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}

    @property
    def db_url(self) -> str:
        from db.engine import default_url  # imports Alembic: not for --help

        return self.db or default_url()

    @property
    def engine(self) -> Engine:
        url = self.db_url
        if url not in self._engines:
            self._engines[url] = open_engine(url)
        return self._engines[url]


state = State()
RayAddress = Annotated[Optional[str], typer.Option("--ray-address", envvar="RAY_ADDRESS",
                                                   help="join this Ray cluster (default: the Ray this machine runs, "
                                                        "else a local one for the command)")]
CpuWorkers = Annotated[int, typer.Option(help="device workers on a cluster without GPUs (interpreter)", min=1)]
SweepId = Annotated[int, typer.Argument(min=1, max=ID_MAX, help="a sweep's id (tuner sweep list)")]
ArchName = Annotated[Optional[str], typer.Option(help="only this arch, e.g. sm_90", callback=lambda value: _arch_name(value))]
TablesOut = Annotated[Optional[Path], typer.Option(
    help="folder for the table (default: TUNER_TABLES_DIR, else the user data dir's tables)")]


@app.callback()
def main(db: Annotated[Optional[str], typer.Option("--db", envvar="TUNER_DB_URL",
                                                   help="SQLAlchemy URL (default: SQLite in the user data dir)")] = None) -> None:
    state.db = db


def _run_with_pool(pool: WorkerPool, sweep_ids: list[int], owner: str, facts: Optional[KernelFacts] = None) -> None:
    """Run each sweep here; ``facts``: the kernel's of a single sweep, read beside the pool's start."""
    from tuner.sweep import queue
    from tuner.sweep.serve import run_sweep

    with display.sweep_progress() as progress:
        for sweep_id in sweep_ids:
            if not queue.try_claim(state.engine, sweep_id, owner):
                display.console.print(f"sweep {sweep_id} is taken by another server; skipped")
                continue
            sweep = queue.get_sweep(state.engine, sweep_id)
            callback = display.progress_callback(progress, sweep_id, sweep.kernel)
            status = run_sweep(state.engine, state.db_url, sweep_id, owner, pool, callback, facts=facts)
            progress.console.print(f"sweep {sweep_id}: {status.value}")


@sweep_app.command("queue")
@user_errors
def sweep_queue(specs: list[Path] = typer.Argument(..., metavar="SPEC...")) -> None:
    """Validate every SPEC, then store each as a queued sweep (none if any is bad); prints their ids."""
    from tuner.sweep import queue
    from tuner.sweep.spec import load_spec

    parsed = [load_spec(spec) for spec in specs]
    for spec in parsed:
        typer.echo(queue.enqueue(state.engine, spec))


@contextlib.contextmanager
def _pool_with(ray_address: Optional[str], cpu_workers: int, beside: Callable[[], Any],
               first_problem: Optional[dict[str, Any]] = None) -> Iterator[tuple[WorkerPool, Any]]:
    """The worker pool, started here while ``beside()`` runs in a thread, then the sweep runner's
    import (quickstart's import of the kernels, sweep run's wait on its spec-checking child, Optuna:
    seconds that the wait for Ray and the workers can hide; Ray starts in the main thread, which its
    SIGTERM handler needs); the pool and what ``beside`` returned. The pool is shut down on leaving,
    also when ``beside`` failed. ``first_problem``: what the pool's pre-warmed children prepare
    (``WorkerPool.start``)."""
    from concurrent.futures import ThreadPoolExecutor

    from workers.pool import WorkerPool

    def beside_then_runner() -> Any:
        result = beside()
        import tuner.sweep.serve  # noqa: F401 - imported here for the caller's run_sweep

        return result

    with ThreadPoolExecutor(1, thread_name_prefix="beside-pool-start") as executor:
        work = executor.submit(beside_then_runner)
        pool = WorkerPool.start(ray_address, cpu_workers=cpu_workers, first_problem=first_problem)
        display.console.print(display.pool_started(len(pool.workers), pool.arch, pool.timings, pool.own_ray))
        try:
            yield pool, work.result()
        finally:
            pool.shutdown()


@sweep_app.command("run")
@user_errors
def sweep_run(spec: Path, ray_address: RayAddress = None, cpu_workers: CpuWorkers = 1) -> None:
    """Queue SPEC and run it right here, with a progress bar."""
    from tuner.sweep.kernel_facts import check_in_a_process
    from tuner.sweep.spec import first_problem, read_spec, spec_of

    early = spec_of(read_spec(spec), spec, "early")  # a spec that fails without the kernels fails before anything starts
    # checked against its kernel in a process of its own: this one never imports torch (kernel_facts)
    with _pool_with(ray_address, cpu_workers, lambda: check_in_a_process(spec),
                    first_problem(early)) as (pool, (parsed, facts)):
        from tuner.sweep import queue
        from tuner.sweep.serve import owner_name

        sweep_id = queue.enqueue(state.engine, parsed)
        display.console.print(f"sweep {sweep_id} queued")
        _run_with_pool(pool, [sweep_id], owner_name(), facts)


@sweep_app.command("list")
@user_errors
def sweep_list() -> None:
    """All sweeps with their status and trial counts."""
    from collections import Counter

    from sqlalchemy import func, select

    from db import Sweep, Trial, session_scope

    columns = (Sweep.id, Sweep.kernel, Sweep.arch, Sweep.status, Sweep.created_at, Sweep.owner)
    with session_scope(state.engine) as session:  # the spec column is not read: a corrupt one stays listable
        sweeps = session.execute(select(*columns).order_by(Sweep.id)).all()
        counts: dict[int, Counter] = {}
        for sweep_id, status, n in session.execute(
            select(Trial.sweep_id, Trial.status, func.count()).group_by(Trial.sweep_id, Trial.status)
        ):
            counts.setdefault(sweep_id, Counter())[status] = n
    display.console.print(display.sweeps_table(list(sweeps), counts))


@sweep_app.command("status")
@user_errors
def sweep_status(sweep_id: SweepId) -> None:
    """Trials done, failed and remaining per shape, and the best so far."""
    from sqlalchemy import select

    from db import Trial, session_scope
    from tuner.sweep import queue
    from tuner.sweep.spec import stored_spec

    with _corrupt_row(sweep_id):
        sweep = queue.get_sweep(state.engine, sweep_id)
    spec = stored_spec(sweep.spec, sweep_id)
    arch = sweep.arch if sweep.arch != "auto" else "interp"
    with session_scope(state.engine) as session:
        trials = list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)).all())
    budget = spec.trial_budget(arch)
    display.console.print(display.status_table(sweep, trials, {key: budget for key in spec.shape_keys()}))


@contextlib.contextmanager
def _corrupt_row(sweep_id: int) -> Iterator[None]:
    """A sweep row whose stored spec is not JSON is reported, naming the sweep."""
    from tuner.sweep.spec import SpecError

    try:
        yield
    except json.JSONDecodeError as exc:
        raise SpecError(f"sweep {sweep_id}: its stored spec is not valid JSON ({exc.msg}; corrupt row)") from None


@sweep_app.command("cancel")
@user_errors
def sweep_cancel(sweep_id: SweepId) -> None:
    """Cancel a queued or running sweep (a running one stops at its next heartbeat)."""
    from tuner.sweep import queue

    with _corrupt_row(sweep_id):
        typer.echo(f"sweep {sweep_id}: {queue.cancel(state.engine, sweep_id)}")


@app.command()
@user_errors
def serve(ray_address: RayAddress = None, drain: bool = typer.Option(False, help="stop when the queue is empty"),
          lease_seconds: Optional[float] = typer.Option(
              None, help="take over sweeps silent this long (default: the queue's lease)", min=0.001),
          poll_seconds: float = typer.Option(5.0, help="queue poll interval when idle", min=0.001),
          cpu_workers: CpuWorkers = 1) -> None:
    """Claim queued sweeps, and queued training runs when no sweep waits, and run them on the Ray cluster."""
    from tuner.sweep import queue
    from tuner.sweep.serve import serve as serve_loop
    from tuner.train.serve import training_turn
    from workers.pool import WorkerPool

    engine = state.engine
    lease_seconds = lease_seconds or queue.DEFAULT_LEASE_S
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


def _export(arch: str, out: Optional[Path], **options: Any) -> Path:
    """Export ``arch``'s table (see ``tuner.sweep.export``), print where, warn of slower and host-bound entries."""
    from kernels.tuning import read_table
    from tuner.sweep.export import export_table, host_bound_entries

    path, slower = export_table(state.engine, arch, out, **options)
    typer.echo(f"wrote {path}")
    for line in slower:
        typer.echo(f"warning: {line} (--fastest KERNEL takes the faster one)", err=True)
    for line in host_bound_entries(read_table(path)):
        typer.echo(f"warning: {line}", err=True)
    return path


@app.command()
@user_errors
def export(arch: Annotated[str, typer.Option(help="arch to export, e.g. sm_90")],
           out: TablesOut = None,
           skip_kernel: Annotated[Optional[list[str]], typer.Option(
               help="leave this kernel out of the table (repeatable), e.g. until it is re-swept")] = None,
           fastest: Annotated[Optional[list[str]], typer.Option(
               help="for this kernel (repeatable; 'all': every kernel) take the fastest winner of any sweep, "
                    "not the newest sweep's: for kernels unchanged since the older sweep")] = None,
           merge: Annotated[bool, typer.Option(
               help="keep the entries of the table already there for (kernel, shape) pairs the database has "
                    "no trial for, and its faster entries of the kernels given to --fastest; --no-merge writes "
                    "only this database's winners")] = True,
           rank: Annotated[str, typer.Option(
               help="device: compare configs by device time; eager: by the longer of device and host time a "
                    "call (back-to-back eager calls), within 10% by device time")] = "device",  # ranking.DEFAULT_RANK
           ) -> None:
    """Write the tuned table of ARCH from the database into your tables folder; warn where an older
    sweep's winner was faster, and where an entry's eager calls wait on the host."""
    _export(arch, out, skip=skip_kernel or (), fastest=fastest or (), merge=merge, rank=rank)


def _arch_name(value: Optional[str]) -> Optional[str]:
    """An arch names a table file: letters, digits and underscores only (no path)."""
    if value is not None and not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise typer.BadParameter(f"--arch: {value!r} is not an arch name (letters, digits, _)")
    return value


@tables_app.command("show")
@user_errors
def tables_show(arch: ArchName = None,
                directory: Annotated[Optional[Path], typer.Option(
                    "--dir", help="show the tables of this folder alone, not the layers the kernels read")] = None) -> None:
    """Print the tuned tables the kernels read: your entries over the shipped ones, each marked with its layer."""
    from kernels import tuning

    if directory is not None:
        paths = [tuning.table_path(arch, directory)] if arch else sorted(directory.glob("*.json"))
        if not paths or not all(p.exists() for p in paths):
            raise tuning.TableError(f"{directory}: no tuned table{' of ' + arch if arch else ''}")
        for path in paths:
            display.console.print(display.tuned_table(tuning.read_table(path), {}))
        return
    folders = (tuning.SHIPPED_TABLES, tuning.user_tables_dir())
    archs = [arch] if arch else sorted({p.stem for folder in folders for p in folder.glob("*.json")})
    shown = 0
    for name in archs:
        layers = tuning.table_layers(name, warn=False)
        if layers:
            display.console.print(display.tuned_table(layers[-1].table, tuning.merged_entries(layers), layers))
            shown += 1
    if not shown:
        raise tuning.TableError(f"no tuned table{' of ' + arch if arch else ''} in {folders[0]} or {folders[1]}")


@tables_app.command("reset")
@user_errors
def tables_reset(arch: ArchName = None) -> None:
    """Drop your exported tables (all, or ARCH's), so that the kernels read the shipped tables again."""
    from kernels import tuning

    folder = tuning.user_tables_dir()
    paths = [tuning.table_path(arch, folder)] if arch else sorted(folder.glob("*.json"))
    removed = [path for path in paths if path.is_file()]
    for path in removed:
        path.unlink()
    typer.echo(f"removed {', '.join(map(str, removed))}" if removed else f"no table of yours to reset in {folder}")


@app.command()
@user_errors
def quickstart(ray_address: RayAddress = None, out: TablesOut = None) -> None:
    """Tune the project's kernels here (GPUs if any, else the interpreter on small shapes), export, show."""
    from kernels import registry, tuning
    from tuner.sweep import queue
    from tuner.sweep.export import tables_folder
    from tuner.sweep.quickstart import quickstart_specs
    from tuner.sweep.serve import owner_name

    tables_folder(out)  # a bad --out fails before the sweeps, not after them
    with _pool_with(ray_address, 1, registry.names) as (pool, _):  # the kernels imported while the pool starts
        specs = quickstart_specs(on_gpu=pool.compile_ahead)
        ids = [queue.enqueue(state.engine, spec) for spec in specs]
        display.console.print(f"queued sweeps {ids} on {len(pool.workers)} {pool.arch} worker(s)")
        _run_with_pool(pool, ids, owner_name())
        arch = pool.arch
    path = _export(arch, out)
    display.console.print(display.tuned_table(tuning.read_table(path), {}))


if __name__ == "__main__":
    sys.exit(app())
