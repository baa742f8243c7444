"""bench/expert_mlp: its parity gate, its figures and its targets, on the interpreter's small shape."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench import expert_mlp
from bench.expert_mlp import OUTPUTS, SMOKE_SHAPES, bench_shape, errors, expert_inputs, fp32_reference, parity, targets


@pytest.fixture(scope="module")
def smoke_result() -> dict:
    return bench_shape(SMOKE_SHAPES["smoke"], rounds=1, device=torch.device("cpu"))


def test_the_fused_path_passes_parity_in_both_gradient_modes_and_is_timed(smoke_result):
    assert smoke_result["status"] == "ok"
    for mode in expert_mlp.GRAD_MODES:
        check = smoke_result["parity"][mode]
        assert check["ok"] and set(check["triton_error"]) == set(OUTPUTS)
        for impl in ("triton", "peer"):
            times = smoke_result["times"][f"{impl}/{mode}"]
            assert times["fwd_ms"] > 0 and times["fwd_bwd_ms"] > 0
            assert times["bwd_ms"] == pytest.approx(times["fwd_bwd_ms"] - times["fwd_ms"])


def test_a_wrong_output_fails_parity_and_a_peer_sized_error_passes():
    inputs = expert_inputs(SMOKE_SHAPES["smoke"], torch.device("cpu"))
    reference = fp32_reference(inputs)
    exact = errors(reference, reference)
    assert all(value == 0.0 for value in exact.values())
    wrong = (reference[0] * 1.1, *reference[1:])  # y off by 10%
    assert not parity(errors(wrong, reference), exact)["ok"]
    peer = dict.fromkeys(OUTPUTS, 0.04)
    assert parity(dict.fromkeys(OUTPUTS, 0.05), peer)["ok"]  # within twice the peer's own error


def test_targets_judge_each_gradient_mode_and_a_failed_shape_is_a_miss(smoke_result):
    rows = targets({"smoke": smoke_result, "broken": {"status": "parity failed: not timed"}})
    assert len(rows) == 2 * len(expert_mlp.GRAD_MODES) + 1
    assert rows[-1]["status"] == "missed" and "parity failed" in rows[-1]["measured"]
    for row in rows[:-1]:
        assert row["status"] in ("met", "missed")


def test_bad_arguments_are_refused_by_name():
    args = argparse.Namespace(shapes="v4-ultra", rounds=1, smoke=False)
    with pytest.raises(ValueError, match="GPU|--shapes"):
        expert_mlp.run(args)
    with pytest.raises(ValueError, match="--rounds"):
        expert_mlp.run(argparse.Namespace(shapes="", rounds=0, smoke=True))


def test_each_launch_is_timed_alone_with_the_config_the_layer_resolves():
    figures = expert_mlp.launch_times(SMOKE_SHAPES["smoke"], torch.device("cpu"))
    launches = figures["launches"]
    assert set(launches) == set(expert_mlp.FORWARD_LAUNCHES + expert_mlp.BACKWARD_LAUNCHES)
    assert all(row["ms"] > 0 and row["tflops"] > 0 and row["config_from"] in ("env", "table", "default")
               for row in launches.values())
    assert figures["backward_launches_ms"] == pytest.approx(sum(launches[n]["ms"] for n in expert_mlp.BACKWARD_LAUNCHES))
