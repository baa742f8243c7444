"""Which trial the exporter takes per shape when sweeps disagree: the newest sweep's winner by
default, the fastest winner of any sweep for the kernels named in ``fastest``, and a warning line
for every exported entry that an older sweep's winner beats."""

from __future__ import annotations

import json

import pytest

from db import Sweep, Trial, open_database, session_scope
from tuner.sweep.export import ExportError, NothingToExport, best_trials, export_table

SHAPE = "n=100"


def _sweep_with_winner(session, kernel: str, config: dict, retime_ms: float, loser_ms: float) -> None:
    sweep = Sweep(kernel=kernel, arch="sm_90", spec={}, status="done")
    session.add(sweep)
    session.flush()
    for cfg, ms, winner in ((config, retime_ms, True), ({"BLOCK": 1}, loser_ms, False)):
        session.add(Trial(sweep_id=sweep.id, kernel=kernel, shape_key=SHAPE, arch="sm_90", config=cfg,
                          identity=f"{sweep.id}-{cfg}", status="ok", median_ms=ms, retime_ms=ms if winner else None,
                          is_winner=winner, metrics={}, versions={}))


def _database(tmp_path, newer_winner_ms: float):
    engine = open_database(f"sqlite:///{tmp_path}/t.db")
    with session_scope(engine) as session:
        for kernel in ("a", "b"):
            _sweep_with_winner(session, kernel, {"BLOCK": 64}, retime_ms=1.0, loser_ms=3.0)  # older, faster
        for kernel in ("a", "b"):  # newer sweeps: a slower winner, and a loser faster by screening time only
            _sweep_with_winner(session, kernel, {"BLOCK": 32}, retime_ms=newer_winner_ms, loser_ms=0.9)
    return engine


def _configs(trials) -> dict[str, dict]:
    return {t.kernel: t.config for t in trials}


def test_newest_winner_by_default_fastest_winner_where_asked(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    assert _configs(best_trials(engine, "sm_90")) == {"a": {"BLOCK": 32}, "b": {"BLOCK": 32}}
    assert _configs(best_trials(engine, "sm_90", ["a"])) == {"a": {"BLOCK": 64}, "b": {"BLOCK": 32}}
    assert _configs(best_trials(engine, "sm_90", ["all"])) == {"a": {"BLOCK": 64}, "b": {"BLOCK": 64}}


def test_export_names_the_entries_an_older_winner_beats(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    path, slower = export_table(engine, "sm_90", tmp_path / "out", fastest=["a"])
    table = json.loads(path.read_text())
    assert table["entries"]["a"][SHAPE]["config"] == {"BLOCK": 64}
    assert table["provenance"]["fastest_kernels"] == ["a"]
    (line,) = slower
    assert line.startswith("b n=100: sweep 4's winner takes 1.5 ms, sweep 2's 1 ms")


def test_no_warning_within_timing_noise(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.04)
    assert export_table(engine, "sm_90", tmp_path / "out")[1] == []


def test_unknown_fastest_kernel_is_refused_and_nothing_written(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    with pytest.raises(NothingToExport, match="--fastest: no ok trials of \\['c'\\]"):
        export_table(engine, "sm_90", tmp_path / "out", fastest=["c"])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_merge_takes_a_fastest_kernel_only_the_kept_table_has(tmp_path):
    """A device call that sweeps one kernel and exports with ``--fastest`` for two: the other's
    entries come from the kept table; a name in neither is still refused."""
    engine = _database(tmp_path, newer_winner_ms=1.5)
    out = tmp_path / "out"
    _previous_table(out, {"c": {"n=1": {"config": {"BLOCK": 2}}}})
    table = json.loads(export_table(engine, "sm_90", out, fastest=["a", "c"], merge=True)[0].read_text())
    assert table["entries"]["c"] == {"n=1": {"config": {"BLOCK": 2}}} and "a" in table["entries"]
    with pytest.raises(NothingToExport, match="--fastest: no ok trials of \\['d'\\] for arch 'sm_90' in the database or"):
        export_table(engine, "sm_90", out, fastest=["d"], merge=True)


def _previous_table(path, entries: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "sm_90.json").write_text(json.dumps({
        "schema_version": 1, "arch": "sm_90", "entries": entries,
        "provenance": {"exported_at": "2026-11-30T06:39:18+00:00", "devices": ["NVIDIA H200"], "sm_counts": [132],
                       "hosts": ["old"], "sweep_ids": [81], "toolchains": [{"triton": "3.6.0"}]}}))


def test_merge_keeps_the_old_entries_the_database_cannot_replace(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    out = tmp_path / "out"
    _previous_table(out, {"a": {SHAPE: {"config": {"BLOCK": 8}}, "n=7": {"config": {"BLOCK": 4}}},
                          "c": {"n=1": {"config": {"BLOCK": 2}}}, "skipped": {"n=1": {"config": {"BLOCK": 2}}}})
    path, _ = export_table(engine, "sm_90", out, skip=["skipped"], merge=True)
    table = json.loads(path.read_text())
    assert table["entries"]["a"][SHAPE]["config"] == {"BLOCK": 32}  # the database's winner replaces the old entry
    assert table["entries"]["a"]["n=7"]["config"] == {"BLOCK": 4}
    assert table["entries"]["c"] == {"n=1": {"config": {"BLOCK": 2}}}
    assert "skipped" not in table["entries"]
    provenance = table["provenance"]
    assert provenance["kept_from"] == {"exported_at": "2026-11-30T06:39:18+00:00", "sweep_ids": [81],
                                       "entries": {"a": 1, "c": 1}}
    assert provenance["sweep_ids"] == [3, 4] and "old" in provenance["hosts"]


def test_without_merge_the_old_table_is_replaced(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    _previous_table(tmp_path / "out", {"c": {"n=1": {"config": {"BLOCK": 2}}}})
    table = json.loads(export_table(engine, "sm_90", tmp_path / "out", merge=False)[0].read_text())
    assert set(table["entries"]) == {"a", "b"} and "kept_from" not in table["provenance"]


def test_merge_refuses_a_table_of_another_arch_and_writes_nothing(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    out = tmp_path / "out"
    out.mkdir()
    (out / "sm_90.json").write_text(json.dumps({"schema_version": 1, "arch": "gfx942", "entries": {}}))
    with pytest.raises(ExportError, match="arch is 'gfx942', not 'sm_90'"):
        export_table(engine, "sm_90", out, merge=True)
    assert json.loads((out / "sm_90.json").read_text())["arch"] == "gfx942"


def test_merging_a_merged_table_keeps_its_provenance_chain(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    out = tmp_path / "out"
    _previous_table(out, {"c": {"n=1": {"config": {"BLOCK": 2}}}})
    export_table(engine, "sm_90", out, merge=True)
    table = json.loads(export_table(engine, "sm_90", out, merge=True)[0].read_text())
    chain = table["provenance"]["kept_from"]
    assert chain["entries"] == {"c": 1} and chain["sweep_ids"] == [3, 4]
    assert chain["kept_from"]["sweep_ids"] == [81] and chain["kept_from"]["entries"] == {"c": 1}



def test_merge_names_a_faster_kept_entry_and_keeps_it_for_fastest_kernels(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)  # a: 1 ms with --fastest a; b: the newest winner, 1.5 ms
    out = tmp_path / "out"
    _previous_table(out, {"a": {SHAPE: {"config": {"BLOCK": 8}, "median_ms": 0.7, "retime_ms": 0.8}},
                          "b": {SHAPE: {"config": {"BLOCK": 8}, "median_ms": 1.1, "retime_ms": 1.2}}})
    path, slower = export_table(engine, "sm_90", out, fastest=["a"], merge=True)
    table = json.loads(path.read_text())
    assert table["entries"]["a"][SHAPE]["config"] == {"BLOCK": 8}  # 0.8 ms (re-timed) beats the database's 1 ms
    assert table["entries"]["b"][SHAPE]["config"] == {"BLOCK": 32}  # b is not in --fastest: the newest winner
    assert table["provenance"]["kept_from"]["entries"] == {"a": 1}
    assert [line for line in slower if "merged table" in line] == [
        "b n=100: this export's entry takes 1.5 ms, the merged table's 1.2 ms"]


def test_merge_says_nothing_of_a_kept_entry_within_timing_noise(tmp_path):
    engine = _database(tmp_path, newer_winner_ms=1.5)
    out = tmp_path / "out"
    _previous_table(out, {"b": {SHAPE: {"config": {"BLOCK": 8}, "median_ms": 1.45, "retime_ms": None}}})
    path, slower = export_table(engine, "sm_90", out, merge=True)
    assert json.loads(path.read_text())["entries"]["b"][SHAPE]["config"] == {"BLOCK": 32}
    assert not [line for line in slower if "merged table" in line]


def test_quickstart_export_twice_over_a_copy_of_the_shipped_table_keeps_every_kernel(tmp_path):
    """Quickstart's export path (``export_table`` with its defaults) run twice into a folder holding a
    copy of the shipped sm_90 table: every shipped kernel stays, and the database's winners replace only the
    entries of their own (kernel, shape)."""
    from kernels.tuning import SHIPPED_TABLES, read_table

    shipped = read_table(SHIPPED_TABLES / "sm_90.json")
    out = tmp_path / "tables"
    out.mkdir()
    (out / "sm_90.json").write_bytes((SHIPPED_TABLES / "sm_90.json").read_bytes())
    engine = open_database(f"sqlite:///{tmp_path}/t.db")
    tuned = {("rmsnorm_fwd", "tokens=4096,hidden=4096"), ("sinkhorn_bwd", "tokens=4096"), ("sinkhorn_fwd", "tokens=7")}
    with session_scope(engine) as session:
        sweep = Sweep(kernel="rmsnorm_fwd", arch="sm_90", spec={}, status="done")
        session.add(sweep)
        session.flush()
        for kernel, shape in sorted(tuned):
            session.add(Trial(sweep_id=sweep.id, kernel=kernel, shape_key=shape, arch="sm_90",
                              config={"num_warps": 16}, identity=f"{kernel}{shape}", status="ok", median_ms=0.001,
                              retime_ms=0.001, is_winner=True, metrics={}, versions={}))
    for _ in range(2):
        path, _ = export_table(engine, "sm_90", out)
        table = read_table(path, "sm_90")
        assert len(table["entries"]) == len(shipped["entries"]) > 1
        for kernel, shapes in shipped["entries"].items():
            for key, entry in shapes.items():
                expected = {"num_warps": 16} if (kernel, key) in tuned else entry["config"]
                assert table["entries"][kernel][key]["config"] == expected
        assert table["entries"]["sinkhorn_fwd"]["tokens=7"]["config"] == {"num_warps": 16}  # a new shape joins
        assert sum(map(len, table["entries"].values())) == sum(map(len, shipped["entries"].values())) + 1
    assert read_table(SHIPPED_TABLES / "sm_90.json") == shipped  # the package's own table is untouched
