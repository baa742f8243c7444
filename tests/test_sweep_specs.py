"""``bench/sweep_specs.py``: the H200 sweep groups it writes, and a clear refusal of an unknown one."""

from __future__ import annotations

import sys

import pytest
import yaml

from bench import sweep_specs
from kernels import registry
from kernels.tuning import load_table
from tuner.sweep.spec import parse_spec


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


def test_plain_handoff_group_sweeps_ptx_modes_beside_the_committed_entries(tmp_path, monkeypatch):
    """Every spec parses; the backward's one-point specs are the committed entries as resolve runs
    them; the grids hold the PTX modes the next call compares."""
    run_main(monkeypatch, str(tmp_path), "attention-plain-handoff")
    specs = {p.stem: parse_spec(yaml.safe_load(p.read_text())) for p in tmp_path.glob("*.yaml")}
    fwd = [s for s in specs.values() if s.kernel == "sparse_attn_fwd"]
    committed = {name: s for name, s in specs.items() if name.endswith("-committed")}
    assert len(fwd) == 2 and len(committed) == 12
    assert all(s.space["PTX_BARRIER"] == [0, 2] and s.space["UNCHAINED"] == [0, 1] for s in fwd)
    for spec in committed.values():
        [shape] = spec.resolved_shapes()
        entry = sweep_specs.committed_config("sparse_attn_bwd", shape)
        assert {p: v for p, (v,) in spec.space.items() if p in entry} == entry
    grids = [s for name, s in specs.items() if name.endswith("-grid") and s.kernel == "sparse_attn_bwd"]
    assert len(grids) == 12 and all(s.space["PTX_BARRIER"] == [0, 1, 2] for s in grids)


def test_tma_modes_group_compares_every_descriptor_form_at_every_glue_shape(tmp_path, monkeypatch):
    run_main(monkeypatch, str(tmp_path / "specs"), "glue-bwd-tma-modes")
    [spec] = (yaml.safe_load(p.read_text()) for p in (tmp_path / "specs").glob("*.yaml"))
    parse_spec(spec)
    assert spec["space"]["TMA"] == [0, 1, 2] and len(spec["shapes"]) == 4


def test_select_in_scoring_group_holds_each_committed_entry_as_it_is(tmp_path, monkeypatch):
    """The one-point specs are the committed entries, parameters they predate at the values they ran
    with (an entry's own KEY_ROWS 1 is not pinned back to 0); the grids select apart or in the
    scoring, not both."""
    run_main(monkeypatch, str(tmp_path), "indexer-select-in-scoring")
    specs = {p.stem: parse_spec(yaml.safe_load(p.read_text())) for p in tmp_path.glob("*.yaml")}
    committed = {name: s for name, s in specs.items() if name.endswith("-committed")}
    assert len(committed) == 4
    for spec in committed.values():
        [shape] = spec.resolved_shapes()
        entry = sweep_specs.committed_config("indexer_fwd", shape)
        assert {p: v for p, (v,) in spec.space.items() if p in entry} == entry
        for param, pin in sweep_specs.INDEXER_TRITON_UNSPLIT.items():
            assert spec.space[param] == ([entry[param]] if param in entry else pin)
    grids = [s for name, s in specs.items() if name.endswith("-grid")]
    assert sorted(tuple(s.space["SELECT_IN_SCORING"]) for s in grids) == [(0,)] * 4 + [(1,)] * 4


def test_fused_knobs_group_sweeps_the_selection_instead_of_holding_it(tmp_path, monkeypatch):
    run_main(monkeypatch, str(tmp_path), "indexer-fused-knobs")
    specs = {p.stem: parse_spec(yaml.safe_load(p.read_text())) for p in tmp_path.glob("*.yaml")}
    grids = [s for name, s in specs.items() if name.endswith("-grid")]
    assert len(grids) == 2 and len(specs) == 4
    assert all(s.space["SELECT_INTERP"] == [0, 1] and s.space["SELECT_ROWS"] == [1, 2] for s in grids)
    assert all(s.space["SELECT_IN_SCORING"] == [1] and s.space["BLOCK_T"] == [32, 64] for s in grids)


def test_untuned_gemm_group_sweeps_every_expert_gemm_shape_the_table_lacks(tmp_path, monkeypatch):
    """Each shape of Flash and Pro that the committed table has no entry for, and none that it has; the
    expert-parallel shapes the expert MLP benchmark times first (the weight gradients first), then the others
    from the smallest problem to the largest."""
    run_main(monkeypatch, str(tmp_path / "untuned"), "gemm-untuned")
    specs = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "untuned").glob("*.yaml"))]
    entries = load_table("sm_90")["entries"]
    swept = {(spec["kernel"], registry.get(spec["kernel"]).shape_key(s)) for spec in specs for s in spec["shapes"]}
    lacking = {(k, registry.get(k).shape_key(s)) for k in sweep_specs.EXPERT_GEMMS for s in sweep_specs.shapes_of(k)
               if registry.get(k).shape_key(s) not in entries.get(k, {})}
    assert swept == lacking  # empty once the table holds every shape: then no spec
    benched = [spec for spec in specs if all(s["tokens"] == 24576 and s["experts"] in (32, 48) and s["skew"] == 0
                                             for s in spec["shapes"])]
    assert specs[:len(benched)] == benched
    assert not any(s["tokens"] == 24576 and s["experts"] in (32, 48) and s["skew"] == 0
                   for spec in specs[len(benched):] for s in spec["shapes"])
    order = list(dict.fromkeys(("expert_up_bwd_dw", "expert_down_bwd_dw", *sweep_specs.EXPERT_GEMMS)))
    kernels = [spec["kernel"] for spec in specs[:len(benched)]]
    assert kernels == sorted(kernels, key=order.index) and len(set(kernels)) == len(kernels)
    # the others from the smallest problem to the largest, within a spec and across them
    sizes = [[registry.get(spec["kernel"]).bytes_moved(s) for s in spec["shapes"]] for spec in specs[len(benched):]]
    assert all(each == sorted(each) for each in sizes) and [each[0] for each in sizes] == sorted(each[0] for each in sizes)
    assert len({spec["kernel"] for spec in specs[len(benched):]}) == len(specs) - len(benched)
    assert all(spec["strategy"]["name"] == "tpe" and "timing" not in spec for spec in specs)
    for spec in specs:
        parse_spec(spec)


def test_warp_specialized_group_sweeps_4_warp_tma_tiles_beside_what_each_shape_runs_now(tmp_path, monkeypatch):
    """At every balanced-load shape of the four row-tile GEMMs: a grid of warp-specialized tiles and
    a one-point grid of what ``tuning.resolve`` runs there now (the committed entry over the default,
    or the default where the table has none)."""
    run_main(monkeypatch, str(tmp_path), "gemm-warp-specialized")
    specs = {p.stem: parse_spec(yaml.safe_load(p.read_text())) for p in tmp_path.glob("*.yaml")}
    entries = load_table("sm_90")["entries"]
    for kernel in sweep_specs.ROW_TILE_GEMMS:
        balanced = [s for s in sweep_specs.shapes_of(kernel) if s["skew"] == 0]
        mine = {name: s for name, s in specs.items() if s.kernel == kernel}
        assert len(mine) == 2 * len(balanced) == 12
        for name, spec in mine.items():
            [shape] = spec.resolved_shapes()
            if name.endswith("-grid"):
                assert spec.space["WARP_SPECIALIZE"] == [1] and spec.space["num_warps"] == [4]
                continue
            key = registry.get(kernel).shape_key(shape)
            runs_now = registry.get(kernel).default_config(shape) | entries.get(kernel, {}).get(key, {}).get("config", {})
            assert {p: v for p, (v,) in spec.space.items()} == runs_now


def test_expert_backward_group_sweeps_the_new_knobs_beside_each_benched_entry(tmp_path, monkeypatch):
    """Both weight gradients and the dgu launch at the two expert-parallel shapes the expert MLP benchmark
    times: a grid with the gradient tile prefetched (or the epilogue over column halves); for the weight
    gradients a second grid at two programs an SM (128 registers); and a one-point grid of what runs there
    now (which does neither)."""
    run_main(monkeypatch, str(tmp_path), "expert-backward")
    specs = {p.stem: parse_spec(yaml.safe_load(p.read_text())) for p in tmp_path.glob("*.yaml")}
    assert len(specs) == 16
    for name, spec in specs.items():
        [shape] = spec.resolved_shapes()
        assert (shape["tokens"], shape["experts"], shape["skew"]) in {(24576, 32, 0), (24576, 48, 0)}
        knob = "EPILOGUE_HALVES" if spec.kernel == "expert_down_bwd_dx" else "PREFETCH_GRAD"
        if name.endswith("-grid"):
            assert spec.space[knob] == [1]
        elif name.endswith("-grid-2"):
            assert spec.kernel != "expert_down_bwd_dx" and spec.space["maxnreg"] == [128]
        else:  # the one point that runs there now: the table's entry over the default
            kernel = registry.get(spec.kernel)
            entry = load_table("sm_90")["entries"][spec.kernel][kernel.shape_key(shape)]["config"]
            assert {p: v for p, [v] in spec.space.items()} == kernel.default_config(shape) | entry


def test_model_groups_sweep_the_launches_the_table_misses_with_the_trials_asked(tmp_path, monkeypatch, request):
    from kernels import tuning
    from tuner.train.model_shapes import model_launches
    from v4.config import load_preset

    # no table at all, whatever the package ships: every launch of the step is one to sweep
    monkeypatch.setattr(tuning, "SHIPPED_TABLES", tmp_path / "shipped")
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path / "user"))
    tuning.clear_cache()
    request.addfinalizer(tuning.clear_cache)  # the lookups cached here know no table
    monkeypatch.setenv("SWEEP_TRIALS", "5")
    run_main(monkeypatch, str(tmp_path / "proxy"), "proxy-8l")
    written = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "proxy").glob("*.yaml"))]
    missing = [l for l in model_launches(load_preset("proxy-8l"), 4096, 1, 1, "sm_90") if l.source == "default"]
    assert {(w["kernel"], tuple(s.items())) for w in written for s in w["shapes"]} == {
        (l.kernel, tuple(l.shape.items())) for l in missing}
    assert len(missing) == 59 and {w["budget"]["max_trials"] for w in written} == {5}
    monkeypatch.setenv("SWEEP_TRIALS", "0")
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, str(tmp_path / "none"), "proxy-8l")
    assert exit_info.value.code == 2 and not (tmp_path / "none").exists()


def test_the_proxy_gemm_group_resweeps_every_expert_gemm_launch_device_timed(tmp_path, monkeypatch):
    from bench.sweep_specs import EXPERT_GEMMS
    from tuner.train.model_shapes import model_launches
    from v4.config import load_preset

    monkeypatch.setenv("SWEEP_TRIALS", "4")
    run_main(monkeypatch, str(tmp_path / "gemms"), "proxy-8l-gemms")
    written = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "gemms").glob("*.yaml"))]
    launches = [l for l in model_launches(load_preset("proxy-8l"), 4096, 1, 1, "sm_90") if l.kernel in EXPERT_GEMMS]
    # entry or not (the shipped table may hold them all): the routed experts' and the shared expert's shapes
    assert {(w["kernel"], tuple(s.items())) for w in written for s in w["shapes"]} == {
        (l.kernel, tuple(l.shape.items())) for l in launches}
    assert {w["kernel"] for w in written} == set(EXPERT_GEMMS) and len(launches) == 12
    assert all(w["timing"] == {"method": "cudagraph", "trial_timeout_s": 30.0} and w["budget"]["max_trials"] == 4
               for w in written)
