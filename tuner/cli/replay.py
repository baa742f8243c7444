"""``tuner replay``: replay random and TPE sweeps against a finished grid sweep's measurements (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from db import DatabaseError, default_url, open_database
from tuner.cli import display
from tuner.cli.errors import fail
from tuner.sweep.replay import (DEFAULT_FRACTIONS, DEFAULT_SEEDS, DEFAULT_STRATEGIES, HIT_TOLERANCE, ReplayError, ReplayRow,
                          replay_sweep)


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ReplayError(f"--fractions must be comma-separated numbers, got {text!r}") from None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def rows_table(sweep_id: int, rows: list[ReplayRow]) -> Table:
    """Gaps to the grid optimum in %; "random" is the exact expectation for as many uniform draws."""
    kernels = ", ".join(sorted({r.kernel for r in rows}))
    table = Table("shape", "strategy", "fraction", "evals", "optimum ms", "random %", "mean %", "worst %", "score",
                  f"<= {HIT_TOLERANCE:.0%}", title=f"replay of grid sweep {sweep_id} ({kernels}): gaps to the optimum; "
                  "score 1 = optimum, 0 = as good as random draws")
    for r in rows:
        random_gap = 100 * (r.random_expectation_ms / r.optimum_ms - 1)
        table.add_row(r.shape, r.strategy, f"{r.fraction:g}", f"{r.budget}/{r.grid_evaluations}",
                      f"{r.optimum_ms:.4f}", f"{random_gap:.1f}", _cell(r.mean_gap_pct, ".1f"),
                      _cell(r.worst_gap_pct, ".1f"), _cell(r.score, ".2f"), f"{r.within_2pct:.0%}")
    return table


def replay(ctx: typer.Context,
           sweep: Annotated[int, typer.Option("--sweep", help="id of a finished grid sweep")],
           fractions: Annotated[str, typer.Option(help="budgets as fractions of the grid's evaluations")] =
           ",".join(f"{f:g}" for f in DEFAULT_FRACTIONS),
           seeds: Annotated[int, typer.Option(help="seeds 0..N-1 per strategy and fraction")] = DEFAULT_SEEDS,
           strategies: Annotated[str, typer.Option(help="comma-separated: random, tpe")] = ",".join(DEFAULT_STRATEGIES),
           json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the rows here")] = None) -> None:
    """Replay random and TPE against a finished grid sweep: how close they get with a fraction of its evaluations."""
    db_url = ctx.find_root().params.get("db") or default_url()
    try:
        with Progress(TextColumn(f"[bold]replay of sweep {sweep}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=display.console, transient=True) as progress:
            task = progress.add_task("replay", total=None)
            rows = replay_sweep(open_database(db_url), sweep, _floats(fractions), seeds,
                                [s.strip() for s in strategies.split(",") if s.strip()],
                                on_run=lambda done, total: progress.update(task, completed=done, total=total))
    except (ReplayError, DatabaseError) as exc:
        fail(str(exc))
    display.console.print(rows_table(sweep, rows))
    if json_out is not None:
        json_out.write_text(json.dumps({"sweep_id": sweep, "rows": [r.as_json() for r in rows]}, indent=1) + "\n")
        display.console.print(f"wrote {json_out}")
