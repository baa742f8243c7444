"""Search-efficiency replay: exact random expectation, replays as the runner would run them, the CLI's errors."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import pytest
from sqlalchemy import delete
from typer.testing import CliRunner

from db import Sweep, Trial, open_database, session_scope
from kernels import registry
from tuner.cli.main import app
from tuner.sweep.replay import (GridMeasurements, Outcome, ReplayError, budget_for, expected_best_of_random, load_grid,
                          replay_search, replay_sweep)
from tuner.sweep.spec import SweepSpec

ARCH = "sm_90"
SINKHORN_SHAPES = [{"tokens": 4096}, {"tokens": 100}]  # 100: a ragged token count


def sinkhorn_time(config: dict, shape: dict, rng: random.Random) -> tuple[str, float]:
    """An invented landscape: a bowl around 64 tokens per program and 2 warps, plus noise."""
    bowl = 0.3 * abs(math.log2(config["BLOCK_N"]) - 6) + 0.2 * abs(math.log2(config["num_warps"]) - 1)
    return "ok", (1 + bowl + 0.05 * (config["maxnreg"] is not None) + rng.uniform(0, 0.1)) * shape["tokens"] / 4096


def probe_outcome(config: dict, shape: dict, rng: random.Random) -> tuple[str, float | None]:
    """fault_probe: the faulty modes fail the way a live sweep records them; ``ok`` gets a time."""
    failed = {"crash": "crash", "hang": "timeout", "wrong": "wrong"}
    if config["MODE"] in failed:
        return failed[config["MODE"]], None
    return "ok", 1.0 + config["BLOCK"] / 64 + rng.uniform(0, 0.01)


def write_sweep(url: str, kernel: str, shapes: list[dict], outcome, status: str = "done",
                strategy: str = "grid", seed: int = 0) -> int:
    """A sweep with every config of the space stored the way the runner stores them; its id."""
    spec = SweepSpec(kernel=kernel, shapes=shapes, arch=ARCH, strategy={"name": strategy},
                     budget={"max_trials": 8} if strategy != "grid" else {})
    space, registered = spec.search_space(), registry.get(kernel)
    rng = random.Random(seed)
    engine = open_database(url)
    with session_scope(engine) as session:
        sweep = Sweep(kernel=kernel, arch=ARCH, spec=spec.model_dump(mode="json"), status=status)
        session.add(sweep)
        session.flush()
        for shape in shapes:
            for i, config in enumerate(space.grid(ARCH)):
                pruned = space.violation(config, shape, ARCH) is not None
                trial_status, median = ("pruned", None) if pruned else outcome(config, shape, rng)
                session.add(Trial(sweep_id=sweep.id, kernel=kernel, shape_key=registered.shape_key(shape), arch=ARCH,
                                  config=config, identity=f"{sweep.id}-{shape}-{i}", status=trial_status,
                                  median_ms=median))
        return sweep.id


def test_expected_best_of_random_matches_brute_force():
    rng = random.Random(7)
    times = [round(rng.uniform(1, 3), 1) for _ in range(8)]  # rounded: ties included
    for draws in range(1, len(times) + 1):
        subsets = list(itertools.combinations(times, draws))
        brute = statistics.fmean(min(s) for s in subsets)
        assert expected_best_of_random(times, draws) == pytest.approx(brute, rel=1e-12), draws
    assert expected_best_of_random(times, 20) == min(times)  # more draws than configs: every one is drawn
    assert expected_best_of_random(times, 1) == pytest.approx(statistics.fmean(times))
    with pytest.raises(ValueError):
        expected_best_of_random([], 1)


def test_budget_is_the_fraction_rounded_down_and_at_least_one():
    assert [budget_for(f, 144) for f in (0.1, 0.2, 0.4, 1.0)] == [14, 28, 57, 144]
    assert [budget_for(f, 18) for f in (0.01, 0.2, 0.5)] == [1, 3, 9]


def test_pruned_asks_are_free_failures_use_the_budget_and_repeats_count_once():
    grid = GridMeasurements(
        kernel="toy", shape={"n": 1}, shape_key="n=1", dimensions={"A": [0, 1, 2, 3, 4, 5]},
        outcomes={(0,): Outcome("pruned", None), (1,): Outcome("pruned", None), (2,): Outcome("crash", None),
                  (3,): Outcome("ok", 3.0), (4,): Outcome("ok", 2.0), (5,): Outcome("ok", 1.0)},
        default={"A": 2})
    for strategy in ("random", "tpe"):
        run = replay_search(grid, strategy, budget=4, seed=0)
        assert len(run.best_so_far) == 4 and run.best_so_far[-1] == 1.0  # the 4 configs not pruned
        assert run.best_so_far[0] == math.inf  # the enqueued default crashed: an evaluation with no value
        assert run.asks >= 4 + run.pruned_asks and run.pruned_asks >= 0
        short = replay_search(grid, strategy, budget=2, seed=0)
        assert len(short.best_so_far) == 2 and short.best_so_far[0] == math.inf


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_replays_are_deterministic_per_seed_and_start_from_the_default(tmp_path, strategy):
    sweep_id = write_sweep(f"sqlite:///{tmp_path / 't.db'}", "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time)
    grid = load_grid(open_database(f"sqlite:///{tmp_path / 't.db'}"), sweep_id)[0]
    assert grid.default is not None and grid.evaluations == 33
    budget = budget_for(0.4, grid.evaluations)
    runs = [replay_search(grid, strategy, budget, seed) for seed in (0, 0, 1, 2)]
    assert runs[0] == runs[1]
    assert len({tuple(r.best_so_far) for r in runs[1:]}) == 3  # the seed matters
    for run in runs:
        assert len(run.best_so_far) == budget
        assert run.best_so_far == sorted(run.best_so_far, reverse=True)  # best so far never gets worse
        assert run.best_so_far[0] == grid.outcomes[grid.key(grid.default)].median_ms
        assert run.best_ms >= grid.optimum_ms


def test_full_budget_finds_the_grid_optimum_and_rows_add_up(db_url):
    sweep_id = write_sweep(db_url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time, seed=3)
    engine = open_database(db_url)
    grids = load_grid(engine, sweep_id)
    calls = []
    rows = replay_sweep(engine, sweep_id, fractions=[0.1, 1.0], seeds=2, strategies=["random", "tpe"],
                        on_run=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (16, 16) and len(rows) == 8
    for row in rows:
        grid = next(g for g in grids if g.shape_key == row.shape)
        assert row.optimum_ms == min(o.median_ms for o in grid.outcomes.values() if o.status == "ok")
        assert row.random_expectation_ms == pytest.approx(expected_best_of_random(grid.ok_times, row.budget))
        if row.fraction == 1.0:
            assert row.budget == grid.evaluations and row.mean_best_ms == row.worst_best_ms == row.optimum_ms
            assert row.mean_gap_pct == 0 and row.within_2pct == 1 and row.score is None  # random E is the optimum too
        else:
            runs = [replay_search(grid, row.strategy, row.budget, seed) for seed in range(2)]
            assert row.mean_best_ms == pytest.approx(statistics.fmean(r.best_ms for r in runs))
            assert row.worst_gap_pct == pytest.approx(100 * (max(r.best_ms for r in runs) / row.optimum_ms - 1))
            assert row.within_2pct == sum(r.best_ms <= 1.02 * row.optimum_ms for r in runs) / 2
            expected = (row.mean_best_ms - row.random_expectation_ms) / (row.optimum_ms - row.random_expectation_ms)
            assert row.score == pytest.approx(expected)


def test_failed_configs_are_evaluations_and_the_full_budget_still_finds_the_optimum(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    sweep_id = write_sweep(url, "fault_probe", [{"n": 100}], probe_outcome)
    (grid,) = load_grid(open_database(url), sweep_id)
    assert grid.evaluations == 5 and len(grid.ok_times) == 2  # 3 pruned, 3 failed
    for strategy in ("random", "tpe"):
        for seed in range(3):
            run = replay_search(grid, strategy, grid.evaluations, seed)
            assert len(run.best_so_far) == 5 and run.best_ms == grid.optimum_ms


def run_cli(url: str, *args: str):
    return CliRunner().invoke(app, ["--db", url, "replay", *args])


def test_cli_prints_the_table_and_writes_json(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    sweep_id = write_sweep(url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time)
    out = tmp_path / "replay.json"
    result = run_cli(url, "--sweep", str(sweep_id), "--fractions", "0.2", "--seeds", "2", "--strategies", "tpe",
                     "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "replay of grid sweep" in result.output and "sinkhorn_fwd" in result.output  # rows: narrow terminal
    payload = json.loads(out.read_text())
    assert payload["sweep_id"] == sweep_id and [r["shape"] for r in payload["rows"]] == ["tokens=4096", "tokens=100"]
    assert payload["rows"][0]["budget"] == 6  # a fifth of tokens=4096's 33 valid configs
    assert all(r["strategy"] == "tpe" and r["budget"] == budget_for(0.2, r["grid_evaluations"]) and r["seeds"] == 2
               for r in payload["rows"])


def test_cli_rejects_what_it_cannot_replay_with_exit_2(db_url):
    grid_id = write_sweep(db_url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time)
    tpe_id = write_sweep(db_url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time, strategy="tpe")
    running_id = write_sweep(db_url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time, status="running")
    broken_id = write_sweep(db_url, "sinkhorn_fwd", SINKHORN_SHAPES, sinkhorn_time)
    with session_scope(open_database(db_url)) as session:
        first = session.query(Trial.id).filter(Trial.sweep_id == broken_id).order_by(Trial.id).first()[0]
        session.execute(delete(Trial).where(Trial.id == first))
    cases = [
        (["--sweep", "999"], "no sweep with id 999"),
        (["--sweep", str(tpe_id)], "is a tpe sweep"),
        (["--sweep", str(running_id)], "is running, not done"),
        (["--sweep", str(broken_id)], "stored 104 of the 105 configs of tokens=4096"),
        (["--sweep", str(grid_id), "--fractions", "0.2,1.5"], "fractions must be in (0, 1]"),
        (["--sweep", str(grid_id), "--fractions", "a"], "comma-separated numbers"),
        (["--sweep", str(grid_id), "--seeds", "0"], "seeds must be at least 1"),
        (["--sweep", str(grid_id), "--strategies", "grid"], "strategies must be among"),
    ]
    for args, reason in cases:
        result = run_cli(db_url, *args)
        assert result.exit_code == 2 and reason in result.output, (args, result.output)
    with pytest.raises(ReplayError, match="is a tpe sweep"):
        load_grid(open_database(db_url), tpe_id)
