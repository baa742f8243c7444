"""Search strategies: where the next config to measure comes from.

Every strategy is a ``ConfigSource`` with the same three calls the runner makes:
``resume`` (configs a killed server left in flight), ``propose`` (the next config, or None
when the strategy is done) and ``report`` (the measured outcome). All of them keep their
trials in an Optuna study stored in the tuner's database, so ``optuna-dashboard`` shows
every sweep.

* ``grid`` walks every config that satisfies the space's constraints, in an order shuffled
  by the seed. Nothing is left to sample, so it skips Optuna's per-parameter ask/suggest
  round-trips and adds each measured config to the study as a finished trial.
* ``random`` and ``tpe`` ask Optuna (ask/tell) through ``ValidConfigSampler``, which proposes
  only configs the space allows and the study has not asked yet; TPE is multivariate with the
  constant-liar trick, so configs asked ahead for busy workers do not all land on the same spot.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
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


TPE_STARTUP_TRIALS = 10


class ValidConfigSampler(optuna.samplers.BaseSampler):
    """Proposes only configs the space allows (``valid``) and the study has not asked yet.

    Sampled over the whole product of the parameters' choices, a constrained space asks pruned
    configs, each a trial that makes the next TPE fit slower: on the H200, TPE asked 1,460 pruned
    configs at a compressor shape with 104 valid of 4,000 and measured none in two minutes, and
    26-45 pruned for every 100 measured at the others.
    Here the start-up draws (all of them for ``random``) are uniform over the unseen valid
    configs; after them TPE's proposal is taken where it is valid and unseen, else the unseen
    valid config nearest to it (fewest choices apart, counted along each parameter's list).
    """

    def __init__(self, valid: Sequence[Config], dimensions: dict[str, list[Any]], seed: int,
                 model: optuna.samplers.TPESampler | None = None, startup_trials: int = TPE_STARTUP_TRIALS) -> None:
        if not valid:
            raise ValueError("a sampler needs at least one valid config")
        self.dimensions = dimensions
        self.distributions = {name: CategoricalDistribution(choices) for name, choices in dimensions.items()}
        self.valid = [self._key(config) for config in valid]
        self.positions = [{choice: i for i, choice in enumerate(choices)} for choices in dimensions.values()]
        self.model, self.startup_trials = model, startup_trials
        self.rng = random.Random(seed)

    def _key(self, params: dict[str, Any]) -> tuple[Hashable, ...]:
        return tuple(params[name] for name in self.dimensions)

    def _distance(self, key: tuple[Hashable, ...], wanted: dict[str, Any]) -> int:
        return sum(abs(position[key[i]] - position[wanted[name]])
                   for i, (name, position) in enumerate(zip(self.dimensions, self.positions)) if name in wanted)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        trials = study.get_trials(deepcopy=False)
        asked = {self._key(t.params) for t in trials if set(t.params) == set(self.dimensions)}
        unseen = [key for key in self.valid if key not in asked] or self.valid
        finished = sum(t.state == TrialState.COMPLETE for t in trials)
        wanted: dict[str, Any] = {}
        if self.model is not None and finished >= self.startup_trials:
            space = self.model.infer_relative_search_space(study, trial)
            wanted = self.model.sample_relative(study, trial, space)
        if wanted:
            distances = [self._distance(key, wanted) for key in unseen]
            nearest = min(distances)
            pick = self.rng.choice([key for key, d in zip(unseen, distances) if d == nearest])
        else:
            pick = self.rng.choice(unseen)
        return dict(zip(self.dimensions, pick))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        raise RuntimeError(f"{param_name} is not a parameter of this sampler's space {sorted(self.dimensions)}")

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.model is not None:
            self.model.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        if self.model is not None:
            self.model.after_trial(study, trial, state, values)


def make_sampler(name: str, seed: int, valid: Sequence[Config],
                 dimensions: dict[str, list[Any]]) -> optuna.samplers.BaseSampler:
    """The sampler of strategy ``name`` over the ``valid`` configs of ``dimensions``."""
    if name == "random":
        return ValidConfigSampler(valid, dimensions, seed)
    if name == "tpe":
        model = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                           n_startup_trials=TPE_STARTUP_TRIALS)
        return ValidConfigSampler(valid, dimensions, seed, model)
    raise ValueError(f"unknown sampling strategy {name!r}; use random or tpe")


def default_in_space(default: Config, space: SearchSpace, shape: dict[str, int], arch: str) -> Config | None:
    """The kernel's heuristic ``default`` config for ``shape`` when the space can express it and allows it.

    Sweeps measure it first, so that a tuned entry is never one the sweep only believes to
    beat the default: with a capped budget the search may not come near it on its own.
    """
    dimensions = space.dimensions(arch)
    config = {name: default.get(name) for name in dimensions}
    if any(config[name] not in choices for name, choices in dimensions.items()):
        return None
    return None if space.violation(config, shape, arch) else config
