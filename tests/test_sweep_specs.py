"""``bench/sweep_specs.py``: the H200 sweep groups it writes, and a clear refusal of an unknown one."""

from __future__ import annotations

import sys

import pytest
import yaml

from bench import sweep_specs


def run_main(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["sweep_specs.py", *args])
    sweep_specs.main()


def test_unknown_group_exits_2_naming_the_groups_and_writes_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "specs"
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, str(out), "glue-bwd-slab")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'glue-bwd-slab'" in err and "glue-bwd-slabs" in err
    assert not out.exists()


def test_grid_groups_are_graph_timed_only_for_memory_bound_launches(tmp_path, monkeypatch):
    for group in ("glue-bwd-slabs", "indexer-select"):
        run_main(monkeypatch, str(tmp_path / group), group)
    [glue] = (yaml.safe_load(p.read_text()) for p in (tmp_path / "glue-bwd-slabs").glob("*.yaml"))
    [index] = (yaml.safe_load(p.read_text()) for p in (tmp_path / "indexer-select").glob("*.yaml"))
    assert glue["strategy"] == {"name": "grid"} and glue["timing"] == {"method": "cudagraph"}
    assert glue["space"]["SLABS"] == [2, 4, 8] and len(glue["shapes"]) == 4  # every Flash and Pro glue shape
    assert "timing" not in index and index["space"]["SELECT_WARPS"] == [1, 2, 4, 8, 16]
    assert {s["seq"] for s in index["shapes"]} == {4096, 8192}
