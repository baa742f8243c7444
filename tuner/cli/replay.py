"""``tuner replay``: replay random and TPE sweeps against a finished grid sweep's measurements (no GPU).

Optuna and the kernels are imported when the command runs; its defaults are ``tuner.sweep.replay``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.cli import display
from tuner.cli.errors import ID_MAX, command_engine, exit_2_on

if TYPE_CHECKING:
    from tuner.cli.display import Fitted
    from tuner.sweep.replay import ReplayRow


def _floats(text: str) -> list[float]:
    from tuner.sweep.replay import ReplayError

    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ReplayError(f"--fractions must be comma-separated numbers, got {text!r}") from None


def rows_table(sweep_id: int, rows: list[ReplayRow]) -> Fitted:
    """Gaps to the grid optimum in %; "random" is the exact expectation for as many uniform draws."""
    from tuner.sweep.replay import HIT_TOLERANCE

    kernels = ", ".join(sorted({r.kernel for r in rows}))
    table = Table("shape", "strategy, fraction", "evals", "optimum ms", "gap %: random, mean, worst", "score",
                  f"<= {HIT_TOLERANCE:.0%}", title=f"replay of grid sweep {sweep_id} ({kernels}): gaps to the "
                  "optimum; score 1 = optimum, 0 = as good as random draws")
    for r in rows:
        random_gap = 100 * (r.random_expectation_ms / r.optimum_ms - 1)
        table.add_row(display.shape_words(r.shape), f"{r.strategy} {r.fraction:g}", f"{r.budget}/{r.grid_evaluations}",
                      f"{r.optimum_ms:.4f}", f"{random_gap:.1f}, {display.cell(r.mean_gap_pct, '.1f')}, "
                      f"{display.cell(r.worst_gap_pct, '.1f')}", display.cell(r.score, ".2f"), f"{r.within_2pct:.0%}")
    return display.fitted(table)


def replay(ctx: typer.Context,
           sweep: Annotated[int, typer.Option("--sweep", help="id of a finished grid sweep", min=1, max=ID_MAX)],
           fractions: Annotated[Optional[str], typer.Option(
               help="budgets as fractions of the grid's evaluations, comma-separated (default: 0.1,0.2,0.4)")] = None,
           seeds: Annotated[Optional[int], typer.Option(
               help="seeds 0..N-1 per strategy and fraction (default: 5)", max=10_000)] = None,
           strategies: Annotated[Optional[str], typer.Option(
               help="comma-separated: random, tpe (default: both)")] = None,
           json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the rows here")] = None) -> None:
    """Replay random and TPE against a finished grid sweep: how close they get with a fraction of its evaluations."""
    from tuner.sweep import replay as replaying

    with exit_2_on((replaying.ReplayError,)):
        if json_out is not None and json_out.is_dir():
            raise replaying.ReplayError(f"--json: {json_out} is a folder, not a file")
        chosen = ([s.strip() for s in strategies.split(",") if s.strip()] if strategies is not None
                  else list(replaying.DEFAULT_STRATEGIES))
        engine = command_engine(ctx)
        with Progress(TextColumn(f"[bold]replay of sweep {sweep}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=display.console, transient=True) as progress:
            task = progress.add_task("replay", total=None)
            rows = replaying.replay_sweep(
                engine, sweep, _floats(fractions) if fractions is not None else list(replaying.DEFAULT_FRACTIONS),
                seeds if seeds is not None else replaying.DEFAULT_SEEDS, chosen,
                on_run=lambda done, total: progress.update(task, completed=done, total=total))
    display.console.print(rows_table(sweep, rows))
    if json_out is not None:
        with exit_2_on((OSError,)):
            json_out.write_text(json.dumps({"sweep_id": sweep, "rows": [r.as_json() for r in rows]}, indent=1) + "\n")
        display.console.print(f"wrote {json_out}")
