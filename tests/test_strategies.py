"""Strategies: the grid walks every valid config once; ask/tell sources resume what a kill left running."""

from __future__ import annotations

import optuna
import pytest

from tuner.serve import optuna_storage
from tuner.strategies import GridSource, OptunaSource, make_sampler

DIMENSIONS = {"BLOCK": [16, 32, 64], "num_warps": [1, 2, 4, 8]}


@pytest.fixture
def storage(tmp_path):
    from db import open_database

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    open_database(url)
    return optuna_storage(url)


def test_grid_proposes_each_remaining_config_once_and_records_it(storage):
    study = optuna.create_study(storage=storage, study_name="grid")
    remaining = [{"BLOCK": b, "num_warps": w} for b in DIMENSIONS["BLOCK"] for w in DIMENSIONS["num_warps"]][2:]
    source = GridSource(study, DIMENSIONS, remaining, seed=3)
    proposed = []
    while (p := source.propose()) is not None:
        proposed.append(p.config)
        source.report(p, "ok" if p.config["BLOCK"] != 64 else "crash", 1.0 + p.config["num_warps"])
    assert sorted(map(str, proposed)) == sorted(map(str, remaining))
    states = [t.state for t in study.get_trials()]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 6 and states.count(optuna.trial.TrialState.FAIL) == 4
    assert (study.best_params, study.best_value) == ({"BLOCK": 32, "num_warps": 1}, 2.0)  # (16, 1) was done before


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_ask_tell_source_resumes_running_trials_and_stops_at_max_asks(storage, strategy):
    study = optuna.create_study(storage=storage, study_name=strategy, sampler=make_sampler(strategy, 0))
    first = OptunaSource(study, DIMENSIONS, max_asks=5)
    in_flight = [first.propose(), first.propose()]
    first.report(in_flight[0], "ok", 3.0)
    # a new server on the same study: the unanswered proposal comes back, the answered one does not
    second = OptunaSource(study, DIMENSIONS, max_asks=5)
    resumed = second.resume()
    assert [p.config for p in resumed] == [in_flight[1].config]
    asked = [second.propose() for _ in range(4)]
    assert asked[-1] is None and all(p is not None for p in asked[:3])  # 2 + 3 = max_asks
