"""Lightning indexer: causal scores against the eager math, top-k sets judged by the reference
scores, exact parity (tie rule included) on integer inputs, tuned configs, the lookup."""

from __future__ import annotations

import pytest
import torch

from kernels import indexer, indexer_sm90, registry
from kernels.arch import current_arch, kernel_device
from kernels.indexer import (
    index_scores_reference, indexer_topk, indexer_topk_reference, select_topk_reference,
)
from search_spaces import load_space
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()


def _gaussian(batch, seq, heads, dim, ratio, seed):
    """q, k as in V4 (unit-normal bf16) and w ~ N(0, 1/(heads*dim)) as the model scales it."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, dim, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(batch, seq // ratio, dim, generator=gen).to(DEVICE, torch.bfloat16)
    w = (torch.randn(batch, seq, heads, generator=gen) * (heads * dim) ** -0.5).to(DEVICE)
    return q, k, w


def _visible(seq, n_keys, ratio):
    """``[S]`` number of entries each query sees."""
    return torch.clamp((torch.arange(seq, device=DEVICE) + 1) // ratio, max=n_keys)


@pytest.mark.parametrize(
    ("batch", "seq", "heads", "dim", "topk", "ratio"),
    [
        (2, 70, 64, 128, 8, 4),   # V4 heads and dim, a 2-token tail
        (1, 33, 64, 128, 20, 4),  # topk above every query's 8 entries: all picked, padded
        (2, 45, 6, 20, 3, 4),     # heads not a multiple of BLOCK_H, dim not a power of two
        (1, 40, 8, 32, 5, 3),     # another ratio
    ],
)
def test_scores_and_top_k_sets_match_eager(batch, seq, heads, dim, topk, ratio):
    q, k, w = _gaussian(batch, seq, heads, dim, ratio, seed=seq + heads)
    n_keys = seq // ratio
    ref_rows = index_scores_reference(q, k, w, ratio)
    visible = _visible(seq, n_keys, ratio)

    # Key tiles of 16 entries: several per query block at these sizes, walked by one program or
    # one program each (KEY_TILES 1: the key range as a grid axis).
    mask = torch.arange(n_keys, device=DEVICE) < visible[:, None]
    for key_tiles in (0, 1):
        config = {**registry.get("indexer_fwd").default_config({"batch": batch, "seq": seq, "topk": topk}),
                  "BLOCK_T": 16, "KEY_TILES": key_tiles}
        rows = indexer._score_rows(q, k, w, ratio, config)[0]
        torch.testing.assert_close(rows[:, mask], ref_rows[:, mask], atol=1e-5, rtol=1e-5)

    indices, scores = indexer_topk(q, k, w, topk, ratio)
    assert indices.shape == scores.shape == (batch, seq, topk)
    assert indices.dtype == torch.int32 and scores.dtype == torch.float32
    want = torch.clamp(visible, max=topk).expand(batch, seq)
    slots = torch.arange(topk, device=DEVICE)
    picked = slots < want[..., None]
    # Picks first, in ascending index order, each visible; then -1 / -inf padding.
    assert (indices[~picked] == -1).all() and (scores[~picked] == -float("inf")).all()
    assert (indices[picked] >= 0).all() and (indices < visible[:, None]).all()
    assert (indices[..., 1:].long() - indices[..., :-1] > 0)[picked[..., 1:]].all()
    assert (indices[:, : ratio - 1] == -1).all()  # the first queries see nothing
    # Each returned score is the query's score of the returned entry.
    gathered = ref_rows.gather(-1, indices.long().clamp(min=0))
    torch.testing.assert_close(scores[picked], gathered[picked], atol=1e-5, rtol=1e-5)
    # The set is a top-k of the reference scores, up to the scores' own error.
    ref_indices, ref_scores = select_topk_reference(ref_rows, topk)
    kth = ref_scores.masked_fill(ref_indices < 0, float("inf")).amin(-1, keepdim=True)
    assert (gathered >= kth - 1e-5)[picked].all()
    torch.testing.assert_close(gathered.masked_fill(~picked, 0).sum(-1), ref_scores.masked_fill(~picked, 0).sum(-1),
                               atol=1e-4, rtol=1e-5)
    # Random floats rarely tie: the sets agree outright.
    assert torch.equal(indices, ref_indices)


def test_integer_inputs_match_exactly_and_ties_go_to_the_lower_index():
    kernel = registry.get("indexer_fwd")
    shape = {"batch": 2, "seq": 70, "topk": 8}
    inputs = kernel.make_inputs(shape, DEVICE, 1)
    indices, scores = indexer_topk(inputs["q"], inputs["k"], inputs["w"], shape["topk"])
    ref_indices, ref_scores = indexer_topk_reference(inputs["q"], inputs["k"], inputs["w"], shape["topk"])
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)
    # The inputs do exercise the tie rule: some query's k-th and (k+1)-th best scores are equal.
    rows = index_scores_reference(inputs["q"], inputs["k"], inputs["w"])
    best = rows.sort(-1, descending=True).values[..., shape["topk"] - 1: shape["topk"] + 1]
    assert (best[..., 0] == best[..., 1]).any()


def test_equal_scores_pick_the_lowest_indices():
    """Zero keys give every entry the score +-0 (the sign from w): the first topk entries win."""
    q, k, w = _gaussian(2, 64, 8, 32, 4, seed=5)
    indices, scores = indexer_topk(q, torch.zeros_like(k), w, 6)
    visible = _visible(64, 16, 4)
    expected = torch.where(torch.arange(6, device=DEVICE) < visible[:, None], torch.arange(6, device=DEVICE), -1)
    assert torch.equal(indices, expected.int().expand(2, 64, 6))
    assert (scores[indices >= 0] == 0).all()


@pytest.mark.parametrize("select_interp", [0, 1])
@pytest.mark.parametrize("topk", [1, 5, 40])
def test_selection_matches_a_stable_sort_on_tied_rows(topk, select_interp):
    """Score rows of five values, -0.0 and +0.0 among them: most picks are among equal scores,
    which go to the lower index, -0.0 tying with +0.0."""
    gen = torch.Generator().manual_seed(topk)
    levels = torch.tensor([-1.5, -0.0, 0.0, 2.0, 3.25])
    rows = levels[torch.randint(5, (3, 150, 37), generator=gen)].to(DEVICE)
    config = {**registry.get("indexer_fwd").default_config({"batch": 3, "seq": 150, "topk": topk}),
              "SELECT_INTERP": select_interp}
    indices, scores = indexer._select(rows[None], topk, 4, config)
    hidden = torch.arange(37, device=DEVICE) >= _visible(150, 37, 4)[:, None]
    ref_indices, ref_scores = select_topk_reference(rows.masked_fill(hidden, -float("inf")), topk)
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)


@pytest.mark.parametrize("select_interp", [0, 1])
@pytest.mark.parametrize("select_rows", [1, 4])
def test_selection_matches_a_stable_sort_across_the_float_range(select_rows, select_interp):
    """Scores of both signs from subnormal to 1e38, some repeated: the bisection takes every one of
    the 32 key bits (high ones set apart the signs and exponents, low ones the near-equal values),
    the interpolating search falls back to halving its bracket (interpolated values land far
    from the k-th across such a range), and rows that finish early wait in a program with rows
    that do not."""
    gen = torch.Generator().manual_seed(select_rows)
    magnitude = torch.exp2(torch.randint(-140, 127, (2, 96, 24), generator=gen).float())
    sign = torch.randint(0, 2, (2, 96, 24), generator=gen) * 2 - 1
    values = magnitude * (1 + torch.rand(2, 96, 24, generator=gen)) * sign
    values[:, ::3, :8] = values[:, ::3, 8:16]  # repeated values, ties at the k-th place
    values[:, 1::5, 5] = torch.nextafter(values[:, 1::5, 6], torch.tensor(float("inf")))  # one ulp apart
    rows = values.to(DEVICE)
    config = {**registry.get("indexer_fwd").default_config({"batch": 2, "seq": 96, "topk": 7}),
              "SELECT_ROWS": select_rows, "SELECT_INTERP": select_interp}
    indices, scores = indexer._select(rows[None], 7, 4, config)
    hidden = torch.arange(24, device=DEVICE) >= _visible(96, 24, 4)[:, None]
    ref_indices, ref_scores = select_topk_reference(rows.masked_fill(hidden, -float("inf")), 7)
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)


@pytest.mark.parametrize("select_interp", [0, 1])
def test_selection_matches_a_stable_sort_on_index_score_rows(select_interp):
    """Rows of up to 300 Gaussian index scores (V4's scale), with near-equal pairs one ulp apart and
    repeated values at random places: the interpolating search's passes go on past its first
    counting-only ones, so both its ends move and snap to keys."""
    q, k, w = _gaussian(1, 1200, 8, 32, 4, seed=11)
    rows = index_scores_reference(q, k, w, 4)[0]
    gen = torch.Generator().manual_seed(11)
    pairs = torch.randint(0, 299, (400,), generator=gen)
    rows[800:, pairs] = torch.nextafter(rows[800:, pairs + 1], torch.tensor(float("inf"), device=DEVICE))
    rows[1000::2, 150:200] = rows[1000::2, 100:150]
    config = {**registry.get("indexer_fwd").default_config({"batch": 1, "seq": 1200, "topk": 40}),
              "SELECT_INTERP": select_interp}
    indices, scores = indexer._select(rows[None, None], 40, 4, config)
    ref_indices, ref_scores = select_topk_reference(rows[None], 40)
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)


def test_outputs_carry_no_gradient():
    q, k, w = _gaussian(1, 16, 4, 16, 4, seed=0)
    indices, scores = indexer_topk(q.requires_grad_(), k.requires_grad_(), w.requires_grad_(), 2)
    assert not indices.requires_grad and not scores.requires_grad


CONFIGS = [
    # One head per dot (no head reshape), two key tiles at seq 70.
    {"BLOCK_S": 16, "BLOCK_H": 1, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 1,
     "SELECT_ROWS": 4, "SELECT_WARPS": 2, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0},
    # The same by TMA descriptors, one key tile a program.
    {"BLOCK_S": 16, "BLOCK_H": 1, "BLOCK_T": 16, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 4, "SELECT_WARPS": 2, "TMA": 1, "HEAD_SPLITS": 1, "GLUON": 0},
    # 8 heads per dot; query blocks taller than seq 37 and 48 (one stage: sm_90's shared memory).
    {"BLOCK_S": 64, "BLOCK_H": 8, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 8, "num_stages": 1,
     "SELECT_ROWS": 16, "SELECT_WARPS": 8, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0},
    # One key tile a program (the key range as a grid axis).
    {"BLOCK_S": 8, "BLOCK_H": 4, "BLOCK_T": 16, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 8, "SELECT_WARPS": 4, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0},
    # The heads summed once per key tile, over two key tiles at seq 70.
    {"BLOCK_S": 8, "BLOCK_H": 4, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 1, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 2, "SELECT_WARPS": 1, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0},
    # The interpolating threshold search.
    {"BLOCK_S": 16, "BLOCK_H": 2, "BLOCK_T": 16, "KEY_TILES": 1, "LATE_HEAD_SUM": 1, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 4, "SELECT_WARPS": 2, "SELECT_INTERP": 1, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0},
    # The heads over four programs, their partial scores summed by the selection.
    {"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": 16, "KEY_TILES": 1, "LATE_HEAD_SUM": 1, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 4, "SELECT_WARPS": 2, "SELECT_INTERP": 1, "TMA": 1, "HEAD_SPLITS": 4, "GLUON": 0},
    # Keys down the dot's rows, every head of 2 queries across it (the q block loaded once).
    {"BLOCK_S": 2, "BLOCK_H": 64, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 4, "SELECT_WARPS": 2, "SELECT_INTERP": 1, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "KEY_ROWS": 1},
    # ... in head blocks of 32, each scoring program picking its own rows' top-k in two steps of 4 rows
    # (no selection launch).
    {"BLOCK_S": 8, "BLOCK_H": 32, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 2,
     "SELECT_ROWS": 4, "SELECT_WARPS": 4, "SELECT_INTERP": 1, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "KEY_ROWS": 1,
     "SELECT_IN_SCORING": 1},
]


@pytest.mark.parametrize("late_head_sum", [0, 1])
def test_scores_match_eager_with_heads_summed_per_block_or_per_tile(late_head_sum):
    """Gaussian inputs, 6 heads in dots of 4 (the second block ragged), a 3-token tail."""
    q, k, w = _gaussian(2, 43, 6, 32, 4, seed=9)
    config = {"BLOCK_S": 8, "BLOCK_H": 4, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": late_head_sum,
              "num_warps": 4, "num_stages": 1}
    scores = indexer._score_rows(q, k, w, 4, config)[0]
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    torch.testing.assert_close(scores[visible], reference[visible], rtol=1e-5, atol=1e-5)


def test_scores_match_eager_with_every_head_in_one_block():
    """BLOCK_H covering all 6 heads: the block's q rows are loaded once and serve each of the three
    key tiles the program walks (37 entries in tiles of 16, the last ragged)."""
    q, k, w = _gaussian(1, 150, 6, 32, 4, seed=13)
    config = {"BLOCK_S": 8, "BLOCK_H": 8, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 4,
              "num_stages": 1}
    scores = indexer._score_rows(q, k, w, 4, config)[0]
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    torch.testing.assert_close(scores[visible], reference[visible], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("block_h", "splits", "late_head_sum", "tma"), [
    (2, 2, 0, 0),  # 6 heads as 4 + 2: the second split's last head block ragged
    (2, 4, 1, 0),  # 6 heads as 2 + 2 + 2 + none: the last split stores zeros
    (4, 2, 0, 1),  # by TMA: the first split's box of 4 heads, the second's past the heads zero-filled
    (8, 1, 0, 0),  # every head in one block: one split is the unsplit kernel
])
def test_scores_split_over_head_programs_sum_to_eager(block_h, splits, late_head_sum, tma):
    """Each split stores its heads' share of the scores into its own buffer; in split order they
    sum to the eager scores (two batch elements, a 3-token tail, two key tiles a query block)."""
    q, k, w = _gaussian(2, 43, 6, 32, 4, seed=21 + splits)
    config = {"BLOCK_S": 8, "BLOCK_H": block_h, "BLOCK_T": 8, "KEY_TILES": 0, "LATE_HEAD_SUM": late_head_sum,
              "num_warps": 4, "num_stages": 1, "TMA": tma, "HEAD_SPLITS": splits}
    partials = indexer._score_rows(q, k, w, 4, config)
    assert partials.shape == (splits, 2, 43, 10)
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    for split, heads in enumerate(torch.arange(6).split(-(-6 // splits // block_h) * block_h)):
        share = index_scores_reference(q[:, :, heads], k, w[:, :, heads], 4)
        torch.testing.assert_close(partials[split][visible], share[visible], rtol=1e-5, atol=1e-5)
    if splits == 4:  # the fourth split holds no head
        assert (partials[3][visible] == 0).all()
    torch.testing.assert_close(partials.sum(0)[visible], reference[visible], rtol=1e-5, atol=1e-5)


def test_selection_sums_the_head_splits_before_it_picks():
    """Two partial rows whose own top entries differ from their sum's: the selection must pick by
    the sum, in split order, not by either part."""
    gen = torch.Generator().manual_seed(5)
    total = torch.randn(1, 64, 16, generator=gen)
    first = torch.randn(1, 64, 16, generator=gen) * 10
    partials = torch.stack([first, total - first]).to(DEVICE)
    config = {**registry.get("indexer_fwd").default_config({"batch": 1, "seq": 64, "topk": 5}), "HEAD_SPLITS": 2}
    indices, scores = indexer._select(partials, 5, 4, config)
    summed = partials[0] + partials[1]
    hidden = torch.arange(16, device=DEVICE) >= _visible(64, 16, 4)[:, None]
    ref_indices, ref_scores = select_topk_reference(summed.masked_fill(hidden, -float("inf")), 5)
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)
    first_indices, _ = select_topk_reference(partials[0].masked_fill(hidden, -float("inf")), 5)
    assert not torch.equal(indices, first_indices)


@pytest.mark.parametrize("tma", [1, 2], ids=["host-encoded", "device-built"])
@pytest.mark.parametrize(("block_s", "block_h", "heads", "dim", "late_head_sum"), [
    (8, 1, 8, 32, 0),   # one head a dot: the [B * S, H * D] descriptor
    (16, 1, 8, 24, 0),  # dim 24 pads to 32: the box also takes the next head's columns
    (2, 8, 8, 32, 0),   # every head in one box
    (4, 8, 6, 40, 0),   # 6 heads in a box of 8: heads past H come back as zeros
    (8, 4, 6, 32, 1),   # head blocks of 4 (the second ragged), summed once a key tile
])
def test_scores_by_tma_descriptors_match_eager(block_s, block_h, heads, dim, late_head_sum, tma):
    """TMA boxes over two batch elements whose query blocks run past the sequence (45 queries: the
    next element's rows, or zeros, fill the box) and key tiles past the entries; k's zero-filled
    columns past D must cancel whatever q's box holds there. Descriptors encoded on the host (TMA 1)
    or built by each program (TMA 2)."""
    q, k, w = _gaussian(2, 45, heads, dim, 4, seed=17 + dim + heads)
    config = {"BLOCK_S": block_s, "BLOCK_H": block_h, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": late_head_sum,
              "num_warps": 4, "num_stages": 1, "TMA": tma}
    dim_pad = max(16, 1 << (dim - 1).bit_length())
    assert indexer._score_operands(q, k, config, dim_pad)[2] == tma, "the TMA path must run"
    scores = indexer._score_rows(q, k, w, 4, config)[0]
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    torch.testing.assert_close(scores[visible], reference[visible], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("block_s", "block_h", "key_tiles", "late_head_sum", "tma", "splits"), [
    (2, 8, 0, 0, 0, 1),   # every head of a query in one block of columns, three key tiles a program
    (4, 4, 0, 0, 0, 1),   # 6 heads in column blocks of 4, the second ragged, summed per block
    (4, 4, 1, 1, 0, 1),   # ... summed once a key tile; one key tile a program
    (8, 2, 0, 0, 1, 1),   # by TMA descriptors, encoded on the host
    (4, 8, 0, 0, 2, 1),   # ... or built by each program
    (2, 2, 0, 1, 0, 2),   # the heads over two programs, each storing its share
])
def test_scores_with_keys_as_the_dot_rows_match_eager(block_s, block_h, key_tiles, late_head_sum, tma, splits):
    """KEY_ROWS: keys down the dot's rows and (query, head) columns, each query's heads summed across
    them, stored transposed. Two batch elements, a 3-token tail, 150 queries (37 entries in key
    tiles of 16, the last ragged), 6 heads."""
    q, k, w = _gaussian(2, 150, 6, 32, 4, seed=31 + block_h + splits)
    config = {"BLOCK_S": block_s, "BLOCK_H": block_h, "BLOCK_T": 16, "KEY_TILES": key_tiles,
              "LATE_HEAD_SUM": late_head_sum, "num_warps": 4, "num_stages": 1, "TMA": tma, "HEAD_SPLITS": splits,
              "KEY_ROWS": 1}
    assert indexer._score_operands(q, k, config, 32)[2] == tma, "the TMA path must run"
    partials = indexer._score_rows(q, k, w, 4, config)
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    torch.testing.assert_close(partials.sum(0)[visible], reference[visible], rtol=1e-5, atol=1e-5)


def test_key_rows_space_counts_no_restaged_head_sum_and_the_dot_alone_in_registers():
    """The four-query, 64-head, 64-key KEY_ROWS tiling on 4 warps compiles without spills (offline
    sm_90); its (query, head)-row twin needs the head sum restaged and more registers than half."""
    space, shape = load_space("indexer_fwd"), registry.get("indexer_fwd").presets["v4-flash"][0]
    config = {**registry.get("indexer_fwd").default_config(shape), "BLOCK_S": 4, "BLOCK_H": 64, "BLOCK_T": 64,
              "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "KEY_ROWS": 1, "num_stages": 2, "maxnreg": None}
    assert space.violation(config, shape, "sm_90") is None
    assert "BLOCK_S * (BLOCK_H" in space.violation({**config, "KEY_ROWS": 0}, shape, "sm_90")
    wide = {**config, "BLOCK_T": 128}  # twice the dot: past half the registers of 4 warps, not of 8
    assert "not KEY_ROWS" in space.violation(wide, shape, "sm_90")
    assert space.violation({**wide, "num_warps": 8}, shape, "sm_90") is None
    # Wider than 256 columns: wrong scores on the H200.
    assert "BLOCK_S * BLOCK_H <= 256" in space.violation({**config, "BLOCK_S": 8, "num_warps": 8}, shape, "sm_90")
    # 8 queries x 16 heads x 128 keys, 5 q stages: 192 KiB with the key tile; the row form's restaged
    # head sum (64 KiB more) does not fit sm_90's 227 KiB.
    staged = {**config, "BLOCK_S": 8, "BLOCK_H": 16, "BLOCK_T": 128, "num_stages": 5}
    assert space.violation(staged, shape, "sm_90") is None
    assert "shared memory" in space.violation({**staged, "num_warps": 8, "KEY_ROWS": 0}, shape, "sm_90")


@pytest.mark.parametrize("key_rows", [0, 1])
@pytest.mark.parametrize("topk", [5, 20])
def test_selection_in_the_scoring_programs_matches_its_own_launch(key_rows, topk):
    """SELECT_IN_SCORING: each scoring program picks the top-k of the rows it scored, 2 of its 4 rows
    at a time. Gaussian inputs, two batch elements, a 2-token tail; topk 20 exceeds what the early
    queries see (-1 padding) and what any sees at all (17 entries)."""
    q, k, w = _gaussian(2, 70, 8, 32, 4, seed=41 + topk)
    config = {"BLOCK_S": 4, "BLOCK_H": 8, "BLOCK_T": 16, "KEY_TILES": 0, "LATE_HEAD_SUM": 0, "num_warps": 4,
              "num_stages": 1, "KEY_ROWS": key_rows, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "SELECT_ROWS": 2,
              "SELECT_WARPS": 4, "SELECT_INTERP": 1}
    apart = indexer._forward(q, k, w, topk, 4, {**config, "SELECT_IN_SCORING": 0})
    fused = indexer._forward(q, k, w, topk, 4, {**config, "SELECT_IN_SCORING": 1})
    assert torch.equal(fused[0], apart[0]) and torch.equal(fused[1], apart[1])
    ref_indices, ref_scores = indexer_topk_reference(q, k, w, topk, 4)
    assert torch.equal(fused[0], ref_indices)
    torch.testing.assert_close(fused[1], ref_scores, rtol=1e-5, atol=1e-5)


def test_selection_in_the_scoring_says_what_it_needs():
    q, k, w = _gaussian(1, 40, 4, 32, 4, seed=2)
    config = {**registry.get("indexer_fwd").default_config({"batch": 1, "seq": 40, "topk": 3}), "SELECT_IN_SCORING": 1,
              "KEY_TILES": 2, "HEAD_SPLITS": 2, "SELECT_ROWS": 32}
    with pytest.raises(ValueError, match=r"SELECT_IN_SCORING 1 needs KEY_TILES 0 \(got 2\); HEAD_SPLITS 1 \(got 2\); "
                                         r"SELECT_ROWS at most BLOCK_S 16 \(got 32\)"):
        indexer._forward(q, k, w, 3, 4, config)
    space, shape = load_space("indexer_fwd"), registry.get("indexer_fwd").presets["v4-flash"][0]
    entry = {**registry.get("indexer_fwd").default_config(shape), "SELECT_IN_SCORING": 1, "SELECT_ROWS": 4,
             "SELECT_WARPS": 4}
    assert space.violation(entry, shape, "sm_90") is None
    assert "KEY_TILES == 0" in space.violation({**entry, "KEY_TILES": 1}, shape, "sm_90")
    assert "SELECT_WARPS == num_warps" in space.violation({**entry, "SELECT_WARPS": 2}, shape, "sm_90")


GLUON_CONFIG = {"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 128, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "TMA": 0,
                "HEAD_SPLITS": 1, "GLUON": 1, "KEY_ROWS": 0, "SELECT_IN_SCORING": 0, "num_warps": 4, "num_stages": 3,
                "SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1}
GLUON_TILINGS = [{"BLOCK_T": t, "num_warps": w, "num_stages": n} for t, w in indexer_sm90.TILES.items()
                 for n in indexer_sm90.STAGES]


@pytest.mark.skipif(DEVICE.type != "cuda" or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon scoring is sm_90's (Gluon has no interpreter mode)")
@pytest.mark.parametrize(("batch", "seq", "heads"), [(2, 300, 64), (1, 1100, 64), (2, 45, 3)],
                         ids=["b2-ragged", "three-tiles", "fewer-heads-than-slots"])
def test_gluon_scores_match_eager(batch, seq, heads):
    """The sm_90 Gluon scoring at each tiling and ring depth: query blocks past the sequence and
    into the next batch element (their rows copy the last query's), key tiles past the entries,
    several key tiles (275 entries), and fewer heads than the ring copies ahead."""
    q, k, w = _gaussian(batch, seq, heads, 128, 4, seed=seq + heads)
    reference = index_scores_reference(q, k, w, 4)
    visible = reference > -float("inf")
    for tiling in GLUON_TILINGS:
        scores = indexer._score_rows(q, k, w, 4, {**GLUON_CONFIG, **tiling})[0]
        torch.testing.assert_close(scores[visible], reference[visible], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEVICE.type != "cuda" or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon scoring is sm_90's (Gluon has no interpreter mode)")
@pytest.mark.parametrize("tiling", GLUON_TILINGS, ids=lambda t: f"{t['BLOCK_T']}x{t['num_stages']}")
def test_gluon_config_matches_reference_exactly(tiling):
    """Indices and scores of the registered launch (integer inputs: exact, tie rule included), at
    sequences long enough for the Gluon key tiles of 128 and 256 entries (the small presets have at
    most 17 entries): 275 entries in two batch elements (a ragged last tile), and 150 (128-entry
    tiles only: the space prunes one 256-entry tile)."""
    shapes = [{"batch": 2, "seq": 1100, "topk": 64}, {"batch": 1, "seq": 603, "topk": 100}]
    assert_config_matches_reference(registry.get("indexer_fwd"), {**GLUON_CONFIG, **tiling}, seed=3, shapes=shapes)


def test_gluon_scoring_says_where_it_cannot_run():
    q, k, w = _gaussian(1, 40, 4, 128, 4, seed=1)
    if current_arch() != "sm_90":
        with pytest.raises(ValueError, match="GLUON is the sm_90 form of the indexer's scoring"):
            indexer._score_rows(q, k, w, 4, GLUON_CONFIG)
    assert indexer_sm90.fits(GLUON_CONFIG, 128) is None
    assert indexer_sm90.fits({**GLUON_CONFIG, "BLOCK_H": 2, "TMA": 1, "KEY_ROWS": 1, "BLOCK_T": 256}, 64) == (
        "BLOCK_H 2 (it needs 1); TMA 1 (it needs 0); KEY_ROWS 1 (it needs 0); BLOCK_T 256 on 4 warps (it takes 128 "
        "on 4 or 256 on 8); head dimension 64 (it needs 128)")
    space, shape = load_space("indexer_fwd"), registry.get("indexer_fwd").presets["v4-flash"][0]
    assert space.violation(GLUON_CONFIG, shape, "sm_90") is None
    assert "wgmma" in space.violation(GLUON_CONFIG, shape, "sm_100")  # warpgroup MMA is sm_90's
    assert "num_warps == 4" in space.violation({**GLUON_CONFIG, "num_warps": 8}, shape, "sm_90")
    assert "KEY_TILES == 1" in space.violation({**GLUON_CONFIG, "KEY_TILES": 0}, shape, "sm_90")


def test_tma_falls_back_to_pointers_on_rows_it_cannot_address():
    q, k, _ = _gaussian(1, 16, 6, 30, 4, seed=0)  # 60-byte rows: not 16-byte aligned
    config = {"BLOCK_S": 8, "BLOCK_H": 2, "BLOCK_T": 16, "TMA": 1}
    assert not indexer._score_operands(q, k, config, 32)[2]
    q, k, _ = _gaussian(1, 16, 6, 32, 4, seed=0)
    assert indexer._score_operands(q, k, config, 32)[2]
    assert not indexer._score_operands(q, k, {**config, "TMA": 0}, 32)[2]


@pytest.mark.parametrize("config", CONFIGS)
def test_tuned_configs_match_reference(config):
    kernel, space = registry.get("indexer_fwd"), load_space("indexer_fwd")
    # Over the default, as resolve runs a table entry: the later parameters take their default.
    config = {**kernel.default_config(kernel.presets["small"][0]), **config}
    # Shapes the space prunes the config for are skipped: at least one must remain.
    assert any(space.violation(config, shape, current_arch()) is None for shape in kernel.presets["small"])
    assert_config_matches_reference(kernel, config, seed=3)


def test_inputs_are_seeded_random_and_compile_accepts_default():
    kernel = registry.get("indexer_fwd")
    assert_seeded_random_inputs(kernel, kernel.presets["small"][0])


def test_defaults_fit_the_space_on_sm_90():
    assert_defaults_fit_space("indexer_fwd", ("v4-flash", "v4-pro", "small"))


def test_launch_resolves_the_registered_shape(monkeypatch):
    looked_up = spy_on_resolve(monkeypatch, indexer)
    indexer_topk(*_gaussian(1, 20, 4, 16, 4, seed=0), 3)
    assert looked_up == [("indexer_fwd", "batch=1,seq=20,topk=3")]


def test_bad_arguments_are_rejected():
    q, k, w = _gaussian(1, 16, 4, 16, 4, seed=0)
    with pytest.raises(ValueError):
        indexer_topk(q, k[:, :3], w, 2)  # not S // ratio entries
    with pytest.raises(ValueError):
        indexer_topk(q, k, w[..., :3], 2)  # w for other heads
    with pytest.raises(ValueError):
        indexer_topk(q.float(), k, w, 2)  # fp32 queries
    with pytest.raises(ValueError):
        indexer_topk(q, k, w, 0)
    with pytest.raises(ValueError):
        indexer_topk(q[0], k, w, 2)


def test_flops_count_the_causal_pairs_and_bytes_each_tensor_once():
    kernel = registry.get("indexer_fwd")
    shape = {"batch": 2, "seq": 10, "topk": 2}
    pairs = 2 * sum(min((s + 1) // 4, 2) for s in range(10))  # 0,0,0,1,1,1,1,2,2,2 per batch element
    assert pairs == 20
    assert kernel.flops(shape) == 2 * 64 * 128 * pairs
    assert kernel.bytes_moved(shape) == 2 * 2 * (10 * 64 * 128 + 10 * 64 + 2 * 128) + 2 * 10 * 2 * 8
