"""Search strategies, all driven by Optuna through ask/tell.

``grid`` walks the whole product of choices (Optuna's GridSampler, shuffled by the seed),
``random`` samples uniformly, ``tpe`` is Optuna's multivariate TPE with the constant-liar
trick so that configs asked ahead for busy workers do not all land on the same spot.
"""

from __future__ import annotations

from typing import Any

import optuna


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler for ask/tell: its ``after_trial`` calls ``study.stop()``, which Optuna only
    allows inside ``optimize``; the runner itself stops asking once the grid is walked."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001 - Optuna's signature
        return None


def make_sampler(name: str, dimensions: dict[str, list[Any]], seed: int) -> optuna.samplers.BaseSampler:
    if name == "grid":
        return AskTellGridSampler(dimensions, seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=10)
    raise ValueError(f"unknown strategy {name!r}; use grid, random or tpe")


def suggest_config(trial: optuna.trial.Trial, dimensions: dict[str, list[Any]]) -> dict[str, Any]:
    """The config Optuna proposes for ``trial``."""
    return {name: trial.suggest_categorical(name, choices) for name, choices in dimensions.items()}
