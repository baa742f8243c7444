"""``bench/indexer_select_passes.py`` replays the selection's two threshold searches in torch: the
interpolating replay must end every row at a threshold that gives the kernel's picks (at most k
keys above it and at least k at or above it: the k-th largest key, or a key between the k-th and
the next), in fewer passes than the bisection."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from indexer_select_passes import interpolated_passes_per_row, order_keys, passes_per_row  # noqa: E402

from kernels.indexer import index_scores_reference  # noqa: E402


def _score_rows() -> torch.Tensor:
    """Causal index scores of 400 queries over 100 entries (Gaussian, V4's scale), with repeated
    values at the k-th place in some rows."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 400, 8, 32, generator=gen).bfloat16()
    k = torch.randn(1, 100, 32, generator=gen).bfloat16()
    w = torch.randn(1, 400, 8, generator=gen) * (8 * 32) ** -0.5
    rows = index_scores_reference(q, k, w)
    rows[:, 300::2, 40:60] = rows[:, 300::2, 20:40]
    return rows


def test_interpolated_replay_ends_at_the_kernels_threshold():
    rows, topk = _score_rows(), 12
    keys = order_keys(rows)
    visible = rows > -float("inf")
    want = visible.sum(-1).clamp(max=topk)
    passes, work, threshold = interpolated_passes_per_row(rows, topk)
    at_or_above = ((keys >= threshold[..., None]) & visible).sum(-1)
    above = ((keys > threshold[..., None]) & visible).sum(-1)
    picking = want > 0
    assert ((above <= want) & (at_or_above >= want))[picking].all()
    assert (work >= passes).all() and passes.max() <= 12 + 32


def test_interpolation_takes_fewer_passes_than_bisection():
    rows, topk = _score_rows(), 12
    picks = (rows[0] > -float("inf")).sum(-1) > topk
    interpolated = interpolated_passes_per_row(rows, topk)[0][0, picks].float().mean()
    bisected = passes_per_row(rows, topk)[0, picks].float().mean()
    assert interpolated < 0.6 * bisected
