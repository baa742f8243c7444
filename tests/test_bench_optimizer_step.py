"""bench/optimizer_step: its parity gate and its figures, on the interpreter's small count."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench import optimizer_step


def _args(**overrides) -> argparse.Namespace:
    return argparse.Namespace(**{"params": 5000, "rounds": 1, "smoke": False, **overrides})


def test_both_steps_pass_parity_and_are_timed():
    figures = optimizer_step.run(_args())
    assert figures["parity"]["ok"] and figures["timed"] and figures["params"] == 5000
    assert figures["parity"]["first_step_error"] <= optimizer_step.PARITY_LIMIT
    for name in ("eager_step", "fused_step", "grad_sq_square_sum", "grad_sq_norm"):
        assert figures[f"{name}_ms"] > 0
    assert figures["fused_over_eager"] == pytest.approx(figures["eager_step_ms"] / figures["fused_step_ms"], abs=0.01)


def test_the_benchmarked_parameters_add_up_and_mix_dtypes():
    params = optimizer_step._parameters(3 * optimizer_step.MATRIX // 2, torch.device("cpu"), seed=0)
    assert sum(p.numel() for p in params) == 3 * optimizer_step.MATRIX // 2
    assert {p.dtype for p in params} == {torch.bfloat16, torch.float32}
    assert all(torch.count_nonzero(p) == p.numel() for p in params[-1:])


def test_a_failed_gate_times_nothing(monkeypatch):
    monkeypatch.setattr(optimizer_step, "PARITY_LIMIT", 0.0)
    figures = optimizer_step.run(_args())
    assert not figures["parity"]["ok"] and figures["timed"] is False and "fused_step_ms" not in figures


@pytest.mark.parametrize("overrides", [{"params": 10}, {"rounds": 0}])
def test_bad_arguments_are_refused(overrides):
    with pytest.raises(ValueError, match="--params must be >= 1000 and --rounds >= 1"):
        optimizer_step.run(_args(**overrides))
