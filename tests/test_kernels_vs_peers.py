"""``bench/kernels_vs_peers.py``'s summary: each README target measured from raw rows and marked met or missed."""

from __future__ import annotations

import pytest

from bench.kernels_vs_peers import GEMM_TARGET_SHAPE, _launches, compile_jobs, precompile, summarize, variant_calls
from kernels import registry


def _row(kernel: str, shape: str, default_ms: float, tuned_ms: float | None, **extra: dict) -> dict:
    ms = {"default": default_ms, **({"tuned": tuned_ms} if tuned_ms else {})}
    return {"kernel": kernel, "shape": shape, "preset": "v4-flash", "flops": None, "bytes": 4096, "ms": ms,
            "graph_ms": {}, "pct_of_copy": {v: 50.0 for v in ms}, "parity": {"default": "ok"},
            "tuned_config": {"BLOCK": 1} if tuned_ms else None, **extra}


def _by_target(figures: dict) -> dict[str, dict]:
    return {t["target"].split(" ")[0] + " " + t["target"].split(" ")[1]: t for t in figures["targets"]}


def test_block_geomean_counts_cells_without_a_tuned_config_at_their_default() -> None:
    rows = [_row("rope_fwd", "tokens=1", 2.0, 1.0), _row("rope_fwd", "tokens=2", 8.0, 1.0),
            _row("router_fwd", "tokens=1", 3.0, None)]
    block = _by_target(summarize(rows, 1000.0, {}, 750.0))["block kernels"]
    assert block["measured"].startswith("2.520x over 3 cells (1 without a tuned config")
    assert "4.000x over the 2 tuned" in block["measured"]
    assert block["status"] == "met"
    memory = _by_target(summarize(rows, 1000.0, {}, 750.0))["memory-bound block"]
    assert memory["measured"].startswith("0 of 3 cells") and memory["status"] == "missed"


def test_a_tuned_cell_out_of_memory_leaves_the_geomean_incomplete_an_untuned_one_counts_at_one() -> None:
    rows = [_row("rope_fwd", "tokens=1", 2.0, 1.0), _row("rope_fwd", "tokens=2", 8.0, 1.0)]

    def lost(kernel: str, table_config: bool) -> dict:
        return {"kernel": kernel, "shape": "tokens=6", "reason": "out of device memory", "table_config": table_config}

    figures = summarize(rows, 1000.0, {}, 750.0, [lost("expert_up_bwd_dw", True)])
    block = _by_target(figures)["block kernels"]
    assert block["measured"].endswith("; 1 tuned cells not measured") and block["status"] == "incomplete"
    assert figures["cells not measured"] == ["expert_up_bwd_dw tokens=6: out of device memory"]
    block = _by_target(summarize(rows, 1000.0, {}, 750.0, [lost("expert_up_bwd_dw", False)]))["block kernels"]
    assert block["measured"].startswith("2.520x over 3 cells (1 without a tuned config, counted at 1.00x, 1 of them "
                                        "not measured here)") and block["status"] == "met"
    block = _by_target(summarize(rows, 1000.0, {}, 750.0, [lost("sparse_attn_fwd", True)]))["block kernels"]
    assert block["measured"].startswith("4.000x over 2 cells") and block["status"] == "met"  # not a block kernel


def test_attention_and_gemm_targets_from_tflops() -> None:
    csa = "batch=1,seq=4096,heads=64,ratio=4,topk=512,window=128"
    rows = [_row("sparse_attn_fwd", csa, 2.0, 1.0, tflops={"default": 176.0, "tuned": 352.0, "eager": 14.0}),
            _row("sparse_attn_bwd", csa, 3.0, 2.0, tflops={"default": 100.0, "tuned": 149.0, "eager": 2.0}),
            _row("expert_up_fwd", GEMM_TARGET_SHAPE, 1.1, 1.0,
                 tflops={"default": 550.0, "tuned": 604.0, "grouped_mm": 652.0})]
    figures = summarize(rows, 4000.0, {"expert_up_fwd": {GEMM_TARGET_SHAPE: {"config": {"BLOCK": 1},
                                                                            "sweep_id": 7}}}, 750.0)
    targets = _by_target(figures)
    assert targets["Flash CSA"]["measured"] == "352 / 149" and targets["Flash CSA"]["status"] == "missed"
    assert targets["attention tuned"]["measured"] == f"{(2.0 * 1.5) ** 0.5:.3f}x"
    assert targets["grouped expert"] == {"target": targets["grouped expert"]["target"],
                                         "measured": "604 TFLOP/s, 93%", "status": "met"}
    assert figures["expert GEMMs"][f"expert_up_fwd {GEMM_TARGET_SHAPE}"]["table entry"] == "sweep 7"
    assert figures["attention"]["v4-flash CSA 4096"]["bwd tuned TFLOP/s"] == 149.0


def test_the_gemm_target_without_its_peer_timed_is_incomplete_not_missed() -> None:
    rows = [_row("expert_up_fwd", GEMM_TARGET_SHAPE, 1.1, 1.0, tflops={"default": 550.0, "tuned": 622.0})]
    gemm = _by_target(summarize(rows, 4000.0, {}, 750.0))["grouped expert"]
    assert gemm["measured"] == "622 TFLOP/s; torch._grouped_mm not timed" and gemm["status"] == "incomplete"
    rows[0]["tflops"] = {"default": 450.0, "tuned": 480.0}
    assert _by_target(summarize(rows, 4000.0, {}, 750.0))["grouped expert"]["status"] == "missed"


def test_floors_and_parity_failures() -> None:
    shape = "batch=1,seq=4096,ratio=4,dim=128"
    rows = [_row("compressor_bwd", shape, 0.03, 0.0086, graph_ms={"default": 0.03, "tuned": 0.0086,
                                                                  "same_size_copy": 0.0039}),
            _row("indexer_fwd", "batch=1,seq=8192,topk=512", 0.6, 0.3216, flops=int(0.1832e-3 * 750e12))]
    rows[0]["parity"]["tuned"] = "max abs err 1.0"
    figures = summarize(rows, 4096e-3 / 0.0010 / 1e6 * 1e3, {}, 750.0)
    targets = _by_target(figures)
    assert targets["compressor within"]["measured"] == "0 of 1 launches; compressor_bwd seq=4096,ratio=4,dim=128 2.21x"
    assert targets["indexer call"] == {"target": "indexer call within 2x of its floor", "measured": "8192: 1.76x",
                                       "status": "met"}
    assert figures["parity failures"] == [f"compressor_bwd {shape} tuned: max abs err 1.0"]


def test_unknown_launch_is_refused() -> None:
    assert _launches("gemm,rope_fwd")[-1] == "rope_fwd" and "expert_up_bwd_dw" in _launches("gemm")
    with pytest.raises(ValueError, match="--kernels: unknown launch or group nope"):
        _launches("attention,nope")
    assert set(_launches("attention,gemm,memory")) <= set(registry.names())


@pytest.mark.parametrize("with_peers", [True, False])
def test_without_peers_only_the_default_and_the_table_config_are_timed(with_peers):
    """``--no-peers``: the tuned-over-default figures alone (each call still runs, here in the interpreter)."""
    import torch

    from bench.sweep_specs import graph_timed

    name = "mhc_expand_fwd"
    kernel = registry.get(name)
    shape = kernel.presets["small"][0]
    inputs = kernel.make_inputs(shape, torch.device("cpu"), 7)
    default = kernel.default_config(shape)
    calls, _ = variant_calls(name, shape, inputs, default, dict(default), with_peers)
    expected = {"default", "tuned"} | ({"eager"} | ({"same_size_copy"} if graph_timed(name) else set())
                                       if with_peers else set())
    assert set(calls) == expected
    for call in calls.values():
        call()


def test_the_configs_compiled_ahead_are_each_cells_default_and_table_config():
    rope, router = registry.get("rope_fwd"), registry.get("router_fwd")
    [rope_shape], [router_shape] = rope.presets["small"][:1], router.presets["small"][:1]
    table = {"entries": {"rope_fwd": {rope.shape_key(rope_shape): {"config": {"BLOCK": 1}}}}}
    assert compile_jobs([("rope_fwd", rope_shape), ("router_fwd", router_shape)], table) == [
        ("rope_fwd", rope_shape, rope.default_config(rope_shape)), ("rope_fwd", rope_shape, {"BLOCK": 1}),
        ("router_fwd", router_shape, router.default_config(router_shape))]


def test_compiling_ahead_in_a_process_leaves_the_cells_to_run(capsys):
    """Under the interpreter a compile is a no-op: what is checked is that a compile process starts, takes the
    jobs and ends without a config lost."""
    rope = registry.get("rope_fwd")
    precompile([("rope_fwd", rope.presets["small"][0])], {"entries": {}}, workers=1)
    assert "not compiled ahead" not in capsys.readouterr().err


def test_a_partial_record_names_the_cells_not_yet_reached(monkeypatch) -> None:
    """A run stopped at its time limit keeps ``<record>.partial``: after each cell, the cells still to run are
    named as not measured, so a partial geomean reads incomplete, not as one over every cell."""
    import argparse

    import torch

    from bench import kernels_vs_peers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels_vs_peers, "copy_bandwidth_gbps", lambda: 1000.0)
    monkeypatch.setattr(kernels_vs_peers, "precompile", lambda *_: None)
    table = {"entries": {"rope_fwd": {registry.get("rope_fwd").shape_key(s): {"config": {"BLOCK": 1}}
                                      for s in registry.get("rope_fwd").presets["v4-flash"]}}}
    monkeypatch.setattr("kernels.tuning.load_table", lambda _arch: table)
    monkeypatch.setattr(kernels_vs_peers, "bench_shape",
                        lambda name, shape, *_a, **_k: _row(name, registry.get(name).shape_key(shape), 2.0, 1.0))
    partials: list[dict] = []
    args = argparse.Namespace(kernels="rope_fwd", presets="v4-flash", gemm_tflops=750.0, compile_workers=0,
                              no_peers=True, save_partial=partials.append)
    final = kernels_vs_peers.run(args)
    cells = len(registry.get("rope_fwd").presets["v4-flash"])
    assert cells >= 2 and len(partials) == cells
    first = partials[0]
    assert len(first["cells not measured"]) == cells - 1
    assert all(c.endswith(": not reached: the run stopped first") for c in first["cells not measured"])
    assert _by_target(first)["block kernels"]["status"] == "incomplete"
    assert final["cells not measured"] == "none" and partials[-1] == final
    assert _by_target(final)["block kernels"]["status"] == "met"
