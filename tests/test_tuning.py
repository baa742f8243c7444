"""The run-time lookup: env override > user table > shipped table (exact, then nearest shape) > default;
corrupt tables and entries warn once and fall back."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from kernels import registry, tuning
from kernels.arch import current_arch


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """An empty shipped folder and user folder per test (the package's own tables are not this test's)."""
    monkeypatch.setattr(tuning, "SHIPPED_TABLES", tmp_path / "shipped")
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path / "user"))
    (tmp_path / "shipped").mkdir()
    (tmp_path / "user").mkdir()
    tuning.clear_cache()
    yield
    tuning.clear_cache()


def write_table(folder: Path, entries: dict, schema: int = tuning.TABLE_SCHEMA_VERSION) -> None:
    table = {"schema_version": schema, "arch": current_arch(), "provenance": {}, "entries": entries}
    tuning.table_path(current_arch(), folder).write_text(json.dumps(table))


def entry(block: int) -> dict:
    return {"config": {"MODE": "ok", "BLOCK": block}, "median_ms": 1.0}


def test_default_without_table():
    with pytest.warns(UserWarning, match="no tuned table"):
        config, source = tuning.resolve("fault_probe", {"n": 100})
    assert (config, source) == ({"MODE": "ok", "BLOCK": 32}, "default")


def test_exact_then_nearest_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path))
    write_table(tmp_path, {"fault_probe": {"n=100": entry(16), "n=4096": entry(64)}})
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 16}, "table")
    # log2 distance: 1000 is nearer 4096 (2.03) than 100 (3.32)
    assert tuning.resolve("fault_probe", {"n": 1000})[0]["BLOCK"] == 64
    assert tuning.resolve("fault_probe", {"n": 150})[0]["BLOCK"] == 16


def test_tables_off_reads_neither_layer(tmp_path, monkeypatch):
    write_table(tmp_path / "shipped", {"fault_probe": {"n=100": entry(16)}})
    write_table(tmp_path / "user", {"fault_probe": {"n=100": entry(8)}})
    monkeypatch.setenv("TUNER_TABLES", "off")
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 32}, "default")
    assert tuning.load_table(current_arch()) is None
    monkeypatch.delenv("TUNER_TABLES")
    tuning.clear_cache()
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 8}, "table")


def test_exact_fields_must_match():
    kernel = registry.get("rmsnorm_fwd")
    entries = {"tokens=4096,hidden=4096": entry(1)}
    assert tuning.nearest_entry(kernel, {"tokens": 4000, "hidden": 4096}, entries) is entries["tokens=4096,hidden=4096"]
    assert tuning.nearest_entry(kernel, {"tokens": 4096, "hidden": 7168}, entries) is None


def test_env_override_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path))
    write_table(tmp_path, {"fault_probe": {"n=100": entry(16)}})
    monkeypatch.setenv("TUNER_CONFIG_FAULT_PROBE", '{"BLOCK": 128}')
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 128}, "env")


def test_bad_env_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TUNER_CONFIG_FAULT_PROBE", "[1, 2")
    with pytest.raises(tuning.ConfigOverrideError, match="TUNER_CONFIG_FAULT_PROBE is not valid JSON"):
        tuning.resolve("fault_probe", {"n": 100})


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema_version": 99, "entries": {}})])
def test_corrupt_table_falls_back_and_warns_once(tmp_path, monkeypatch, content):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path))
    tuning.table_path(current_arch(), tmp_path).write_text(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuning.resolve("fault_probe", {"n": 100})[1] == "default"
        assert tuning.resolve("fault_probe", {"n": 200})[1] == "default"
    assert sum("entries are skipped" in str(w.message) for w in caught) == 1


def test_user_entries_lie_over_the_shipped_ones_entry_by_entry(tmp_path):
    """The user's table replaces the shipped entries it has; the shipped entries it lacks stay in use."""
    write_table(tmp_path / "shipped", {"fault_probe": {"n=100": entry(16), "n=4096": entry(64)}})
    write_table(tmp_path / "user", {"fault_probe": {"n=100": entry(8)}})
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 8}, "table")
    assert tuning.resolve("fault_probe", {"n": 4096}) == ({"MODE": "ok", "BLOCK": 64}, "table")
    layers = tuning.table_layers(current_arch())
    assert [layer.layer for layer in layers] == ["shipped", "user"]
    merged = tuning.merged_entries(layers)["fault_probe"]
    assert {key: layer for key, (layer, _) in merged.items()} == {"n=100": "user", "n=4096": "shipped"}


def test_shipped_table_alone_and_user_folder_from_the_data_dir(tmp_path, monkeypatch):
    write_table(tmp_path / "shipped", {"fault_probe": {"n=100": entry(16)}})
    assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 16}, "table")
    monkeypatch.delenv("TUNER_TABLES_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert tuning.user_tables_dir() == tmp_path / "data" / "v4-tuner" / "tables"


# Corrupt entries: each is skipped with one warning that names it, and the lookup falls back to the default.
CORRUPT_ENTRIES = {
    "config a number": {"n=100": {"config": 5}},
    "config null": {"n=100": {"config": None}},
    "config a string": {"n=100": {"config": "BLOCK=16"}},
    "config a list": {"n=100": {"config": [16]}},
    "no config": {"n=100": {"median_ms": 1.0}},
    "entry a number": {"n=100": 3},
    "unknown key": {"n=100": {"config": {"MODE": "ok", "BLOKC": 16}}},
    "string for a number": {"n=100": {"config": {"MODE": "ok", "BLOCK": "16"}}},
    "number for a string": {"n=100": {"config": {"MODE": 1, "BLOCK": 16}}},
    "nested value": {"n=100": {"config": {"MODE": "ok", "BLOCK": [16]}}},
    "fractional block": {"n=100": {"config": {"MODE": "ok", "BLOCK": 16.5}}},
    "extra shape field": {"n=100,m=2": entry(16)},
    "non-integer shape field": {"n=abc": entry(16)},
    "no shape field": {"100": entry(16)},
}


@pytest.mark.parametrize("entries", CORRUPT_ENTRIES.values(), ids=CORRUPT_ENTRIES.keys())
def test_a_corrupt_entry_warns_once_and_the_default_runs(tmp_path, entries):
    write_table(tmp_path / "user", {"fault_probe": entries})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 32}, "default")
        assert tuning.resolve("fault_probe", {"n": 200})[1] == "default"
    (warning,) = [w for w in caught if "entries skipped" in str(w.message)]
    assert repr(next(iter(entries))) in str(warning.message)


def test_a_corrupt_user_entry_leaves_the_shipped_one_in_use(tmp_path):
    write_table(tmp_path / "shipped", {"fault_probe": {"n=100": entry(16)}})
    write_table(tmp_path / "user", {"fault_probe": {"n=100": {"config": {"BLOCK": "big"}}}})
    with pytest.warns(UserWarning, match="fault_probe entries skipped: 'n=100'"):
        assert tuning.resolve("fault_probe", {"n": 100}) == ({"MODE": "ok", "BLOCK": 16}, "table")


@pytest.mark.parametrize("content, reason", [
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not UTF-8 text"),
    (b'{"schema_version": 1, "arch": "x", "entr', "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"schema_version": 1, "arch": "sm_90", "entries": [1, 2]}', "'entries' must be an object"),
    (b'{"schema_version": 1, "arch": "sm_90", "entries": {"k": 5}}', "'entries' must be an object"),
    (b'["a", "table"]', "not a tuned table"),
    (b'{"schema_version": 1, "arch": "gfx942", "entries": {}}', "arch is 'gfx942', not 'sm_90'"),
])
def test_read_table_names_the_file_and_what_is_wrong(tmp_path, content, reason):
    path = tmp_path / "sm_90.json"
    path.write_bytes(content)
    with pytest.raises(tuning.TableError, match=reason) as caught:
        tuning.read_table(path, "sm_90")
    assert str(caught.value).startswith(str(path))
