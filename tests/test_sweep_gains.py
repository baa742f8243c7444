"""bench.sweep_gains: per shape, a sweep's winner against the heuristic default it measured first."""

from __future__ import annotations

import argparse

import pytest

from bench import sweep_gains
from db import Sweep, Trial, open_database, session_scope
from kernels import registry
from search_spaces import load_space
from tuner.sweep.strategies import default_in_space

SHAPE = {"tokens": 37, "hidden": 96, "topk": 3}


def _args(db, kernels=None):
    return argparse.Namespace(db=db, kernels=kernels, db_note="")


def test_the_winner_is_set_against_the_default_the_sweep_measured(tmp_path):
    kernel = registry.get("moe_combine_fwd")
    default = default_in_space(kernel.default_config(SHAPE), load_space(kernel.name), SHAPE, "sm_90")
    other = {**default, "num_warps": 8 if default["num_warps"] != 8 else 4}
    db = tmp_path / "sweeps.db"
    with session_scope(open_database(f"sqlite:///{db}")) as session:
        sweep = Sweep(kernel=kernel.name, arch="sm_90", spec={}, status="done")
        session.add(sweep)
        session.flush()
        for config, ms, status in ((default, 2.0, "ok"), (other, 1.6, "ok"), ({**other, "BLOCK_T": 1}, 0.1, "wrong")):
            session.add(Trial(sweep_id=sweep.id, kernel=kernel.name, shape_key=kernel.shape_key(SHAPE), arch="sm_90",
                              config=config, identity=str(config), status=status, median_ms=ms, metrics={},
                              versions={}, gpu_name="NVIDIA H100 80GB HBM3"))
    figures = sweep_gains.run(_args(db))
    (row,) = figures["shapes"]
    assert row["ok_trials"] == 2 and row["default_ms"] == 2.0 and row["best_ms"] == 1.6  # a wrong result never wins
    assert row["best_over_default"] == pytest.approx(1.25)
    assert row["best_gb_s"] == pytest.approx(kernel.bytes_moved(SHAPE) / 1.6e6)
    assert figures["kernels"]["moe_combine_fwd"]["geomean"] == pytest.approx(1.25)
    assert figures["measured_on"] == ["NVIDIA H100 80GB HBM3"]
    with pytest.raises(ValueError, match="no finished trial of"):
        sweep_gains.run(_args(db, kernels="rmsnorm_fwd"))


def test_a_missing_database_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="--db: no such file"):
        sweep_gains.run(_args(tmp_path / "nothing.db"))
