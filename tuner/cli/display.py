"""Rich rendering for the CLI: progress bars for running sweeps, tables for sweeps and tuned tables."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db import Sweep, Trial
from tuner.sweep.ranking import CallTime, entry_time, screening_time
from tuner.sweep.runner import ProgressFn

console = Console()
err_console = Console(stderr=True)


def sweep_progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console)


def progress_callback(progress: Progress, sweep_id: int, kernel: str) -> ProgressFn:
    """A runner callback that keeps one bar per shape of the sweep."""
    tasks: dict[str, Any] = {}

    def update(shape_key: str, done: int, total: int, best_ms: float | None) -> None:
        best = f"{best_ms:.4f} ms" if best_ms is not None else "-"
        if shape_key not in tasks:
            tasks[shape_key] = progress.add_task(f"sweep {sweep_id} {kernel} {shape_key}", total=total, best=best)
        progress.update(tasks[shape_key], completed=done, total=total, best=best)

    return update


def sweeps_table(sweeps: list[Sweep], counts: dict[int, Counter]) -> Table:
    table = Table("id", "kernel", "arch", "status", "trials", "created", "owner")
    for s in sweeps:
        c = counts.get(s.id, Counter())
        summary = ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"
        table.add_row(str(s.id), s.kernel, s.arch, s.status, summary,
                      s.created_at.strftime("%Y-%m-%d %H:%M:%S"), s.owner or "-")
    return table


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


def status_table(sweep: Sweep, trials: list[Trial], budgets: dict[str, int]) -> Table:
    """Per shape: trial counts, the best so far, and the tunables where it took an extreme of those measured."""
    table = Table("shape", "ok", "failed", "pruned", "remaining", "best ms", "its host ms", "best config",
                  "best at an edge", title=f"sweep {sweep.id}: {sweep.kernel} on {sweep.arch} ({sweep.status})")
    for key, budget in budgets.items():
        rows = [t for t in trials if t.shape_key == key]
        ok = [t for t in rows if t.status == "ok"]
        pruned = sum(t.status == "pruned" for t in rows)
        failed = len(rows) - len(ok) - pruned
        best = min(ok, key=lambda t: t.median_ms, default=None)
        table.add_row(key, str(len(ok)), str(failed), str(pruned), str(max(budget - len(ok) - failed, 0)),
                      f"{best.median_ms:.4f}" if best else "-", _host_cell(screening_time(best)) if best else "-",
                      compact(best.config) if best else "-",
                      (" ".join(edges(best.config, [t.config for t in ok])) or "-") if best else "-")
    return table


def _host_cell(time: CallTime | None) -> str:
    """A host time a call, flagged where an eager call waits on the host ("-" where not measured)."""
    if time is None or time.host_ms is None:
        return "-"
    return f"{time.host_ms:.4f}" + (" host-bound" if time.host_bound else "")


def compact(config: dict[str, Any]) -> str:
    """``BLOCK_M=4 num_warps=8``: a config in the width of a table cell (unset knobs left out)."""
    return " ".join(f"{k}={v}" for k, v in config.items() if v is not None)


def tuned_table(table: dict[str, Any]) -> Table:
    prov = table["provenance"]
    out = Table("kernel", "shape", "config", "median ms", "host ms", "GB/s", "sweep",
                title=f"{table['arch']}: {', '.join(prov['devices']) or '?'} (exported {prov['exported_at']})")
    for kernel, entries in sorted(table["entries"].items()):
        for shape, e in sorted(entries.items()):
            out.add_row(kernel, shape, compact(e["config"]), f"{e['median_ms']:.4f}", _host_cell(entry_time(e)),
                        f"{e['gbps']:.0f}" if e.get("gbps") else "-", str(e["sweep_id"]))
    return out
