"""tuner sweep shapes: the launches a model's step makes, found on the meta device, where each takes its
config from, and the sweep specs for the ones a table misses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from kernels import registry, tuning
from tuner.cli.main import app
from tuner.sweep.spec import parse_spec
from tuner.train.model_shapes import graph_timed, memory_bound, model_launches, sweep_specs
from v4.config import load_preset

TINY = load_preset("tiny")


@pytest.fixture(autouse=True)
def _tables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No shipped tables, and a user table of sm_90 with one entry: tiny's RMSNorm at its own width."""
    monkeypatch.setattr(tuning, "SHIPPED_TABLES", tmp_path / "shipped")
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path / "user"))
    (tmp_path / "user").mkdir()
    shape = {"tokens": 64, "hidden": TINY.hidden}
    entry = {"config": {"BLOCK_M": 1, "BLOCK_D": 0, "num_warps": 4, "num_stages": 1}, "median_ms": 0.01}
    table = {"schema_version": tuning.TABLE_SCHEMA_VERSION, "arch": "sm_90", "provenance": {},
             "entries": {"rmsnorm_fwd": {registry.get("rmsnorm_fwd").shape_key(shape): entry}}}
    (tmp_path / "user" / "sm_90.json").write_text(json.dumps(table))
    tuning.clear_cache()
    yield shape
    tuning.clear_cache()


def test_the_step_s_launches_are_found_without_computing_anything(_tables):
    launches = model_launches(TINY, 64, 1, 1, "sm_90")
    kernels = {launch.kernel for launch in launches}
    # the layer's kernels, the expert GEMMs' backward, the head's loss: forward and backward both ran
    assert {"rmsnorm_fwd", "rmsnorm_bwd", "mhc_glue_fwd", "mhc_glue_bwd", "sparse_attn_fwd", "sparse_attn_bwd",
            "expert_up_fwd", "expert_up_bwd_dw", "moe_combine_fwd", "router_bwd", "cross_entropy_fwd"} <= kernels
    for launch in launches:  # every shape is one the registry can key, and each is listed once
        registry.get(launch.kernel).shape_key(launch.shape)
    assert len({(l.kernel, tuple(l.shape.items())) for l in launches}) == len(launches)
    ups = [l.shape for l in launches if l.kernel == "expert_up_fwd"]
    assert {"tokens": 64 * TINY.experts_per_token, "experts": TINY.experts, "hidden": TINY.hidden,
            "ffn": TINY.expert_ffn, "skew": 0} in ups
    sources = {(l.kernel, tuple(l.shape.items())): l.source for l in launches}
    assert sources[("rmsnorm_fwd", tuple(_tables.items()))] == "table"
    assert sources[("rmsnorm_bwd", tuple(_tables.items()))] == "default"


def test_expert_parallelism_divides_the_experts_a_layer_launches_over():
    experts = {l.shape["experts"] for l in model_launches(TINY, 64, 1, 2, "sm_90") if l.kernel == "expert_up_fwd"}
    assert TINY.experts // 2 in experts and TINY.experts not in experts


def test_specs_put_the_compute_bound_first_and_graph_time_the_short_launches():
    launches = model_launches(load_preset("proxy-8l"), 4096, 1, 1, "sm_90")  # at tiny's size all is memory-bound
    specs = sweep_specs(launches, "sm_90", trials=5)
    assert sorted(s["kernel"] for s in specs) == sorted({l.kernel for l in launches})
    bound = [all(memory_bound(s["kernel"], shape) for shape in s["shapes"]) for s in specs]
    assert bound == sorted(bound) and any(bound) and not all(bound)  # the memory-bound ones last
    for body in specs:
        parsed = parse_spec(yaml.safe_load(yaml.safe_dump(body)))  # a spec the queue takes
        assert parsed.budget.max_trials == 5 and parsed.strategy.name == "tpe"
        assert ("timing" in body) == all(graph_timed(body["kernel"], s) for s in body["shapes"])
    assert graph_timed("rmsnorm_fwd", {"tokens": 4096, "hidden": 2048})
    # the proxy's expert GEMMs: compute-bound, yet as short as their host path
    proxy_gemm = {"tokens": 24576, "experts": 32, "hidden": 2048, "ffn": 1024, "skew": 0}
    assert not memory_bound("expert_up_fwd", proxy_gemm) and graph_timed("expert_up_fwd", proxy_gemm)
    # V4-Pro's up GEMM at a 16,384-token micro-batch runs for milliseconds: CUDA events time the device
    assert not graph_timed("expert_up_fwd", {"tokens": 98304, "experts": 48, "hidden": 7168, "ffn": 3072, "skew": 0})


def test_the_command_lists_the_launches_and_writes_specs_for_the_missing(tmp_path: Path):
    result = CliRunner().invoke(app, ["sweep", "shapes", "--model", "tiny", "--seq", "64", "--specs",
                                      str(tmp_path / "specs"), "--trials", "3"])
    assert result.exit_code == 0, result.output
    launches = model_launches(TINY, 64, 1, 1, "sm_90")
    missing = [l for l in launches if l.source == "default"]
    assert f"{len(missing)} of {len(launches)} launches of tiny" in " ".join(result.output.split())
    written = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "specs").glob("*.yaml"))]
    assert {(w["kernel"], tuple(s.items())) for w in written for s in w["shapes"]} == {
        (l.kernel, tuple(l.shape.items())) for l in missing}
    assert not list((tmp_path / "specs").glob("*.partial"))


def test_the_command_queues_the_sweeps_it_would_write(tmp_path: Path):
    from tuner.cli.errors import open_engine
    from tuner.sweep import queue

    db = f"sqlite:///{tmp_path / 'q.db'}"
    result = CliRunner().invoke(app, ["--db", db, "sweep", "shapes", "--model", "tiny", "--seq", "64", "--queue"])
    assert result.exit_code == 0, result.output
    missing = {l.kernel for l in model_launches(TINY, 64, 1, 1, "sm_90") if l.source == "default"}
    assert f"queued {len(missing)} sweeps (1-{len(missing)})" in " ".join(result.output.split())
    engine = open_engine(db)
    sweeps = [queue.get_sweep(engine, i) for i in range(1, len(missing) + 1)]
    assert {s.kernel for s in sweeps} == missing and {s.status for s in sweeps} == {"queued"}


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nope", "--seq", "64"], "unknown preset 'nope'"),
    (["--model", "tiny", "--seq", "64", "--ep", "3"], "ep: 3 does not divide"),
    (["--model", "tiny", "--seq", "64", "--arch", "sm_1"], "unknown arch 'sm_1'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path: Path):
    result = CliRunner().invoke(app, ["sweep", "shapes", *args, "--specs", str(tmp_path / "specs")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "specs").exists()  # nothing written


def test_the_interpreter_s_arch_is_taken_for_the_run_and_given_back(monkeypatch):
    from kernels.arch import as_interpreter, current_arch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    current_arch.cache_clear()
    before = current_arch()
    with as_interpreter():
        assert current_arch() == "interp" and os.environ["TRITON_INTERPRET"] == "1"
    assert current_arch() == before and os.environ["TRITON_INTERPRET"] == "0"
    model_launches(TINY, 64, 1, 1, "sm_90")
    assert os.environ["TRITON_INTERPRET"] == "0"
    monkeypatch.undo()
    current_arch.cache_clear()


def test_a_launch_on_meta_tensors_returns_without_running():
    x = torch.empty(8, 64, device="meta", dtype=torch.bfloat16)
    from kernels.rmsnorm import rms_norm

    assert rms_norm(x, None, 1e-6).shape == (8, 64)
