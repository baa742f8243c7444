"""Strategies: the grid walks every valid config once; ask/tell sources resume what a kill left running."""

from __future__ import annotations

import optuna
import pytest

from tuner.sweep.serve import optuna_storage
from tuner.sweep.strategies import GridSource, OptunaSource, ValidConfigSampler, make_sampler

DIMENSIONS = {"BLOCK": [16, 32, 64], "num_warps": [1, 2, 4, 8]}
EVERY_CONFIG = [{"BLOCK": b, "num_warps": w} for b in DIMENSIONS["BLOCK"] for w in DIMENSIONS["num_warps"]]


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
    study = optuna.create_study(storage=storage, study_name=strategy, sampler=make_sampler(strategy, 0, EVERY_CONFIG, DIMENSIONS))
    first = OptunaSource(study, DIMENSIONS, max_asks=5)
    in_flight = [first.propose(), first.propose()]
    first.report(in_flight[0], "ok", 3.0)
    # a new server on the same study: the unanswered proposal comes back, the answered one does not
    second = OptunaSource(study, DIMENSIONS, max_asks=5)
    resumed = second.resume()
    assert [p.config for p in resumed] == [in_flight[1].config]
    asked = [second.propose() for _ in range(4)]
    assert asked[-1] is None and all(p is not None for p in asked[:3])  # 2 + 3 = max_asks


# A 10 x 10 space whose constraint allows half of it, like a register bound: A + B even.
GRID_10 = {"A": list(range(10)), "B": list(range(10))}
EVEN_SUM = [{"A": a, "B": b} for a in range(10) for b in range(10) if (a + b) % 2 == 0]


def _bowl(config):
    return (config["A"] - 3) ** 2 + (config["B"] - 7) ** 2 + 1.0


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_sampled_strategies_ask_only_valid_unseen_configs(strategy):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler(strategy, 1, EVEN_SUM, GRID_10))
    source = OptunaSource(study, GRID_10, max_asks=len(EVEN_SUM))
    asked = []
    while (proposal := source.propose()) is not None:
        asked.append(proposal.config)
        source.report(proposal, "ok", _bowl(proposal.config))
    assert len(asked) == len(EVEN_SUM) and sorted(map(str, asked)) == sorted(map(str, EVEN_SUM))


def test_tpe_after_startup_moves_toward_the_optimum():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler("tpe", 2, EVEN_SUM, GRID_10))
    source = OptunaSource(study, GRID_10, max_asks=30)
    values = []
    while (proposal := source.propose()) is not None:
        values.append(_bowl(proposal.config))
        source.report(proposal, "ok", values[-1])
    startup, modelled = values[:10], values[10:]
    assert sum(modelled) / len(modelled) < 0.75 * sum(startup) / len(startup)  # unseen only: it must spread
    assert min(values) <= 2.0  # the optimum (3, 7) or a neighbour at distance 1


class _FixedModel:
    """A stand-in for TPE that always proposes ``wanted``."""

    def __init__(self, wanted):
        self.wanted = wanted

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, space):
        return dict(self.wanted)

    def before_trial(self, study, trial):
        pass

    def after_trial(self, study, trial, state, values):
        pass


@pytest.mark.parametrize(("wanted", "expected"), [
    ({"A": 4, "B": 6}, [{"A": 4, "B": 6}]),  # valid and unseen: taken as it is
    ({"A": 0, "B": 1}, [{"A": 0, "B": 0}, {"A": 1, "B": 1}, {"A": 0, "B": 2}]),  # invalid: a nearest valid one
    ({"A": 9}, [{"A": 9, "B": b} for b in (1, 3, 5, 7, 9)]),  # a partial proposal: nearest on what it names
])
def test_a_model_proposal_is_taken_or_moved_to_the_nearest_valid_config(wanted, expected):
    sampler = ValidConfigSampler(EVEN_SUM, GRID_10, seed=0, model=_FixedModel(wanted), startup_trials=0)
    study = optuna.create_study(sampler=sampler)
    trial = study.ask()
    config = {name: trial.suggest_categorical(name, choices) for name, choices in GRID_10.items()}
    assert config in expected


def test_a_proposal_already_asked_moves_to_the_nearest_unseen_config():
    sampler = ValidConfigSampler(EVEN_SUM, GRID_10, seed=0, model=_FixedModel({"A": 4, "B": 6}), startup_trials=0)
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial({"A": 4, "B": 6})
    first, second = study.ask(), study.ask()
    configs = [{name: t.suggest_categorical(name, c) for name, c in GRID_10.items()} for t in (first, second)]
    assert configs[0] == {"A": 4, "B": 6}
    assert configs[1] in [{"A": 3, "B": 5}, {"A": 5, "B": 5}, {"A": 3, "B": 7}, {"A": 5, "B": 7},
                          {"A": 4, "B": 4}, {"A": 4, "B": 8}, {"A": 2, "B": 6}, {"A": 6, "B": 6}]
