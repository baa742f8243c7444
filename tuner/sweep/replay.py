"""Search-efficiency replay: how close random and TPE get to a grid's optimum with a fraction of its evaluations.

A finished grid sweep has measured every config of its space at every shape, so a random or
TPE sweep can be replayed on the CPU against those measurements: each config the sampler asks
for is answered with the grid's stored outcome instead of a benchmark. The replay follows the
live sweep of ``tuner/sweep/runner.py`` step for step, with the same Optuna samplers
(``make_sampler``) and the same ``OptunaSource``:

* the kernel's heuristic default is enqueued as the first trial when the space allows it;
* the sampler proposes only configs the grid did not store as ``pruned`` (a live sweep's
  sampler is given the configs the space allows); should one still be pruned, it is told
  PRUNED and does not use the budget, but it uses one of the ``20 * budget + grid size`` asks
  the source allows;
* a config that failed (``compile_error``, ``crash``, ``timeout``, ``wrong``) is told FAIL and
  counts as an evaluation, with no value;
* a config asked again is answered from its first evaluation and does not count again (a live
  sweep answers it from the database);
* the sweep stops after ``budget`` evaluations or when the asks run out.

Unlike a live sweep on several GPUs, the replay tells every result before the next ask (one
worker, no configs asked ahead), and it compares screening medians (``median_ms``), not the
re-timing of the best few.

The yardstick for a strategy is the expected best of the same number of uniform random draws
without replacement from the grid's ``ok`` configs, computed exactly from order statistics.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from sqlalchemy import Engine, select

from db import SweepStatus, Trial, TrialStatus, session_scope
from kernels import registry
from tuner.sweep import queue
from tuner.sweep.spec import SweepSpec
from tuner.sweep.strategies import Config, OptunaSource, default_in_space, make_sampler

DEFAULT_FRACTIONS = (0.1, 0.2, 0.4)
DEFAULT_SEEDS = 5
DEFAULT_STRATEGIES = ("random", "tpe")
HIT_TOLERANCE = 0.02  # "within 2% of the optimum"


class ReplayError(ValueError):
    """A sweep that cannot be replayed (missing, not a grid, not finished, incomplete) or bad settings."""


@dataclass(frozen=True)
class Outcome:
    status: str
    median_ms: float | None


@dataclass(frozen=True)
class GridMeasurements:
    """Every config of one shape's space, as a finished grid sweep recorded it."""

    kernel: str
    shape: dict[str, int]
    shape_key: str
    dimensions: dict[str, list[Any]]
    outcomes: dict[tuple[Hashable, ...], Outcome]
    default: Config | None  # what a live sweep measures first

    def key(self, config: Config) -> tuple[Hashable, ...]:
        return tuple(config[name] for name in self.dimensions)

    @property
    def evaluations(self) -> int:
        """Configs the grid evaluated (every one its space did not prune)."""
        return sum(o.status != TrialStatus.pruned.value for o in self.outcomes.values())

    @property
    def valid_configs(self) -> list[Config]:
        """The configs the space allows (every one the grid did not store as pruned)."""
        return [dict(zip(self.dimensions, key)) for key, o in self.outcomes.items()
                if o.status != TrialStatus.pruned.value]

    @property
    def ok_times(self) -> list[float]:
        return sorted(o.median_ms for o in self.outcomes.values() if o.status == TrialStatus.ok.value)

    @property
    def optimum_ms(self) -> float:
        return self.ok_times[0]


@dataclass(frozen=True)
class ReplayRun:
    """One replayed sweep: the best time after each evaluation (inf before any ok one)."""

    best_so_far: list[float]
    asks: int
    pruned_asks: int

    @property
    def best_ms(self) -> float:
        return self.best_so_far[-1] if self.best_so_far else math.inf


@dataclass(frozen=True)
class ReplayRow:
    """Per (kernel, shape, strategy, fraction): the best times over seeds against the grid optimum."""

    kernel: str
    shape: str
    strategy: str
    fraction: float
    budget: int  # evaluations allowed: floor(fraction * grid evaluations), at least 1
    grid_evaluations: int
    seeds: int
    optimum_ms: float
    random_expectation_ms: float
    default_gap_pct: float | None  # the enqueued default alone; None when the space cannot express it
    mean_best_ms: float | None  # None when some seed found no ok config
    worst_best_ms: float | None
    mean_gap_pct: float | None
    worst_gap_pct: float | None
    score: float | None  # (mean best - random expectation) / (optimum - random expectation); None if 0/0
    within_2pct: float  # share of seeds whose best is within 2% of the optimum
    mean_asks: float
    mean_pruned_asks: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def load_grid(engine: Engine, sweep_id: int) -> list[GridMeasurements]:
    """The measurements of a finished grid sweep, one entry per shape; ReplayError if it has none to replay."""
    try:
        sweep = queue.get_sweep(engine, sweep_id)
    except queue.SweepNotFound as exc:
        raise ReplayError(str(exc)) from None
    try:
        spec = SweepSpec.model_validate(sweep.spec)
    except ValueError as exc:
        raise ReplayError(f"sweep {sweep_id} has a spec this version cannot read: {exc}") from None
    if spec.strategy.name != "grid":
        raise ReplayError(f"sweep {sweep_id} is a {spec.strategy.name} sweep; "
                          "only a grid sweep has every config measured")
    if spec.budget.max_trials is not None or spec.budget.max_minutes is not None:
        raise ReplayError(f"sweep {sweep_id} is a grid sweep with a budget, so it need not have measured every config")
    if sweep.status != SweepStatus.done.value:
        raise ReplayError(f"sweep {sweep_id} is {sweep.status}, not done")
    kernel = registry.get(spec.kernel)
    space = spec.search_space()
    dimensions = space.dimensions(sweep.arch)
    with session_scope(engine) as session:
        rows = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id)).all()
    grids = []
    for shape in spec.resolved_shapes():
        key = kernel.shape_key(shape)
        outcomes: dict[tuple[Hashable, ...], Outcome] = {}
        for row in rows:
            if row.shape_key != key:
                continue
            if set(row.config) != set(dimensions):
                raise ReplayError(f"sweep {sweep_id} trial {row.id} has parameters {sorted(row.config)}, but the space "
                                  f"of {spec.kernel} on {sweep.arch} now has {sorted(dimensions)}")
            outcomes.setdefault(tuple(row.config[n] for n in dimensions), Outcome(row.status, row.median_ms))
        if len(outcomes) != space.size(sweep.arch):
            raise ReplayError(f"sweep {sweep_id} stored {len(outcomes)} of the {space.size(sweep.arch)} configs of "
                              f"{key}; the space changed since, or the sweep did not finish it")
        grid = GridMeasurements(spec.kernel, shape, key, dimensions, outcomes,
                                default_in_space(kernel.default_config(shape), space, shape, sweep.arch))
        if not grid.ok_times:
            raise ReplayError(f"sweep {sweep_id} has no ok trial at {key}: nothing to compare with")
        grids.append(grid)
    return grids


def replay_search(grid: GridMeasurements, strategy: str, budget: int, seed: int) -> ReplayRun:
    """Replay a ``strategy`` sweep of ``budget`` evaluations against the grid, as the runner would run it live."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # else one INFO line per trial
    with warnings.catch_warnings():  # the multivariate TPE sampler is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(direction="minimize",
                                    sampler=make_sampler(strategy, seed, grid.valid_configs, grid.dimensions))
    source = OptunaSource(study, grid.dimensions, max_asks=20 * budget + len(grid.outcomes))
    if grid.default is not None:
        study.enqueue_trial(grid.default)
    seen: set[tuple[Hashable, ...]] = set()
    best_so_far: list[float] = []
    pruned_asks = 0
    while len(best_so_far) < budget and (proposal := source.propose()) is not None:
        key = grid.key(proposal.config)
        outcome = grid.outcomes[key]
        source.report(proposal, outcome.status, outcome.median_ms)
        if outcome.status == TrialStatus.pruned.value:
            pruned_asks += 1
        elif key not in seen:
            seen.add(key)
            value = outcome.median_ms if outcome.status == TrialStatus.ok.value else math.inf
            best_so_far.append(min(value, best_so_far[-1] if best_so_far else math.inf))
    return ReplayRun(best_so_far, source.asked, pruned_asks)


def expected_best_of_random(times: Sequence[float], draws: int) -> float:
    """Expected minimum of ``draws`` uniform draws without replacement from ``times``, exactly.

    With the times sorted ascending, the i-th smallest (1-based) is the minimum when it is drawn
    and the other draws-1 come from the n-i larger ones: P = C(n-i, draws-1) / C(n, draws).
    More draws than times draw them all.
    """
    if not times or draws < 1:
        raise ValueError(f"need at least one time and one draw, got {len(times)} times and {draws} draws")
    ordered = sorted(times)
    n, k = len(ordered), min(draws, len(ordered))
    total = math.comb(n, k)
    return math.fsum(t * math.comb(n - i, k - 1) for i, t in enumerate(ordered, start=1)) / total


def budget_for(fraction: float, grid_evaluations: int) -> int:
    """Evaluations a fraction of the grid allows: rounded down (never above the fraction), at least one."""
    return max(1, math.floor(fraction * grid_evaluations + 1e-9))


def _gap_pct(best_ms: float, optimum_ms: float) -> float:
    return 100.0 * (best_ms / optimum_ms - 1.0)


def summarize(grid: GridMeasurements, strategy: str, fraction: float, runs: Sequence[ReplayRun]) -> ReplayRow:
    """One table row from the runs of every seed."""
    optimum = grid.optimum_ms
    budget = budget_for(fraction, grid.evaluations)
    expectation = expected_best_of_random(grid.ok_times, budget)
    bests = [r.best_ms for r in runs]
    found = all(math.isfinite(b) for b in bests)
    mean_best = statistics.fmean(bests) if found else None
    worst_best = max(bests) if found else None
    default = grid.outcomes[grid.key(grid.default)] if grid.default is not None else None
    default_ok = default is not None and default.status == TrialStatus.ok.value
    score = None
    if mean_best is not None and not math.isclose(optimum, expectation, rel_tol=1e-12, abs_tol=0.0):
        score = (mean_best - expectation) / (optimum - expectation)
    return ReplayRow(
        kernel=grid.kernel, shape=grid.shape_key, strategy=strategy, fraction=fraction, budget=budget,
        grid_evaluations=grid.evaluations, seeds=len(runs), optimum_ms=optimum, random_expectation_ms=expectation,
        default_gap_pct=_gap_pct(default.median_ms, optimum) if default_ok else None,
        mean_best_ms=mean_best, worst_best_ms=worst_best,
        mean_gap_pct=_gap_pct(mean_best, optimum) if mean_best is not None else None,
        worst_gap_pct=_gap_pct(worst_best, optimum) if worst_best is not None else None,
        score=score, within_2pct=sum(b <= optimum * (1 + HIT_TOLERANCE) for b in bests) / len(runs),
        mean_asks=statistics.fmean(r.asks for r in runs),
        mean_pruned_asks=statistics.fmean(r.pruned_asks for r in runs))


def check_settings(fractions: Sequence[float], seeds: int, strategies: Sequence[str]) -> None:
    """ReplayError for settings no replay can use."""
    bad = [f for f in fractions if not 0 < f <= 1]
    if not fractions or bad:
        raise ReplayError(f"fractions must be in (0, 1], got {list(fractions)}")
    if seeds < 1:
        raise ReplayError(f"seeds must be at least 1, got {seeds}")
    unknown = [s for s in strategies if s not in DEFAULT_STRATEGIES]
    if not strategies or unknown:
        raise ReplayError(f"strategies must be among {list(DEFAULT_STRATEGIES)}, got {list(strategies)}")


def replay_sweep(engine: Engine, sweep_id: int, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                 seeds: int = DEFAULT_SEEDS, strategies: Sequence[str] = DEFAULT_STRATEGIES,
                 on_run: Callable[[int, int], None] | None = None) -> list[ReplayRow]:
    """Replay every shape of grid sweep ``sweep_id`` with each strategy, fraction and seed 0..seeds-1.

    ``on_run(done, total)`` is called after each replayed sweep (for a progress bar).
    """
    check_settings(fractions, seeds, strategies)
    grids = load_grid(engine, sweep_id)
    total, done = len(grids) * len(strategies) * len(fractions) * seeds, 0
    rows = []
    for grid in grids:
        for strategy in strategies:
            for fraction in fractions:
                runs = []
                for seed in range(seeds):
                    runs.append(replay_search(grid, strategy, budget_for(fraction, grid.evaluations), seed))
                    done += 1
                    if on_run is not None:
                        on_run(done, total)
                rows.append(summarize(grid, strategy, fraction, runs))
    return rows
