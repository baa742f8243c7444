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


def _score_rows() -> torch.Tensor:
    """2,000 rows of 300 Gaussian scores, all visible, with the 8th to 20th largest of each row made
    equal (ties straddle the 12th place) and one-ulp pairs: rows that take the search past its
    counting-only passes, to where its ends snap to keys."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(1, 2000, 300, generator=gen)
    ranked = rows.sort(-1, descending=True)
    tied = ranked.indices[..., 7:20]
    rows.scatter_(-1, tied, ranked.values[..., 7:8].expand_as(tied))
    rows[..., 1::7] = torch.nextafter(rows[..., ::7][..., :43], torch.tensor(float("inf")))
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
