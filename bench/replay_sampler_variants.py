"""TPE sampler settings replayed against the stored grid sweeps: does another setting than the
product's (``tuner.sweep.strategies.make_sampler``: multivariate, constant liar, 10 startup trials)
get within 2% of the grid optimum more often at 10% and 20% of the grid's evaluations? Each
variant runs inside the product's ``ValidConfigSampler``, as TPE does in a sweep.

Usage: python bench/replay_sampler_variants.py SWEEP_DB_URL SWEEP_ID[,SWEEP_ID...] [SEEDS] > out.txt
(the replay of ``tuner replay``, with the sampler swapped; no GPU; read-only on the database).
"""

from __future__ import annotations

import statistics
import sys
import warnings

import optuna

import tuner.sweep.replay as replay
from db import open_database
from tuner.sweep.strategies import ValidConfigSampler

VARIANTS = {  # TPESampler keyword arguments
    "product (startup 10)": dict(multivariate=True, constant_liar=True, n_startup_trials=10),
    "startup 5": dict(multivariate=True, constant_liar=True, n_startup_trials=5),
    "startup 3": dict(multivariate=True, constant_liar=True, n_startup_trials=3),
    "startup 5, group": dict(multivariate=True, group=True, constant_liar=True, n_startup_trials=5),
    "startup 5, 48 EI candidates": dict(multivariate=True, constant_liar=True, n_startup_trials=5, n_ei_candidates=48),
}


def main(url: str, sweeps: str, seeds: int = 5) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    grids = [g for s in sweeps.split(",") for g in replay.load_grid(open_database(url), int(s))]
    print("grids:", ", ".join(f"{g.kernel} {g.shape_key} ({g.evaluations})" for g in grids))
    print("| variant | fraction | seeds within 2%, per grid | mean share | mean gap % |")
    print("|---|---|---|---|---|")
    for name, kwargs in VARIANTS.items():
        replay.make_sampler = lambda strategy, seed, valid, dimensions, kwargs=kwargs: ValidConfigSampler(
            valid, dimensions, seed, optuna.samplers.TPESampler(seed=seed, **kwargs), kwargs["n_startup_trials"])
        for fraction in (0.1, 0.2):
            rows = [replay.summarize(g, "tpe", fraction, [replay.replay_search(
                g, "tpe", replay.budget_for(fraction, g.evaluations), seed) for seed in range(seeds)]) for g in grids]
            hits = [round(r.within_2pct * seeds) for r in rows]
            print(f"| {name} | {fraction:.0%} | {' '.join(map(str, hits))} | "
                  f"{statistics.fmean(r.within_2pct for r in rows):.2f} | "
                  f"{statistics.fmean(r.mean_gap_pct for r in rows):.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
