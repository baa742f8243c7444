"""Sparse single-latent attention with sink (window / CSA / HCA): parity with the eager reference."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels import registry, sparse_attention, sparse_attention_sm90, tuning
from kernels.arch import kernel_device
from kernels.sparse_attention import sparse_attention as attend
from kernels.sparse_attention import sparse_attention_reference
from search_spaces import load_space
from v4 import attention_ops
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
KERNELS = ("sparse_attn_fwd", "sparse_attn_bwd")


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 3e-2) -> None:
    """Per element within ``tol`` of the larger of its row's and the tensor's RMS, plus ``tol``
    relative (a row: one head's or one entry's 512 values).

    P and dS are rounded to bf16 before their matmuls (truncated by the interpreter): errors
    scale with a row's terms, which can be far larger than the row (dq cancels) or than the
    tensor (a query with few entries); about 0.5% of that on average, a few percent at most.
    """
    actual, expected = actual.float(), expected.float()
    scale = expected.square().mean().sqrt()
    if expected.dim() > 1:
        scale = torch.maximum(expected.square().mean(-1, keepdim=True).sqrt(), scale)
    excess = (actual - expected).abs() - tol * (scale + expected.abs())
    assert excess.max() <= 0, f"{int((excess > 0).sum())} of {excess.numel()} elements off by up to {excess.max():.3g}"


def _problem(batch: int, seq: int, heads: int, ratio: int, topk: int, window: int, seed: int,
             scattered: bool = False) -> dict:
    """Registered inputs and a dO; with ``scattered``, CSA rows in ``_scattered`` layouts."""
    shape = {"batch": batch, "seq": seq, "heads": heads, "ratio": ratio, "topk": topk, "window": window}
    inputs = registry.get("sparse_attn_fwd").make_inputs(shape, DEVICE, seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    inputs["do"] = torch.randn(inputs["q"].shape, generator=gen, device=DEVICE).to(torch.bfloat16)
    if scattered:
        inputs["indices"] = _scattered(inputs["indices"], seed)
    return inputs


def _shuffled(indices: torch.Tensor, seed: int) -> torch.Tensor:
    """Each row's slots in a random order."""
    gen = torch.Generator(device=indices.device).manual_seed(seed)
    return indices.gather(-1, torch.rand(indices.shape, generator=gen, device=indices.device).argsort(-1))


def _scattered(indices: torch.Tensor, seed: int) -> torch.Tensor:
    """The indexer's rows ``_shuffled``, each row's last slot copied into its first: -1 padding
    between picks, picks past slot ``min(topk, (s + 1) // 4)`` and picks listed twice, all of
    which V4's public semantics allow (each slot one entry, each -1 skipped alone)."""
    rows = _shuffled(indices, seed)
    rows[..., 0] = rows[..., -1]
    return rows


def _layouts_present(indices: torch.Tensor) -> dict[str, bool]:
    """Which of ``_scattered``'s layouts ``indices`` holds somewhere."""
    picks = indices >= 0
    before, after = picks.cummax(-1).values, picks.flip(-1).cummax(-1).values.flip(-1)
    bound = (torch.arange(indices.shape[1], device=indices.device) + 1) // sparse_attention.CSA_RATIO
    late = picks & (torch.arange(indices.shape[2], device=indices.device)[None, :] >= bound[:, None])
    ordered = indices.sort(-1).values
    return {"padding between picks": bool((~picks & before & after).any()), "late picks": bool(late.any()),
            "picks twice": bool(((ordered.diff(dim=-1) == 0) & (ordered[..., 1:] >= 0)).any())}


PROBLEMS = [
    # window 5 < seq: early queries have fewer entries; 3 heads in a 16-row block
    pytest.param(2, 37, 3, 0, 0, 5, False, id="window"),
    # queries 0-2 have only -1 picks, queries under 27 fewer than topk; tiles mix window and picks
    pytest.param(2, 70, 4, sparse_attention.CSA_RATIO, 6, 9, False, id="csa"),
    # the same rows shuffled, one pick doubled a row: -1s between picks, picks past min(topk, (s + 1) // 4)
    pytest.param(1, 70, 4, sparse_attention.CSA_RATIO, 6, 9, True, id="csa-scattered"),
    # queries 127-130 see the one compressed row, the rest none; seq not a multiple of 128
    pytest.param(2, 131, 2, sparse_attention.HCA_RATIO, 0, 4, False, id="hca"),
]


@pytest.mark.parametrize(("batch", "seq", "heads", "ratio", "topk", "window", "scattered"), PROBLEMS)
def test_forward_and_gradients_match_eager(batch, seq, heads, ratio, topk, window, scattered):
    p = _problem(batch, seq, heads, ratio, topk, window, seed=seq, scattered=scattered)
    names = ["q", "kv", "sink"] + (["kv_compressed"] if ratio else [])
    leaves = {n: p[n].clone().requires_grad_() for n in names}
    o = attend(leaves["q"], leaves["kv"], leaves["sink"], ratio, leaves.get("kv_compressed"), p.get("indices"),
               window)
    o.backward(p["do"])
    refs = {n: p[n].float().requires_grad_() for n in names}
    o_ref = sparse_attention_reference(refs["q"], refs["kv"], refs["sink"], ratio, refs.get("kv_compressed"),
                                       p.get("indices"), window)
    o_ref.backward(p["do"].float())

    assert o.dtype == torch.bfloat16 and o.shape == o_ref.shape
    _close(o, o_ref)
    for n in names:
        assert leaves[n].grad.dtype == p[n].dtype, n
        # dS = P (dP - Delta) cancels where P sits on one entry, and Delta = rowsum(dO * O) uses
        # the bf16 O (as FlashAttention does; truncated, so biased, by the interpreter): dq rows
        # are off by up to ~6% there.
        _close(leaves[n].grad, refs[n].grad, tol=6e-2 if n == "q" else 3e-2)
        assert refs[n].grad.abs().sum() > 0, n  # every input gets a gradient to compare
    if ratio == sparse_attention.CSA_RATIO:
        assert (p["indices"][:, :3] == -1).all() and (p["indices"] == -1).any(dim=-1).all(dim=0).sum() > 3
    if scattered:
        assert all(_layouts_present(p["indices"]).values()), _layouts_present(p["indices"])


def test_window_cuts_entries_off():
    """A window of 1 attends the query's own kv row only: o is that row times its softmax weight."""
    p = _problem(2, 9, 3, 0, 0, 1, seed=0)
    o = attend(p["q"], p["kv"], p["sink"], 0, window=1).float()
    logit = (p["q"].float() * p["kv"].float()[:, :, None]).sum(-1) * sparse_attention.SOFTMAX_SCALE
    weight = torch.sigmoid(logit - p["sink"])  # exp(l) / (exp(l) + exp(sink))
    _close(o, weight[..., None] * p["kv"].float()[:, :, None])


def _assert_forward_matches(q: torch.Tensor, p: dict, ratio: int, window: int, config: dict) -> None:
    """The forward of ``config`` gives the reference's o and LSE on problem ``p`` with queries ``q``."""
    o, lse = sparse_attention._forward(q, p["kv"], p.get("kv_compressed"), p.get("indices"), p["sink"], ratio, window,
                                       config)
    o_ref, lse_ref = sparse_attention._reference(q, p["kv"], p["sink"], ratio, p.get("kv_compressed"),
                                                 p.get("indices"), window)
    _close(o, o_ref)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("slack", [0, 1, 8])
@pytest.mark.parametrize(("ratio", "topk", "window"), [(0, 0, 40), (sparse_attention.CSA_RATIO, 20, 24)],
                         ids=["window", "csa"])
def test_lazy_rescaling_matches_eager(slack, ratio, topk, window):
    """Logits spread over tens of log2 units (q scaled up 12 times) across three 16-entry tiles, so
    that the running max both outgrows the slack (a rescale) and stays within it (none)."""
    p = _problem(2, 120, 3, ratio, topk, window, seed=11)
    q = (p["q"].float() * 12).to(torch.bfloat16)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "RESCALE_SLACK": slack}
    _assert_forward_matches(q, p, ratio, window, config)


@pytest.mark.parametrize(("seq", "ratio", "topk", "window"),
                         [(120, 0, 0, 40), (120, sparse_attention.CSA_RATIO, 20, 24),
                          (300, sparse_attention.HCA_RATIO, 0, 40)], ids=["window", "csa", "hca"])
def test_tail_tile_matches_eager(seq, ratio, topk, window):
    """32-entry tiles with a 16-entry tail: queries of at most 16 entries take the tail alone, of
    17-32 one full tile and no tail, of 33-48 (up to 44 for CSA, 42 for HCA) a full tile then the
    tail, which holds compressed entries there."""
    p = _problem(2, seq, 3, ratio, topk, window, seed=13)
    config = {"BLOCK_H": 16, "TILE_K": 32, "TAIL_K": 16, "num_warps": 4, "num_stages": 1}
    _assert_forward_matches(p["q"], p, ratio, window, config)


# (num_stages, PTX_BARRIER): compiled, a two-stage loop pipelines its gathers around the unchained
# hand-off's inline PTX barrier (its reads volatile, 1, or plain, 2); the interpreter runs one
# program at a time, has no stages and waits by tl.debug_barrier whatever the knob.
UNCHAINED_FORMS = ((1, 0), (2, 0), (2, 1), (2, 2)) if DEVICE.type == "cuda" else ((1, 0),)


@pytest.mark.parametrize(("seq", "ratio", "topk", "window", "tail"),
                         [(120, 0, 0, 40, 0), (120, sparse_attention.CSA_RATIO, 20, 24, 16),
                          (300, sparse_attention.HCA_RATIO, 0, 40, 0)], ids=["window", "csa-tail", "hca"])
def test_unchained_tiles_match_eager(seq, ratio, topk, window, tail):
    """P and the rescale factor through the scratch in o's rows: up to four 16-entry tiles (both
    scratch halves, each reused), two head blocks and B = 2 (HCA, whose sequence is longer: one of
    each), logits spread over tens of log2 units so that the rescale factor matters, and on CSA
    32-entry tiles with a 16-entry tail, which reads its P with a shorter row stride."""
    hca = ratio == sparse_attention.HCA_RATIO
    p = _problem(1 if hca else 2, seq, 16 if hca else 32, ratio, topk, window, seed=17)
    q = (p["q"].float() * 12).to(torch.bfloat16)
    for stages, ptx in UNCHAINED_FORMS:
        config = {"BLOCK_H": 16, "TILE_K": 32 if tail else 16, "TAIL_K": tail, "num_warps": 4, "num_stages": stages,
                  "UNCHAINED": 1, "PTX_BARRIER": ptx}
        _assert_forward_matches(q, p, ratio, window, config)


@pytest.mark.parametrize(("ratio", "topk", "window"), [(0, 0, 24), (sparse_attention.CSA_RATIO, 20, 24)],
                         ids=["window", "csa"])
def test_unchained_backward_matches_eager(ratio, topk, window):
    """Scaled dS and P through the scratch in dq's rows, over both scratch halves (up to three
    16-entry tiles), as is and transposed, with atomics and with the split reduction."""
    kernel = registry.get("sparse_attn_bwd")
    inputs = kernel.make_inputs({"batch": 2, "seq": 70, "heads": 32, "ratio": ratio, "topk": topk,
                                 "window": window}, DEVICE, seed=19)
    reductions = ((0, "atomic"), (1, "split"))
    for (transposed, mode), (stages, ptx) in itertools.product(reductions, UNCHAINED_FORMS):
        config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": stages, "DKV_MODE": mode, "R_CHUNK": 0,
                  "DE_TRANSPOSED": transposed, "UNCHAINED": 1, "PTX_BARRIER": ptx}
        for out, ref in zip(kernel.run(inputs, config), kernel.reference(inputs)):
            _close(out, ref)


GLUON_CONFIG = {"BLOCK_H": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 2, "GLUON": 1}


@pytest.mark.skipif(DEVICE.type != "cuda" or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon forward is sm_90's (Gluon has no interpreter mode)")
@pytest.mark.parametrize(("batch", "seq", "heads", "ratio", "topk", "window"),
                         [(2, 300, 128, 0, 0, 128), (2, 300, 64, sparse_attention.CSA_RATIO, 40, 128),
                          (1, 700, 64, sparse_attention.HCA_RATIO, 0, 128), (1, 1030, 64, sparse_attention.CSA_RATIO,
                                                                             512, 128)],
                         ids=["window", "csa", "hca", "csa-512"])
def test_gluon_forward_matches_eager(batch, seq, heads, ratio, topk, window):
    """The sm_90 Gluon form in each mode, its programs in order and last query first: both ring
    slots reused over several tiles (the first queries have one tile, all in the overlapped mode's
    prologue), partial last tiles, CSA tiles that mix window and picks (queries with only -1
    picks, queries with fewer than topk), two head blocks and B = 2, logits spread over tens of
    log2 units. The persistent mode 5 takes several items a program here (600-1,200 items, one
    program an SM), so each item's Q and first tile come from the previous item's prefetch. CSA
    runs the indexer's rows and ``_scattered`` ones (padding between picks, late picks, doubles)."""
    p = _problem(batch, seq, heads, ratio, topk, window, seed=29)
    q = (p["q"].float() * 12).to(torch.bfloat16)
    csa = ratio == sparse_attention.CSA_RATIO
    layouts = (p["indices"], _scattered(p["indices"], seed=29)) if csa else (None,)
    for indices, mode, late_first in itertools.product(layouts, sparse_attention_sm90.MODES, (0, 1)):
        _assert_forward_matches(q, {**p, "indices": indices}, ratio, window,
                                {**GLUON_CONFIG, "GLUON": mode, "LATE_FIRST": late_first})


def test_gluon_forward_says_where_it_cannot_run():
    p = _problem(1, 40, 64, 0, 0, 16, seed=1)
    if sparse_attention.current_arch() != "sm_90":
        with pytest.raises(ValueError, match="GLUON is the sm_90 form"):
            sparse_attention._forward(p["q"], p["kv"], None, None, p["sink"], 0, 16, GLUON_CONFIG)
    assert sparse_attention_sm90.fits(GLUON_CONFIG, 64) is None
    assert sparse_attention_sm90.fits({**GLUON_CONFIG, "TILE_K": 32, "UNCHAINED": 1}, 96) == (
        "TILE_K 32 (it needs 64); UNCHAINED 1 (it needs 0); heads 96 (it needs a multiple of 64)")
    assert sparse_attention_sm90.fits({**GLUON_CONFIG, "GLUON": 7}, 64) == "GLUON 7 (it is one of 1, 2, 3, 4, 5, 6)"


@pytest.mark.parametrize(("seq", "ratio", "topk", "window"), [(37, 0, 0, 5), (70, sparse_attention.CSA_RATIO, 6, 9)],
                         ids=["window", "csa"])
def test_late_first_programs_match_eager(seq, ratio, topk, window):
    """LATE_FIRST: program i computes query seq - 1 - i, and each query still lands in its own rows."""
    p = _problem(2, seq, 3, ratio, topk, window, seed=31)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "LATE_FIRST": 1}
    _assert_forward_matches(p["q"], p, ratio, window, config)


def test_csa_slots_are_read_one_by_one():
    """V4's public semantics: each slot is one entry and each -1 is skipped on its own. A row's
    picks moved behind its padding (past slot ``min(topk, (s + 1) // 4)``) or shuffled attend what
    the indexer's layout attends, in the kernel as in the reference; a pick blanked in the middle
    of a row drops that pick alone (the ones after it still count)."""
    p = _problem(1, 96, 16, sparse_attention.CSA_RATIO, 20, 24, seed=23)
    indices = p["indices"]
    behind = indices.gather(-1, (indices >= 0).int().argsort(dim=-1, stable=True))  # -1s first, then the picks
    shuffled = _shuffled(indices, seed=1)
    cut = indices.clone()
    cut[0, 60:, 3] = -1  # queries 60+ have 15+ picks
    compacted = indices.clone()  # the same picks of queries 60+ without slot 3's
    compacted[0, 60:] = torch.cat([indices[0, 60:, :3], indices[0, 60:, 4:], torch.full_like(indices[0, 60:, :1], -1)], -1)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "UNCHAINED": 0}

    def reference(rows: torch.Tensor) -> torch.Tensor:
        return sparse_attention._reference(p["q"], p["kv"], p["sink"], 4, p["kv_compressed"], rows, 24)[0]

    for rows in (behind, cut):
        _assert_forward_matches(p["q"], {**p, "indices": rows}, 4, 24, config)
    o = reference(indices)
    assert _layouts_present(behind)["late picks"] and not _layouts_present(indices)["late picks"]
    torch.testing.assert_close(reference(behind), o)
    torch.testing.assert_close(reference(shuffled), o)
    torch.testing.assert_close(reference(cut), reference(compacted))
    assert (reference(cut)[0, 60:] - o[0, 60:]).abs().amax() > 1e-2  # the blanked pick counted when kept


def test_reference_reads_rows_as_the_v4_eager_op():
    """The kernels' reference and ``v4.attention_ops`` (dense and masked, the model's eager path)
    read ``_scattered`` rows alike: padding between picks, late picks, a pick listed twice."""
    p = _problem(2, 70, 4, sparse_attention.CSA_RATIO, 6, 9, seed=5, scattered=True)
    assert all(_layouts_present(p["indices"]).values())
    args = (p["q"].float(), p["kv"].float(), p["sink"], 4, p["kv_compressed"].float(), p["indices"], 9)
    torch.testing.assert_close(sparse_attention_reference(*args), attention_ops.sparse_attention(*args))


def test_rows_compacted_for_the_gluon_forward_keep_their_picks_in_order():
    """The Gluon forward reads rows whose picks come first: ``_compact_picks`` moves each row's
    picks (ids in ``[0, S // 4)``) to its front in their order, padding and stray ids to -1 after."""
    indices = _scattered(_problem(2, 70, 1, sparse_attention.CSA_RATIO, 6, 9, seed=7)["indices"], seed=7)
    indices[0, 50, 1] = 17  # no such compressed row (17 of them): dropped like -1
    compacted = sparse_attention._compact_picks(indices, 70 // sparse_attention.CSA_RATIO)
    for row, out in zip(indices.view(-1, 6).tolist(), compacted.view(-1, 6).tolist()):
        picks = [t for t in row if 0 <= t < 17]
        assert out == picks + [-1] * (6 - len(picks))


def test_ptx_barrier_takes_its_modes_only():
    p = _problem(1, 40, 16, 0, 0, 16, seed=1)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "UNCHAINED": 1, "PTX_BARRIER": 3}
    with pytest.raises(ValueError, match="PTX_BARRIER must be 0, 1 or 2, not 3"):
        sparse_attention._forward(p["q"], p["kv"], None, None, p["sink"], 0, 16, config)


def test_unchained_needs_whole_head_blocks():
    p = _problem(1, 40, 20, 0, 0, 16, seed=1)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "UNCHAINED": 1}
    with pytest.raises(ValueError, match="UNCHAINED needs BLOCK_H"):
        sparse_attention._forward(p["q"], p["kv"], None, None, p["sink"], 0, 16, config)
    p = _problem(1, 40, 16, 0, 0, 16, seed=1)
    o, lse = sparse_attention._forward(p["q"], p["kv"], None, None, p["sink"], 0, 16, config)
    config = {**config, "DKV_MODE": "split", "R_CHUNK": 8, "DE_TRANSPOSED": 0}
    with pytest.raises(ValueError, match="UNCHAINED needs one pass"):
        sparse_attention._backward(p["q"], p["kv"], None, None, p["sink"], o, lse, torch.ones_like(o), 0, 16, config)


# (The small presets' defaults, 16 or 32 heads and entries a tile, run in the parity tests above.)
FWD_CONFIGS = [
    {"BLOCK_H": 32, "TILE_K": 32, "TAIL_K": 16, "num_warps": 8, "num_stages": 2, "UNCHAINED": 0,
     "PTX_BARRIER": 0, "GLUON": 0},  # CSA preset only
]
# The split mode as is runs in test_split_mode_in_passes_matches; each mode runs once transposed here.
BWD_CONFIGS = [
    {"BLOCK_H": 32, "TILE_K": 32, "num_warps": 8, "num_stages": 2, "DKV_MODE": "atomic", "R_CHUNK": 0,
     "DE_TRANSPOSED": 0, "UNCHAINED": 0, "PTX_BARRIER": 0},
    {"BLOCK_H": 16, "TILE_K": 32, "num_warps": 4, "num_stages": 1, "DKV_MODE": "split", "R_CHUNK": 0,
     "DE_TRANSPOSED": 1, "UNCHAINED": 0, "PTX_BARRIER": 0},
    {"BLOCK_H": 16, "TILE_K": 32, "num_warps": 4, "num_stages": 1, "DKV_MODE": "atomic", "R_CHUNK": 0,
     "DE_TRANSPOSED": 1, "UNCHAINED": 0, "PTX_BARRIER": 0},
]


@pytest.mark.parametrize(("name", "config"), [("sparse_attn_fwd", c) for c in FWD_CONFIGS]
                         + [("sparse_attn_bwd", c) for c in BWD_CONFIGS],
                         ids=["fwd-32", "atomic-32", "split-32-transposed", "atomic-32-transposed"])
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


def test_split_mode_in_passes_matches():
    """R_CHUNK smaller than (and not a multiple of) the tile: passes cut tiles; dq adds up over them.
    The CSA rows are ``_scattered``: padding between picks lands in every pass, and a pick listed
    twice sums two slots into one row."""
    kernel = registry.get("sparse_attn_bwd")
    shape = {"batch": 2, "seq": 30, "heads": 2, "ratio": sparse_attention.CSA_RATIO, "topk": 5, "window": 6}
    inputs = kernel.make_inputs(shape, DEVICE, seed=4)  # 11 entry positions: passes at 0, 4, 8
    indices = _scattered(inputs["indices"], seed=4)
    assert all(_layouts_present(indices).values())
    inputs = {**inputs, "indices": indices}
    inputs["o"], inputs["lse"] = sparse_attention._reference_of(inputs)
    inputs["o"] = inputs["o"].to(torch.bfloat16)
    config = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "DKV_MODE": "split", "R_CHUNK": 4,
              "DE_TRANSPOSED": 0}
    for out, ref in zip(kernel.run(inputs, config), kernel.reference(inputs)):
        _close(out, ref)


@pytest.mark.parametrize("name", KERNELS)
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    for shape in kernel.presets["small"]:
        assert_seeded_random_inputs(kernel, shape, integers_nonzero=False)


def test_csa_picks_are_distinct_causal_and_first_like_the_indexer():
    shape = registry.get("sparse_attn_fwd").presets["small"][1]
    indices = registry.get("sparse_attn_fwd").make_inputs(shape, DEVICE, 7)["indices"].cpu()
    causal = (torch.arange(shape["seq"]) + 1) // sparse_attention.CSA_RATIO
    for b, s in itertools.product(range(shape["batch"]), range(shape["seq"])):
        n = min(shape["topk"], int(causal[s]))
        picks = indices[b, s, :n]
        assert (picks >= 0).all() and (indices[b, s, n:] == -1).all() and len(set(picks.tolist())) == n
        assert (picks < causal[s]).all()
    assert not (indices.sort(-1).values == indices).all()  # the picks are in random order


@pytest.mark.parametrize("shape", registry.get("sparse_attn_fwd").presets["small"], ids=["window", "csa", "hca"])
def test_flops_count_the_entries_attended(shape):
    inputs = registry.get("sparse_attn_fwd").make_inputs(shape, DEVICE, 0)
    n_comp = shape["seq"] // shape["ratio"] if shape["ratio"] else 0
    entries = 0
    for b, s in itertools.product(range(shape["batch"]), range(shape["seq"])):
        entries += sum(1 for j in range(s + 1) if s - j < shape["window"])
        if shape["ratio"] == sparse_attention.HCA_RATIO:
            entries += sum(1 for t in range(n_comp) if (t + 1) * sparse_attention.HCA_RATIO - 1 <= s)
        elif shape["ratio"] == sparse_attention.CSA_RATIO:
            entries += int((inputs["indices"][b, s] >= 0).sum())
    fwd, bwd = registry.get("sparse_attn_fwd"), registry.get("sparse_attn_bwd")
    assert fwd.flops(shape) == 2 * entries * shape["heads"] * (512 + 512)
    assert bwd.flops(shape) == 5 * fwd.flops(shape) // 2


@pytest.mark.parametrize("name", KERNELS)
def test_defaults_are_valid_configs_of_the_space_on_sm_90(name):
    assert_defaults_fit_space(name, grid_points=True)


def test_space_prunes_what_sm_90_cannot_hold():
    shape = registry.get("sparse_attn_fwd").presets["v4-flash"][2]
    fwd, bwd = load_space("sparse_attn_fwd"), load_space("sparse_attn_bwd")
    fits = {"BLOCK_H": 64, "TILE_K": 32, "TAIL_K": 0, "num_warps": 8, "num_stages": 2, "RESCALE_SLACK": 0,
            "UNCHAINED": 0, "PTX_BARRIER": 0, "GLUON": 0}
    assert fwd.violation(fits, shape, "sm_90") is None
    gluon = {**fits, "TILE_K": 64, "GLUON": 1}
    assert fwd.violation(gluon, shape, "sm_90") is None
    assert "wgmma" in fwd.violation(gluon, shape, "sm_100")  # warpgroup MMA is sm_90's
    assert "TILE_K == 64" in fwd.violation({**gluon, "TILE_K": 32}, shape, "sm_90")
    assert "UNCHAINED == 0" in fwd.violation({**gluon, "UNCHAINED": 1}, shape, "sm_90")
    assert fwd.violation({**fits, "UNCHAINED": 1}, shape, "sm_90") is None
    assert "UNCHAINED" in fwd.violation({**fits, "UNCHAINED": 1, "RESCALE_SLACK": 8}, shape, "sm_90")
    assert "UNCHAINED" in fwd.violation({**fits, "UNCHAINED": 1, "BLOCK_H": 16}, {**shape, "heads": 20}, "sm_90")
    assert fwd.violation({**fits, "UNCHAINED": 1, "PTX_BARRIER": 1}, shape, "sm_90") is None
    assert "PTX_BARRIER" in fwd.violation({**fits, "PTX_BARRIER": 1}, shape, "sm_90")
    assert "max_regs_per_thread" in fwd.violation({**fits, "num_warps": 4}, shape, "sm_90")
    assert "TAIL_K < TILE_K" in fwd.violation({**fits, "TAIL_K": 32}, shape, "sm_90")
    split = {"BLOCK_H": 16, "TILE_K": 16, "num_warps": 4, "num_stages": 1, "DKV_MODE": "split", "DE_TRANSPOSED": 0,
             "UNCHAINED": 0, "PTX_BARRIER": 0}
    assert bwd.violation({**split, "R_CHUNK": 256}, shape, "sm_90") is None
    assert bwd.violation({**split, "DKV_MODE": "atomic", "R_CHUNK": 256}, shape, "sm_90")  # atomics: one pass
    assert bwd.violation({**split, "R_CHUNK": 512}, shape, "sm_90") is None  # 640 positions
    # 64-entry tiles beside 32 heads: 256 KiB of staged operands and 192 fp32 values a thread
    assert bwd.violation({**split, "TILE_K": 64, "BLOCK_H": 32, "num_warps": 8, "R_CHUNK": 0}, shape, "sm_90")
    # 64 heads: as is 288 KiB (and past half the registers), transposed 177 KiB at two stages (Q and
    # dO staged once); at one stage the transposed block hit an illegal address on the H200
    wide = {**split, "BLOCK_H": 64, "num_warps": 8, "R_CHUNK": 0}
    assert bwd.violation({**wide, "DE_TRANSPOSED": 0, "num_stages": 2}, shape, "sm_90")
    assert "num_stages == 1" in bwd.violation({**wide, "DE_TRANSPOSED": 1}, shape, "sm_90")
    assert bwd.violation({**wide, "DE_TRANSPOSED": 1, "num_stages": 2}, shape, "sm_90") is None
    # 16 heads beside 64 entries: 160 fp32 values a thread, which spill 5 KB as is (96 B transposed)
    long_tiles = {**split, "TILE_K": 64, "num_warps": 8, "num_stages": 2, "R_CHUNK": 0}
    assert "max_regs_per_thread" in bwd.violation(long_tiles, shape, "sm_90")
    assert bwd.violation({**long_tiles, "DE_TRANSPOSED": 1}, shape, "sm_90") is None


def test_launches_resolve_registered_shapes(monkeypatch):
    asked = spy_on_resolve(monkeypatch, sparse_attention)
    p = _problem(1, 5, 2, sparse_attention.CSA_RATIO, 3, 4, seed=1)
    q = p["q"].clone().requires_grad_()
    attend(q, p["kv"], p["sink"], 4, p["kv_compressed"], p["indices"], window=4).float().sum().backward()
    key = "batch=1,seq=5,heads=2,ratio=4,topk=3,window=4"
    assert asked == [("sparse_attn_fwd", key), ("sparse_attn_bwd", key)]


def test_bytes_moved_count_each_tensor_once():
    shape = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 4, "topk": 512, "window": 128}
    per_head, latent, comp = 2 * 4096 * 64 * 512, 2 * 4096 * 512, 2 * 1024 * 512
    stats, indices = 4 * 4096 * 64, 4 * 4096 * 512
    assert registry.get("sparse_attn_fwd").bytes_moved(shape) == 2 * per_head + latent + comp + indices + 4 * 64 + stats
    assert registry.get("sparse_attn_bwd").bytes_moved(shape) == (
        4 * per_head + 2 * latent + 2 * comp + indices + 2 * 4 * 64 + stats)


def test_bad_arguments_are_rejected():
    p = _problem(1, 8, 2, sparse_attention.CSA_RATIO, 2, 4, seed=0)
    q, kv, sink, kvc, idx = p["q"], p["kv"], p["sink"], p["kv_compressed"], p["indices"]
    bad_calls = [
        lambda: attend(q[..., :256], kv, sink, 0),  # latent not 512
        lambda: attend(q, kv.float(), sink, 0),
        lambda: attend(q, kv, sink.bfloat16(), 0),
        lambda: attend(q, kv, sink[:1], 0),
        lambda: attend(q, kv, sink, 8, kvc),  # no such layer type
        lambda: attend(q, kv, sink, 4, kvc),  # CSA without indices
        lambda: attend(q, kv, sink, 4, kvc, idx.long()),
        lambda: attend(q, kv, sink, 128, kvc),  # kv_compressed of the wrong length for HCA
        lambda: attend(q, kv, sink, 0, kvc),
        lambda: attend(q, kv, sink, 4, kvc, idx, window=0),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
