"""The benchmarking child's parity check (``workers.bench_child.mismatch``): what it reports, whatever
the size of the pieces it compares at a time."""

from __future__ import annotations

import pytest
import torch

from workers import bench_child
from workers.bench_child import mismatch


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    reference = torch.randn(7, 13, generator=gen)
    out = reference.clone()
    out[2, 3] += 0.5  # out of tolerance
    out[5, 11] -= 2.0  # the worst
    out[6, 0] += 1e-6  # within it
    return out, reference


@pytest.mark.parametrize("chunk", [1 << 26, 10, 1])
def test_the_report_is_the_same_in_any_chunks(chunk, monkeypatch):
    monkeypatch.setattr(bench_child, "COMPARE_CHUNK", chunk)
    out, reference = _pair()
    assert mismatch((out,), (reference,), 1e-3, 1e-3) == (
        "output 0: 2 elements out of tolerance (atol=0.001, rtol=0.001); worst |diff|=2")
    assert mismatch((reference.clone(),), (reference,), 1e-3, 1e-3) is None
    assert mismatch((out.bfloat16(),), (reference,), 1.0, 0.0) == (
        "output 0: 1 elements out of tolerance (atol=1.0, rtol=0.0); worst |diff|=2")


@pytest.mark.parametrize("chunk", [1 << 26, 4])
def test_non_finite_values_and_shapes_are_named(chunk, monkeypatch):
    monkeypatch.setattr(bench_child, "COMPARE_CHUNK", chunk)
    out, reference = _pair()
    out[6, 12] = float("nan")
    assert mismatch((reference, out), (reference, reference), 1e-3, 1e-3) == "output 1: non-finite values"
    assert mismatch((out[:, :5],), (reference,), 1e-3, 1e-3) == "output 0: shape (7, 5) != reference (7, 13)"
    assert mismatch((out,), (reference, reference), 1e-3, 1e-3) == "returned 1 outputs, reference has 2"
