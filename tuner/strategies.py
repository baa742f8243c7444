"""Search strategies: where the next config to measure comes from.

Every strategy is a ``ConfigSource`` with the same three calls the runner makes:
``resume`` (configs a killed server left in flight), ``propose`` (the next config, or None
when the strategy is done) and ``report`` (the measured outcome). All of them keep their
trials in an Optuna study stored in the tuner's database, so ``optuna-dashboard`` shows
every sweep.

* ``grid`` walks every config that satisfies the space's constraints, in an order shuffled
  by the seed. Nothing is left to sample, so it skips Optuna's per-parameter ask/suggest
  round-trips and adds each measured config to the study as a finished trial.
* ``random`` and ``tpe`` ask Optuna (ask/tell); TPE is multivariate with the constant-liar
  trick, so configs asked ahead for busy workers do not all land on the same spot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

if TYPE_CHECKING:
    from kernels.registry import TunableKernel
    from search_spaces import SearchSpace

Config = dict[str, Any]


@dataclass
class Proposal:
    """A config to measure, with the Optuna trial it answers (None for grid)."""

    config: Config
    trial_number: int | None = None


class ConfigSource(Protocol):
    def resume(self) -> list[Proposal]: ...

    def propose(self) -> Proposal | None: ...

    def report(self, proposal: Proposal, status: str, median_ms: float | None) -> None: ...


class GridSource:
    """Every valid config once, shuffled by the seed, ``first`` (if still remaining) before the others;
    ``remaining`` excludes configs already done."""

    def __init__(self, study: optuna.Study, dimensions: dict[str, list[Any]], remaining: list[Config], seed: int,
                 first: Config | None = None) -> None:
        self.study = study
        self.distributions = {name: CategoricalDistribution(choices) for name, choices in dimensions.items()}
        self.queue = list(remaining)
        random.Random(seed).shuffle(self.queue)
        if first in self.queue:
            self.queue.remove(first)
            self.queue.append(first)  # popped first

    def resume(self) -> list[Proposal]:
        return []  # the database says what is done; everything else is still in ``queue``

    def propose(self) -> Proposal | None:
        return Proposal(self.queue.pop()) if self.queue else None

    def report(self, proposal: Proposal, status: str, median_ms: float | None) -> None:
        ok = status == "ok"
        self.study.add_trial(optuna.trial.create_trial(
            params=proposal.config, distributions=self.distributions,
            value=median_ms if ok else None, state=TrialState.COMPLETE if ok else TrialState.FAIL))


class OptunaSource:
    """Ask/tell over an Optuna sampler, at most ``max_asks`` asks (duplicates and pruned included)."""

    def __init__(self, study: optuna.Study, dimensions: dict[str, list[Any]], max_asks: int) -> None:
        self.study, self.dimensions, self.max_asks = study, dimensions, max_asks
        self.asked = len(study.get_trials(deepcopy=False))

    def resume(self) -> list[Proposal]:
        proposals = []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if set(trial.params) == set(self.dimensions):
                proposals.append(Proposal(dict(trial.params), trial.number))
            else:  # killed between ask and suggest: nothing to measure
                self.study.tell(trial.number, state=TrialState.FAIL)
        return proposals

    def propose(self) -> Proposal | None:
        if self.asked >= self.max_asks:
            return None
        trial = self.study.ask()
        self.asked += 1
        config = {name: trial.suggest_categorical(name, choices) for name, choices in self.dimensions.items()}
        return Proposal(config, trial.number)

    def report(self, proposal: Proposal, status: str, median_ms: float | None) -> None:
        if status == "ok":
            self.study.tell(proposal.trial_number, median_ms)
        elif status == "pruned":
            self.study.tell(proposal.trial_number, state=TrialState.PRUNED)
        else:
            self.study.tell(proposal.trial_number, state=TrialState.FAIL)


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=10)
    raise ValueError(f"unknown sampling strategy {name!r}; use random or tpe")


def default_in_space(kernel: TunableKernel, space: SearchSpace, shape: dict[str, int], arch: str) -> Config | None:
    """The kernel's heuristic default for ``shape`` when the space can express it and allows it.

    Sweeps measure it first, so that a tuned entry is never one the sweep only believes to
    beat the default: with a capped budget the search may not come near it on its own.
    """
    dimensions = space.dimensions(arch)
    default = kernel.default_config(shape)
    config = {name: default.get(name) for name in dimensions}
    if any(config[name] not in choices for name, choices in dimensions.items()):
        return None
    return None if space.violation(config, shape, arch) else config
