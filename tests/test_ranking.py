"""Configs ranked by the time of an eager call: the longer of device and host time (``tuner.sweep.ranking``).

On the H200 a table entry chosen by device time alone ran 1.4-1.8x slower in eager calls, because
its host time (TMA descriptors built a call) exceeded its device time; and host times are noisy, so
eager times close together must be decided by device time, not by that noise. These tests check
both, and that the host time measured beside a trial reaches the export and the table.
"""

from __future__ import annotations

import json
import time

import pytest

from db import Sweep, Trial, open_database, session_scope
from tuner.sweep.export import NothingToExport, best_trials, export_table, host_bound_entries
from tuner.sweep.ranking import CallTime, pick, trial_time
from workers.timing import host_ms

SHAPE = "n=100"


def _trial(median_ms: float, host: float | None = None, retime_ms: float | None = None,
           retime_host: float | None = None, **fields) -> Trial:
    metrics = {k: v for k, v in (("host_ms", host), ("retime_host_ms", retime_host)) if v is not None}
    return Trial(kernel="k", shape_key=SHAPE, arch="sm_90", identity=str(fields.get("config")), status="ok",
                 median_ms=median_ms, retime_ms=retime_ms, metrics=metrics, versions={}, **fields)


def test_an_eager_call_costs_the_longer_of_device_and_host_time():
    assert CallTime(0.10, 0.15).ms("eager") == 0.15
    assert CallTime(0.10, 0.05).ms("eager") == 0.10
    assert CallTime(0.10, 0.15).ms("device") == 0.10
    assert CallTime(0.10).ms("eager") == 0.10  # no host time measured (the interpreter, older trials)


def test_a_retimed_trial_ranks_by_its_retiming_host_time_included():
    trial = _trial(0.12, host=0.30, retime_ms=0.11, retime_host=0.13)
    assert trial_time(trial) == CallTime(0.11, 0.13) and trial_time(trial).host_bound
    assert not trial_time(_trial(0.12, host=0.05)).host_bound and not trial_time(_trial(0.12)).host_bound


def test_host_noise_does_not_pick_the_winner():
    """Host-bound configs of one launch path (the compressor's at 4,096: 43-73 us of host time, 8-35 us
    on the device): eager times within HOST_TIE are decided by device time."""
    noisy = [CallTime(0.0105, 0.0436), CallTime(0.0082, 0.0462), CallTime(0.0200, 0.0440)]
    assert pick(noisy, lambda t: t, "eager") is noisy[1]


def test_a_host_cost_beyond_the_noise_loses():
    """The indexer at 4,096: host-built TMA descriptors, 0.11 ms on the device and 0.19 on the host,
    against pointers, 0.125 and 0.07."""
    tma, pointers = CallTime(0.110, 0.190), CallTime(0.125, 0.070)
    assert pick([tma, pointers], lambda t: t, "eager") is pointers
    assert pick([tma, pointers], lambda t: t, "device") is tma


def test_an_unmeasured_host_compares_by_device_time():
    """An entry from before host times were measured must not win by lacking one."""
    old, new = CallTime(0.0098), CallTime(0.0090, 0.0450)
    assert pick([old, new], lambda t: t, "eager") is new


def test_host_ms_times_the_calls_not_the_device():
    """On the CPU a call's whole time is host time: a 2 ms call measures 2 ms, not less."""
    measured = host_ms(lambda: time.sleep(0.002), calls=5, rounds=3)
    assert 2.0 <= measured < 20.0


def _database(tmp_path):
    """One sweep, one shape: a device-fast config whose host time is 0.19 ms a call (TMA descriptors),
    and a pointer config 0.125 ms on the device and 0.07 ms on the host. Neither is a winner, so the
    export takes the fastest ok trial."""
    engine = open_database(f"sqlite:///{tmp_path}/t.db")
    with session_scope(engine) as session:
        sweep = Sweep(kernel="k", arch="sm_90", spec={}, status="done")
        session.add(sweep)
        session.flush()
        session.add_all([_trial(0.110, host=0.190, config={"TMA": 1}, sweep_id=sweep.id),
                         _trial(0.125, host=0.070, config={"TMA": 0}, sweep_id=sweep.id)])
    return engine


def test_export_ranks_by_device_time_by_default_and_eager_calls_when_asked(tmp_path):
    engine = _database(tmp_path)
    assert best_trials(engine, "sm_90")[0].config == {"TMA": 1}
    assert best_trials(engine, "sm_90", rank="eager")[0].config == {"TMA": 0}
    table = json.loads(export_table(engine, "sm_90", tmp_path / "eager", rank="eager")[0].read_text())
    entry = table["entries"]["k"][SHAPE]
    assert entry["config"] == {"TMA": 0} and entry["host_ms"] == 0.070
    assert table["provenance"]["rank"] == "eager" and host_bound_entries(table) == []


def test_a_device_ranked_export_names_its_host_bound_entries(tmp_path):
    engine = _database(tmp_path)
    table = json.loads(export_table(engine, "sm_90", tmp_path / "device")[0].read_text())
    assert table["entries"]["k"][SHAPE]["config"] == {"TMA": 1} and table["provenance"]["rank"] == "device"
    assert host_bound_entries(table) == [f"k {SHAPE}: host-bound, 0.19 ms of host time a call against 0.11 ms on "
                                         "the device"]


def test_merge_compares_the_kept_entries_by_eager_time(tmp_path):
    """A kept entry that is faster on the device but host-bound loses to the database's entry."""
    engine = _database(tmp_path)
    kept = {"config": {"TMA": 2}, "median_ms": 0.100, "retime_ms": None, "host_ms": 0.200}
    for rank, exported in (("eager", {"TMA": 0}), ("device", {"TMA": 2})):
        out = tmp_path / rank
        out.mkdir()
        (out / "sm_90.json").write_text(json.dumps({
            "schema_version": 1, "arch": "sm_90", "entries": {"k": {SHAPE: kept}},
            "provenance": {"exported_at": "x", "devices": [], "sm_counts": [], "hosts": [], "toolchains": []}}))
        table = json.loads(export_table(engine, "sm_90", out, fastest=["k"], merge=True, rank=rank)[0].read_text())
        assert table["entries"]["k"][SHAPE]["config"] == exported, rank


def test_an_unknown_rank_is_refused_and_nothing_written(tmp_path):
    with pytest.raises(NothingToExport, match="--rank: 'fast' is not one of eager, device"):
        export_table(_database(tmp_path), "sm_90", tmp_path / "out", rank="fast")
    assert not (tmp_path / "out").exists()
