"""``bench/planner_accuracy.py``: median errors over the right runs, the pick's rank, and an empty database refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.planner_accuracy import accuracy, run


def _run(candidate: str | None, status: str, predicted: float, refit: float, measured: float) -> dict:
    return {"candidate": candidate, "status": status, "predicted ms": predicted, "refit ms": refit,
            "measured ms": measured, "predicted bytes": [2 * predicted], "refit bytes": [2 * refit],
            "measured bytes": [2 * measured]}


def test_errors_split_by_refit_and_oom_runs_left_out() -> None:
    rows = [_run("pick", "ok", 110.0, 100.0, 100.0), _run(None, "ok", 80.0, 90.0, 100.0),
            _run(None, "ok", 95.0, 99.0, 90.0), _run(None, "oom", 50.0, 50.0, 0.0)]
    figures = accuracy(rows, pick_ms=100.0)
    errors = figures["median |error|"]
    assert errors["predicted, all runs"] == {"runs": 3, "step": 0.1, "memory per rank": 0.1}
    assert errors["predicted, outside the refit"]["runs"] == 2
    assert errors["predicted, outside the refit"]["step"] == pytest.approx((0.2 + 5 / 90) / 2, abs=1e-4)
    assert errors["refit, all runs"]["step"] == 0.1
    assert figures["pick rank"] == 2 and figures["measured runs"] == 3
    assert figures["pick vs measured best"] == round(100 / 90 - 1, 4)


def test_no_runs_no_figures() -> None:
    figures = accuracy([], pick_ms=None)
    assert figures["pick rank"] is None and figures["median |error|"]["refit, all runs"]["step"] is None


def test_a_database_without_a_validation_is_refused(tmp_path: Path) -> None:
    args = argparse.Namespace(db=f"sqlite:///{tmp_path / 'tuner.db'}", validation=None)
    with pytest.raises(ValueError, match="run `tuner plan validate` first"):
        run(args)
    with pytest.raises(ValueError, match="no plan validation 7"):
        run(argparse.Namespace(db=args.db, validation=7))
