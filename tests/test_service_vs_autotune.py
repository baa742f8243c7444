"""``bench/service_vs_autotune.py``: its targets from a run's figures, and a host without a GPU refused."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench.service_vs_autotune import _compiled_ahead, run, targets

WINNER = {"BLOCK_M": 1, "BLOCK_D": 0, "num_warps": 8, "num_stages": 1, "maxnreg": 128}


def _service(speedup: float, busy: float, gpus: int = 2, command: float = 1.2) -> dict:
    return {"winner": WINNER, "speedup_vs_autotune_sweep": speedup, "speedup_vs_autotune_command": command,
            "command_wall_s": 57.1 / command, "gpu_busy_fraction": busy, "gpus": gpus, "evaluated": 144}


def test_met_only_fast_busy_and_to_the_same_winner_for_the_sweep_and_the_command() -> None:
    same = {"autotune_config": WINNER}
    sweep, command, two = targets(_service(5.45, 0.91), same)
    assert sweep["status"] == "met" and two["status"] == "met"
    assert command["status"] == "missed" and command["measured"] == "1.20x (47.6 s), same winner"
    assert targets(_service(5.45, 0.91, command=3.1), same)[1]["status"] == "met"
    assert targets(_service(5.45, 0.91, command=3.1), {"autotune_config": {**WINNER, "num_warps": 4}})[1]["status"] == "missed"
    assert sweep["measured"] == "5.45x the sweep (1.20x the command, cluster start included), 91% busy, same winner"
    assert targets(_service(3.9, 0.91), same)[0]["status"] == "missed"
    assert targets(_service(5.45, 0.69), same)[0]["status"] == "missed"
    other = targets(_service(5.45, 0.91), {"autotune_config": {**WINNER, "num_warps": 4}})[0]
    assert other["status"] == "missed" and other["measured"].endswith("another winner")
    tie = targets(_service(5.45, 0.91), {"autotune_config": {**WINNER, "maxnreg": None},
                                         "service_default": 0.0947, "autotune": 0.0948})[0]
    assert tie["status"] == "met" and tie["measured"].endswith("as fast as autotune's winner (0.0947 vs 0.0948 ms)")
    slower = targets(_service(5.45, 0.91), {"autotune_config": {**WINNER, "maxnreg": None},
                                            "service_default": 0.0960, "autotune": 0.0948})[0]
    assert slower["status"] == "missed" and slower["measured"].endswith("another winner")
    assert targets(_service(5.45, 0.91, gpus=1), same)[2]["status"] == "not measured: one GPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a host without a GPU")
def test_a_host_without_a_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="none is visible"):
        run(argparse.Namespace(rounds=10))


def test_the_compiles_ahead_are_counted_with_their_median_and_longest() -> None:
    assert _compiled_ahead([0.2, 0.9, 0.4]) == {"configs": 3, "median_s": 0.4, "max_s": 0.9}
    assert _compiled_ahead([]) == {"configs": 0}  # a sweep whose child compiled every config itself
