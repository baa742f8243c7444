"""`tuner sweep status`: where a shape's best sits at an edge of what its sweep measured."""

from __future__ import annotations

from rich.console import Console

from db import Sweep, Trial
from tuner.cli import display


def test_edges_name_the_least_and_greatest_numeric_values_measured():
    measured = [{"WARPS": w, "FLAG": w % 2, "ORDER": o, "maxnreg": r}
                for w, o, r in ((1, "row", None), (2, "col", 128), (4, "tile", 168), (8, "row", 232))]
    best = {"WARPS": 1, "FLAG": 1, "ORDER": "tile", "maxnreg": 232}
    assert display.edges(best, measured) == ["WARPS=1 (least tried)", "maxnreg=232 (most tried)"]
    assert display.edges({**best, "WARPS": 8, "maxnreg": None}, measured) == ["WARPS=8 (most tried)"]
    # Two values (a switch), strings, a middle value: no hint; nor with fewer than three values measured.
    assert display.edges({**best, "WARPS": 4, "maxnreg": 168}, measured) == []
    assert display.edges(best, measured[:2]) == []


def _rows(text: str) -> dict[str, str]:
    """The rendered text of each shape's row (its cells may wrap over several lines), by shape."""
    rows: dict[str, str] = {}
    shape = None
    for line in text.splitlines():
        first = line.strip("│ ").split(" ")[0]
        if first.startswith("n="):
            shape = first
        if shape and line.startswith("│"):
            rows[shape] = rows.get(shape, "") + " " + " ".join(cell.strip() for cell in line.split("│"))
    return rows


def test_status_shows_where_each_shape_best_sits_at_an_edge():
    sweep = Sweep(id=7, kernel="probe", arch="sm_90", status="done", spec={})
    trials = [Trial(shape_key=key, status="ok", median_ms=ms, config={"WARPS": warps, "num_stages": 1})
              for key, warps, ms in (("n=1", 1, 0.5), ("n=1", 2, 0.7), ("n=1", 4, 0.9),
                                     ("n=2", 1, 0.8), ("n=2", 2, 0.4), ("n=2", 4, 0.6))]
    console = Console(record=True, width=250)
    console.print(display.status_table(sweep, trials, {"n=1": 3, "n=2": 3}))
    lines = _rows(console.export_text())
    assert "WARPS=1 (least tried)" in lines["n=1"]
    assert "tried)" not in lines["n=2"]


def test_status_shows_the_best_configs_host_time_and_whether_it_is_host_bound():
    sweep = Sweep(id=8, kernel="probe", arch="sm_90", status="done", spec={})
    trials = [Trial(shape_key="n=1", status="ok", median_ms=0.01, config={"WARPS": 1}, metrics={"host_ms": 0.045}),
              Trial(shape_key="n=2", status="ok", median_ms=0.2, config={"WARPS": 1}, metrics={"host_ms": 0.06}),
              Trial(shape_key="n=3", status="ok", median_ms=0.2, config={"WARPS": 1}, metrics={})]
    console = Console(record=True, width=250)
    console.print(display.status_table(sweep, trials, {"n=1": 1, "n=2": 1, "n=3": 1}))
    lines = _rows(console.export_text())
    assert "0.0450 host-bound" in lines["n=1"]
    assert "0.0600" in lines["n=2"] and "host-bound" not in lines["n=2"]
    assert "host-bound" not in lines["n=3"]


def test_progress_in_a_log_is_a_line_per_new_best_last_count_or_few_seconds():
    import io
    import re

    from rich.progress import Progress

    log = io.StringIO()
    now = [0.0]
    with Progress(console=Console(file=log, force_terminal=False, width=200)) as progress:
        update = display.progress_callback(progress, 3, "rmsnorm_fwd", clock=lambda: now[0])
        update("n=64", 0, 6, None)  # the first count
        update("n=64", 1, 6, 0.25)  # a new best
        update("n=64", 1, 6, 0.25)  # the same count again: no new line
        update("n=64", 2, 6, 0.25)  # nothing new, a moment later: no line
        now[0] = display.LOG_EVERY_S
        update("n=64", 3, 6, 0.25)  # nothing new, but seconds since the last line
        update("n=64", 4, 6, 0.125)  # a new best
        update("n=64", 6, 6, 0.125)  # the last count
    lines = [line for line in log.getvalue().splitlines() if "sweep 3" in line and "/6" in line]
    assert [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in lines] == [
        "sweep 3 rmsnorm_fwd n=64: 0/6, best -", "sweep 3 rmsnorm_fwd n=64: 1/6, best 0.2500 ms",
        "sweep 3 rmsnorm_fwd n=64: 3/6, best 0.2500 ms", "sweep 3 rmsnorm_fwd n=64: 4/6, best 0.1250 ms",
        "sweep 3 rmsnorm_fwd n=64: 6/6, best 0.1250 ms"]
    terminal = io.StringIO()
    with Progress(console=Console(file=terminal, force_terminal=True, width=200)) as progress:
        display.progress_callback(progress, 3, "rmsnorm_fwd")("n=64", 1, 5, 0.25)
    assert ": 1/5, best" not in terminal.getvalue()  # a terminal has the bar alone
