"""The user's tables through the CLI: exports land in the user tables folder, never in the package;
``tables show`` marks each entry with its layer; ``tables reset`` brings the shipped table back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from db import Sweep, Trial, open_database, session_scope
from kernels import tuning
from tests.cli_run import invoke_tuner

SHAPE = "tokens=4096,hidden=4096"  # a shape the shipped sm_90 table has for rmsnorm_fwd


def _package_digest() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(tuning.SHIPPED_TABLES.glob("*")))).hexdigest()


@pytest.fixture
def tuned_db(tmp_path: Path) -> str:
    """A database with one rmsnorm_fwd winner on sm_90 at a shape the shipped table has."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    with session_scope(open_database(url)) as session:
        sweep = Sweep(kernel="rmsnorm_fwd", arch="sm_90", spec={}, status="done")
        session.add(sweep)
        session.flush()
        session.add(Trial(sweep_id=sweep.id, kernel="rmsnorm_fwd", shape_key=SHAPE, arch="sm_90",
                          config={"BLOCK_M": 4, "num_warps": 16}, identity="x", status="ok", median_ms=0.01,
                          retime_ms=0.01, is_winner=True, metrics={}, versions={}))
    return url


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-tables"
    monkeypatch.setenv("TUNER_TABLES_DIR", str(folder))
    tuning.clear_cache()
    yield folder
    tuning.clear_cache()


def test_export_writes_the_user_folder_and_the_kernels_read_it_over_the_shipped_table(tuned_db, user_folder):
    before = _package_digest()
    code, output = invoke_tuner(tuned_db, "export", "--arch", "sm_90")
    assert code == 0 and f"wrote {user_folder / 'sm_90.json'}" in output, output
    assert _package_digest() == before
    assert set(json.loads((user_folder / "sm_90.json").read_text())["entries"]) == {"rmsnorm_fwd"}
    layers = tuning.table_layers("sm_90")
    merged = tuning.merged_entries(layers)
    assert merged["rmsnorm_fwd"][SHAPE][0] == "user"
    assert merged["rmsnorm_fwd"][SHAPE][1]["config"] == {"BLOCK_M": 4, "num_warps": 16}
    shipped = json.loads((tuning.SHIPPED_TABLES / "sm_90.json").read_text())["entries"]
    assert len(merged) == len(shipped) > 1  # every shipped kernel is still read
    assert all(layer == "shipped" for kernel, shapes in merged.items() for key, (layer, _) in shapes.items()
               if (kernel, key) != ("rmsnorm_fwd", SHAPE))


def test_tables_show_marks_each_layer_and_reset_brings_the_shipped_table_back(tuned_db, user_folder):
    assert invoke_tuner(tuned_db, "export", "--arch", "sm_90")[0] == 0
    code, output = invoke_tuner(tuned_db, "tables", "show", "--arch", "sm_90")
    assert code == 0, output
    flat = output.replace("\n", "")  # a long path wraps at 80 columns
    assert f"user table: {user_folder / 'sm_90.json'}" in flat and "shipped table:" in output
    assert "user #1" in output and "shipped" in output
    code, output = invoke_tuner(tuned_db, "tables", "reset", "--arch", "sm_90")
    assert code == 0 and "removed" in output and not (user_folder / "sm_90.json").exists()
    code, output = invoke_tuner(tuned_db, "tables", "show", "--arch", "sm_90")
    assert code == 0 and "user" not in output.replace("users", "")
    code, output = invoke_tuner(tuned_db, "tables", "reset")
    assert code == 0 and "no table of yours to reset" in output


def test_an_export_keeps_what_the_user_table_had_for_other_shapes(tuned_db, user_folder):
    user_folder.mkdir()
    (user_folder / "sm_90.json").write_text(json.dumps({
        "schema_version": 1, "arch": "sm_90", "provenance": {"exported_at": "earlier", "sweep_ids": [9]},
        "entries": {"rope_fwd": {"tokens=4096,heads=64": {"config": {"BLOCK_T": 2}}}}}))
    assert invoke_tuner(tuned_db, "export", "--arch", "sm_90")[0] == 0
    table = json.loads((user_folder / "sm_90.json").read_text())
    assert table["entries"]["rope_fwd"] == {"tokens=4096,heads=64": {"config": {"BLOCK_T": 2}}}
    assert table["entries"]["rmsnorm_fwd"][SHAPE]["config"] == {"BLOCK_M": 4, "num_warps": 16}
    assert table["provenance"]["kept_from"]["entries"] == {"rope_fwd": 1}
