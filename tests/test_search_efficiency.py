"""``bench/search_efficiency.py``: a replay of a stored grid sweep into the TPE target, and bad input refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.search_efficiency import run, summarize
from tests.test_replay import SINKHORN_SHAPES, sinkhorn_time, write_sweep


def test_a_stored_grid_replays_into_the_target(tmp_path: Path) -> None:
    db = tmp_path / "grid.db"
    sweep_id = write_sweep(f"sqlite:///{db}", "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time, seed=3)
    figures = run(argparse.Namespace(db=db, sweeps=str(sweep_id), seeds=2))
    assert len(figures["replay"]) == len(SINKHORN_SHAPES) * 2 * 3  # shapes x (random, tpe) x fractions
    tpe = [row for key, row in figures["replay"].items() if key.endswith("tpe 0.2")]
    [target] = figures["targets"]
    met = sum(row["seeds within 2%"] == 1 for row in tpe)
    assert target["measured"] == f"{met} of {len(tpe)} grids on every one of 2 seeds"
    assert target["status"] == ("met" if met == len(tpe) else "missed")


def test_summary_misses_when_one_grid_misses_on_one_seed() -> None:
    row = {"kernel": "k", "strategy": "tpe", "fraction": 0.2, "seeds": 5, "budget": 2, "grid_evaluations": 10,
           "random_expectation_ms": 1.5, "optimum_ms": 1.0, "mean_gap_pct": 0.5, "worst_gap_pct": 3.0, "score": 0.9}
    figures = summarize([{**row, "shape": "a", "within_2pct": 1.0}, {**row, "shape": "b", "within_2pct": 0.8}])
    assert figures["targets"][0]["measured"] == "1 of 2 grids on every one of 5 seeds"
    assert figures["targets"][0]["status"] == "missed"
    assert figures["replay"]["k b tpe 0.2"]["random expected gap %"] == 50.0


@pytest.mark.parametrize("sweeps, message", [("x", "comma-separated sweep ids"), ("99", "--sweeps: ")])
def test_bad_input_is_refused(tmp_path: Path, sweeps: str, message: str) -> None:
    with pytest.raises(ValueError, match="--db: no such file"):
        run(argparse.Namespace(db=tmp_path / "missing.db", sweeps="1", seeds=2))
    db = tmp_path / "grid.db"
    write_sweep(f"sqlite:///{db}", "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time)
    with pytest.raises(ValueError, match=message):
        run(argparse.Namespace(db=db, sweeps=sweeps, seeds=2))
