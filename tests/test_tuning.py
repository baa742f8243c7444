"""The run-time lookup: env override > table (exact, then nearest shape) > default."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pytest

from kernels import registry, tuning
from kernels.arch import current_arch


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TUNER_TABLES_DIR", raising=False)
    tuning.clear_cache()
    yield
    tuning.clear_cache()


def write_table(folder: Path, entries: dict, schema: int = tuning.TABLE_SCHEMA_VERSION) -> None:
    table = {"schema_version": schema, "arch": current_arch(), "provenance": {}, "entries": entries}
    tuning.table_path(current_arch(), folder).write_text(json.dumps(table))


def entry(block: int) -> dict:
    return {"config": {"MODE": "ok", "BLOCK": block}, "median_ms": 1.0}


def test_default_without_table(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path))
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
    assert sum("unusable" in str(w.message) for w in caught) == 1


def test_resolve_is_cheap(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path))
    write_table(tmp_path, {"fault_probe": {"n=100": entry(16)}})
    shape = {"n": 100}
    tuning.resolve("fault_probe", shape)
    calls = 20000
    start = time.perf_counter()
    for _ in range(calls):
        tuning.resolve("fault_probe", shape)
    per_call_us = (time.perf_counter() - start) / calls * 1e6
    print(f"resolve: {per_call_us:.2f} us per cached call")
    assert per_call_us < 25, per_call_us  # a few microseconds on a desktop core; slack for CI
