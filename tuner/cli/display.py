"""Rich rendering for the CLI: progress bars for running sweeps, tables for sweeps and tuned tables.

Imported by the CLI's entry, so it imports rich only; the database's and the sweeps' modules are
imported by the functions that render their rows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from db import Sweep, Trial
    from tuner.sweep.ranking import CallTime
    from tuner.sweep.runner import ProgressFn

console = Console()
err_console = Console(stderr=True)


def summary_help(doc: str) -> str:
    """A module docstring's first paragraph as a command group's help: plain text, without reST's ``."""
    return doc.split("\n\n")[0].replace("``", "")


def sweep_progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console)


LOG_EVERY_S = 5.0  # in a log, a shape's progress line at least this often while nothing else is news


def progress_callback(progress: Progress, sweep_id: int, kernel: str,
                      clock: Callable[[], float] = time.monotonic) -> ProgressFn:
    """A runner callback that keeps one bar per shape of the sweep. Where the console is not a terminal (a
    server's log file), bars are drawn only when they stop, so the progress is also written as timestamped
    lines: a shape's first count, each new best, its last count, and otherwise a line every
    ``LOG_EVERY_S`` while it moves. A log then shows how far a sweep got and when it last moved, without a
    line for each of its hundreds of trials."""
    tasks: dict[str, Any] = {}
    printed: dict[str, tuple[int, str, float]] = {}  # shape -> (count, best, clock) of its last line

    def update(shape_key: str, done: int, total: int, best_ms: float | None) -> None:
        best = f"{best_ms:.4f} ms" if best_ms is not None else "-"
        if shape_key not in tasks:
            tasks[shape_key] = progress.add_task(f"sweep {sweep_id} {kernel} {shape_key}", total=total, best=best)
        progress.update(tasks[shape_key], completed=done, total=total, best=best)
        if progress.console.is_terminal:
            return
        now, last = clock(), printed.get(shape_key)
        news = (last is None or done == total or best != last[1] or now - last[2] >= LOG_EVERY_S)
        if news and (last is None or done != last[0]):
            printed[shape_key] = (done, best, now)
            progress.console.print(f"{datetime.now():%H:%M:%S} sweep {sweep_id} {kernel} {shape_key}: "
                                   f"{done}/{total}, best {best}", soft_wrap=True)

    return update


class Fitted:
    """A table readable in a narrow console (80 columns): when it is wider than the console, each column
    gets its longest word and a share of the rest in proportion to its longest line, so that cells wrap
    between words and none is cut short."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns = self.table.columns
        lines = [[str(cell) for cell in [column.header, *column._cells]] for column in columns]
        least = [max((len(w) for cell in cells for w in cell.split()), default=1) for cells in lines]
        most = [max((len(line) for cell in cells for line in cell.splitlines()), default=1) for cells in lines]
        room = options.max_width - self.table._extra_width - sum(self.table.padding[1] + self.table.padding[3]
                                                                 for _ in columns)
        spare = room - sum(least)
        if sum(most) > room and spare >= 0:
            wants = [m - n for m, n in zip(most, least)]
            shares = [spare * w // max(sum(wants), 1) for w in wants]
            for column, width, share in zip(columns, least, shares):
                column.width = width + share
        yield self.table


def pool_started(workers: int, arch: str, timings: dict[str, float], own_ray: bool) -> str:
    """One line on what the command runs on and what its start cost, with the way to pay less."""
    ray_part = f"Ray {'started' if own_ray else 'joined'} {timings['ray_s']:.1f} s"
    line = (f"{workers} {arch} worker(s) up in {sum(timings.values()):.1f} s: {ray_part}, "
            f"workers {timings['workers_s']:.1f} s")
    if own_ray:
        line += "\n[dim]tip: run `ray start --head` once; later commands join it[/dim]"
    return line


def fitted(table: Table) -> Fitted:
    """``table`` as a :class:`Fitted` one."""
    return Fitted(table)


def sweeps_table(sweeps: list[Any], counts: dict[int, Counter]) -> Fitted:
    """One row per sweep (rows with id, kernel, arch, status, created_at and owner), readable at 80 columns."""
    table = Table("id", "kernel on arch", "status: trials", "created", "owner")
    for s in sweeps:
        c = counts.get(s.id, Counter())
        summary = ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "no trials"
        table.add_row(str(s.id), f"{s.kernel} {s.arch}", f"{s.status}: {summary}",
                      s.created_at.strftime("%Y-%m-%d %H:%M"), _owner(s.owner))
    return fitted(table)


def _owner(owner: str | None) -> str:
    """``host pid``: a claim's owner (``host:pid:suffix``) without its domain and random suffix."""
    if not owner:
        return "-"
    host, _, rest = owner.partition(":")
    return f"{host.split('.')[0]} {rest.split(':')[0]}".strip()


def edges(best: dict[str, Any], measured: list[dict[str, Any]]) -> list[str]:
    """``NAME=VALUE (least tried)`` or ``(most tried)`` for each tunable of which the ``measured``
    configs took three or more numeric values and ``best`` the least or greatest: the optimum may lie
    beyond what was tried, and the space be worth widening (as the indexer's selection warps were)."""
    notes = []
    for name, value in best.items():
        tried = {c.get(name) for c in measured}
        numbers = {v for v in tried if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if len(numbers) < 3 or value not in numbers or isinstance(value, bool):
            continue
        if value == min(numbers):
            notes.append(f"{name}={value} (least tried)")
        elif value == max(numbers):
            notes.append(f"{name}={value} (most tried)")
    return notes


def status_table(sweep: Sweep, trials: list[Trial], budgets: dict[str, int]) -> Fitted:
    """Per shape: trial counts, the best so far, and the tunables where it took an extreme of those measured."""
    from tuner.sweep.ranking import screening_time

    table = Table("shape", "trials", "best ms, its host ms", "best config", "best at an edge",
                  title=f"sweep {sweep.id}: {sweep.kernel} on {sweep.arch} ({sweep.status})")
    for key, budget in budgets.items():
        rows = [t for t in trials if t.shape_key == key]
        ok = [t for t in rows if t.status == "ok"]
        pruned = sum(t.status == "pruned" for t in rows)
        failed = len(rows) - len(ok) - pruned
        best = min(ok, key=lambda t: t.median_ms, default=None)
        counts = f"{len(ok)} ok, {failed} failed, {pruned} pruned, {max(budget - len(ok) - failed, 0)} left"
        times = f"{best.median_ms:.4f}\nhost {_host_cell(screening_time(best))}" if best else "-"
        table.add_row(shape_words(key), counts, times, compact(best.config) if best else "-",
                      (" ".join(edges(best.config, [t.config for t in ok])) or "-") if best else "-")
    return fitted(table)


def cell(value: float | None, fmt: str) -> str:
    """``value`` in ``fmt``, or "-" where nothing was measured."""
    return "-" if value is None else format(value, fmt)


def shape_words(key: str) -> str:
    """``tokens=4096 hidden=4096``: a shape key in words a narrow column wraps between."""
    return key.replace(",", " ")


def _host_cell(time: CallTime | None) -> str:
    """A host time a call, flagged where an eager call waits on the host ("-" where not measured)."""
    if time is None or time.host_ms is None:
        return "-"
    return f"{time.host_ms:.4f}" + (" host-bound" if time.host_bound else "")


def compact(config: dict[str, Any]) -> str:
    """``BLOCK_M=4 num_warps=8``: a config in the width of a table cell (unset knobs left out)."""
    return " ".join(f"{k}={v}" for k, v in config.items() if v is not None)


def tuned_table(table: dict[str, Any], layered: dict[str, dict[str, tuple[str, Any]]],
                layers: Sequence[Any] = ()) -> Group:
    """A tuned table, one small table per kernel (readable at 80 columns); with ``layered``
    (``kernels.tuning.merged_entries``) the entries the kernels read and the layer (``user`` or
    ``shipped``) each comes from, else ``table``'s own entries."""
    prov = table.get("provenance") or {}
    devices = ", ".join(map(str, prov.get("devices") or [])) or "?"
    heading = [Text(f"{table.get('arch')}: {devices} (exported {prov.get('exported_at', '?')})", style="bold")]
    heading += [Text(f"{layer.layer} table: {layer.path}") for layer in layers]
    entries = layered or {kernel: {key: ("", e) for key, e in shapes.items()}
                          for kernel, shapes in table["entries"].items()}
    parts = []
    for kernel, shapes in sorted(entries.items()):
        out = Table("shape", "config", "time", "from" if layered else "sweep", title=kernel, title_justify="left")
        for shape, (layer, e) in sorted(shapes.items()):
            out.add_row(*_entry_cells(shape, layer, e))
        parts.append(fitted(out))
    return Group(*heading, *parts)


def _entry_cells(shape: str, layer: str, e: Any) -> tuple[str, ...]:
    """One entry's cells; what a hand-edited or corrupt entry lacks shows as ``-`` (the run-time lookup
    skips such entries with a warning)."""
    if not isinstance(e, dict) or not isinstance(e.get("config"), dict):
        return shape_words(shape), "(not an entry: no config object)", "-", layer or "-"
    device = e.get("retime_ms") if _number(e.get("retime_ms")) else e.get("median_ms")
    host = e.get("host_ms")
    time = [f"{device:.4f} ms" if _number(device) else "-"]
    if _number(host):
        time.append(f"host {host:.4f}" + (" host-bound" if _number(device) and host > device else ""))
    if _number(e.get("gbps")):
        time.append(f"{e['gbps']:.0f} GB/s")
    sweep = f"#{e['sweep_id']}" if isinstance(e.get("sweep_id"), int) else ""
    return shape_words(shape), compact(e["config"]), "\n".join(time), f"{layer} {sweep}".strip() or "-"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
