"""Which trial the exporter takes per shape when sweeps disagree: the newest sweep's winner by
default, the fastest winner with ``prefer="fastest"``, and a warning line when the newest is slower."""

from __future__ import annotations

import pytest

from db import Sweep, Trial, open_database, session_scope
from tuner.export import best_trials, regressions

SHAPE = "n=100"


def _sweep_with_winner(session, config: dict, retime_ms: float, loser_ms: float) -> int:
    sweep = Sweep(kernel="k", arch="sm_90", spec={}, status="done")
    session.add(sweep)
    session.flush()
    for cfg, ms, winner in ((config, retime_ms, True), ({"BLOCK": 1}, loser_ms, False)):
        session.add(Trial(sweep_id=sweep.id, kernel="k", shape_key=SHAPE, arch="sm_90", config=cfg,
                          identity=f"{sweep.id}-{cfg}", status="ok", median_ms=ms, retime_ms=ms if winner else None,
                          is_winner=winner, metrics={}, versions={}))
    return sweep.id


@pytest.fixture
def engine(tmp_path):
    engine = open_database(f"sqlite:///{tmp_path}/t.db")
    with session_scope(engine) as session:
        _sweep_with_winner(session, {"BLOCK": 64}, retime_ms=1.0, loser_ms=3.0)   # older, faster
        _sweep_with_winner(session, {"BLOCK": 32}, retime_ms=1.5, loser_ms=0.9)   # newer, slower winner
    return engine


def test_newest_winner_by_default_fastest_winner_on_request(engine):
    assert best_trials(engine, "sm_90")[0].config == {"BLOCK": 32}
    # a faster non-winner (screening time only) never beats a re-timed winner
    assert best_trials(engine, "sm_90", "fastest")[0].config == {"BLOCK": 64}


def test_a_slower_newest_winner_is_named(engine):
    (line,) = regressions(engine, "sm_90")
    assert "k n=100" in line and "sweep 2's winner takes 1.5 ms" in line and "sweep 1's 1 ms" in line


def test_no_warning_within_timing_noise(tmp_path):
    engine = open_database(f"sqlite:///{tmp_path}/t.db")
    with session_scope(engine) as session:
        _sweep_with_winner(session, {"BLOCK": 64}, retime_ms=1.0, loser_ms=3.0)
        _sweep_with_winner(session, {"BLOCK": 32}, retime_ms=1.04, loser_ms=3.0)
    assert regressions(engine, "sm_90") == []


def test_unknown_preference_is_refused(engine):
    with pytest.raises(ValueError, match="prefer"):
        best_trials(engine, "sm_90", "oldest")
