"""V4 compressor pooling: forward and gradients against the eager math (CSA and HCA windows,
ragged tails, empty outputs), every gradient element written, tuned configs, the lookup."""

from __future__ import annotations

import pytest
import torch

from kernels import compressor, registry, zero_at_rest
from kernels.arch import current_arch, kernel_device
from kernels.compressor import compressor_pool, compressor_pool_reference
from search_spaces import load_space
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
# bf16 outputs: one rounding of a fp32 result (truncation on the interpreter: below 2**-7 relative);
# fp32 outputs: evaluation and summation order only.
TOLERANCES = {torch.bfloat16: {"atol": 1e-3, "rtol": 1e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-5}}


def _inputs(batch, seq, ratio, dim, dtype, seed, strided=False):
    """kv, score, ape and an output gradient; ``strided`` takes kv and score as the two halves of
    one fused projection (non-contiguous), as a model would compute them."""
    gen = torch.Generator().manual_seed(seed)
    width = compressor.window_factor(ratio) * dim
    if strided:
        kv, score = torch.randn(batch, seq, 2 * width, generator=gen).to(DEVICE, dtype).chunk(2, dim=-1)
    else:
        kv, score = (torch.randn(batch, seq, width, generator=gen).to(DEVICE, dtype) for _ in range(2))
    ape = (0.5 * torch.randn(ratio, width, generator=gen)).to(DEVICE)
    grad = torch.randn(batch, seq // ratio, dim, generator=gen).to(DEVICE, dtype)
    return kv, score, ape, grad


@pytest.mark.parametrize(
    ("batch", "seq", "ratio", "dim", "dtype", "strided"),
    [
        (2, 38, 4, 40, torch.bfloat16, False),   # CSA, a 2-token tail, d not a power of two
        (1, 16, 4, 512, torch.bfloat16, True),   # CSA latent d, no tail, halves of a fused projection
        (2, 21, 4, 128, torch.float32, False),   # the indexer's compressor, fp32: a tight check
        (2, 300, 128, 24, torch.bfloat16, False),  # HCA, a 44-token tail
        (1, 256, 128, 16, torch.float32, True),  # HCA, fp32, no tail
        (3, 3, 4, 8, torch.bfloat16, False),     # shorter than one group: no entries, zero gradients
    ],
)
def test_forward_and_gradients_match_eager(batch, seq, ratio, dim, dtype, strided):
    kv, score, ape, grad = _inputs(batch, seq, ratio, dim, dtype, seed=seq + dim, strided=strided)
    leaves = [t.detach().clone().requires_grad_() for t in (kv, score, ape)]
    out = compressor_pool(*leaves)
    out.backward(grad)

    ref_leaves = [t.detach().float().requires_grad_() for t in (kv, score, ape)]
    ref = compressor_pool_reference(*ref_leaves)
    ref.backward(grad.float())

    assert out.shape == (batch, seq // ratio, dim) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **TOLERANCES[dtype])
    for leaf, ref_leaf in zip(leaves, ref_leaves):
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape
        torch.testing.assert_close(leaf.grad.float(), ref_leaf.grad, **TOLERANCES[leaf.dtype])
    # The overlapping window: group 0's first channel half is pooled by entry 1 only.
    if ratio == compressor.CSA_RATIO and seq >= 2 * ratio:
        changed = kv.clone()
        changed[:, :ratio, :dim] = 0
        again = compressor_pool(changed, score, ape)
        assert torch.equal(again[:, 0], out[:, 0].detach()) and torch.equal(again[:, 2:], out[:, 2:].detach())
        assert not torch.equal(again[:, 1], out[:, 1].detach())


def test_every_gradient_element_is_written(monkeypatch):
    """dkv and dscore come from uninitialised buffers: the tail, and (CSA) the first half of the last
    group, which no entry pools, must be written as zeros by the kernel itself."""
    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real_empty_like(t, **kw).fill_(float("nan")))
    for ratio, seq, saved_stats in ((4, 22, 0), (128, 150, 0), (128, 150, 1)):
        kv, score, ape, grad = _inputs(2, seq, ratio, 16, torch.bfloat16, seed=ratio)
        config = registry.get("compressor_bwd").default_config({"batch": 2, "seq": seq, "ratio": ratio, "dim": 16})
        if saved_stats:  # dape too comes from an uninitialised buffer
            config = STATS_CONFIG
        stats = compressor.pool_stats_reference(kv, score, ape)
        dkv, dscore, dape = compressor._backward(kv, score, ape, grad, config, stats=stats)
        assert torch.isfinite(dape).all()
        closed = seq // ratio * ratio
        for g in (dkv, dscore):
            assert torch.isfinite(g).all()
            assert (g[:, closed:] == 0).all()
            if ratio == compressor.CSA_RATIO:
                assert (g[:, closed - ratio:closed, :16] == 0).all()
                assert (g[:, closed - ratio:closed, 16:] != 0).all()


LAST_CONFIG = {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 3, "DAPE_ATOMIC": 1, "DAPE_LAST": 1, "CHANNELS_FIRST": 0,
               "SAVED_STATS": 0, "BLOCK_P": 1, "num_warps": 1, "num_stages": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_last_program_publishes_dape_and_leaves_the_scratch_zero(dtype):
    """DAPE_LAST: dape in ape's dtype from a scratch no launch zeroes; a second call on the same slot
    (every slot taken in turn) must match the first, so each launch leaves its scratch zero."""
    kv, score, ape, grad = _inputs(2, 38, 4, 40, torch.bfloat16, seed=5)
    ape = ape.to(dtype)
    ref = compressor._backward(kv, score, ape, grad, BWD_CONFIGS[0])[2]
    first = compressor._backward(kv, score, ape, grad, LAST_CONFIG)[2]
    assert first.dtype == dtype
    torch.testing.assert_close(first.float(), ref.float(), **TOLERANCES[dtype])
    for _ in range(zero_at_rest.SLOTS):
        again = compressor._backward(kv, score, ape, grad, LAST_CONFIG)[2]
        torch.testing.assert_close(again, first, **TOLERANCES[dtype])
    for acc, arrivals in zero_at_rest._slots[kv.device]:
        assert not acc.any() and not arrivals.any()


def test_an_interrupted_launch_zeroes_its_scratch_again(monkeypatch):
    """A launch that raises may have left its slot half-written: the slot is zeroed again."""
    kv, score, ape, grad = _inputs(1, 16, 4, 16, torch.float32, seed=6)
    taken = []
    real_take = zero_at_rest.take
    monkeypatch.setattr(zero_at_rest, "take", lambda *a: taken.append(real_take(*a)) or taken[-1])

    def interrupted(*args, **kwargs):
        taken[0][1][:3] = 1.0  # what an interrupted kernel may leave
        taken[0][2][0] = 1
        raise KeyboardInterrupt

    monkeypatch.setattr(compressor, "launch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compressor._backward(kv, score, ape, grad, LAST_CONFIG)
    slot, acc, arrivals = taken[0]
    assert slot >= 0 and not acc.any() and not arrivals.any()


def test_requests_beyond_the_slots_get_their_own_zeroed_scratch():
    device = torch.device(DEVICE)
    zero_at_rest.take(device, 1, 1)  # the slots exist
    slot, acc, arrivals = zero_at_rest.take(device, zero_at_rest.SLOT_FLOATS + 1, 4)
    assert slot == -1 and acc.numel() == zero_at_rest.SLOT_FLOATS + 1 and not acc.any() and not arrivals.any()
    assert all(a.numel() == zero_at_rest.SLOT_FLOATS for a, _ in zero_at_rest._slots[device])


STATS_CONFIG = {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 4, "DAPE_ATOMIC": 0, "DAPE_LAST": 0, "CHANNELS_FIRST": 0,
                "SAVED_STATS": 1, "BLOCK_P": 16, "num_warps": 2, "num_stages": 1}


@pytest.mark.parametrize(("batch", "seq", "dim", "dtype"), [
    (2, 300, 24, torch.bfloat16),  # a 44-token tail, d not a power of two
    (1, 256, 16, torch.float32),   # no tail, fp32: a tight check
    (2, 100, 16, torch.bfloat16),  # shorter than one group: no entries, zero gradients
])
def test_backward_from_the_forwards_saved_statistics_matches_eager(monkeypatch, batch, seq, dim, dtype):
    """With a SAVED_STATS backward resolved, the forward saves fp32 (lse, c) and the backward reads
    them: the gradients match the eager math; and the forward saves nothing without it."""
    resolved = {"compressor_fwd": FWD_CONFIGS[1], "compressor_bwd": STATS_CONFIG}
    monkeypatch.setattr(compressor, "_resolved", lambda kernel, kv, ratio: resolved[kernel])
    kv, score, ape, grad = _inputs(batch, seq, 128, dim, dtype, seed=seq)
    leaves = [t.detach().clone().requires_grad_() for t in (kv, score, ape)]
    out = compressor_pool(*leaves)
    assert len(out.grad_fn.saved_tensors) == 5  # kv, score, ape, lse, c
    out.backward(grad)
    ref_leaves = [t.detach().float().requires_grad_() for t in (kv, score, ape)]
    compressor_pool_reference(*ref_leaves).backward(grad.float())
    for leaf, ref_leaf in zip(leaves, ref_leaves):
        torch.testing.assert_close(leaf.grad.float(), ref_leaf.grad, **TOLERANCES[leaf.dtype])
    resolved["compressor_bwd"] = BWD_CONFIGS[0]
    assert len(compressor_pool(*leaves).grad_fn.saved_tensors) == 3


def test_saved_statistics_match_the_eager_ones_and_are_required():
    kv, score, ape, grad = _inputs(2, 300, 128, 24, torch.float32, seed=1)
    _, (lse, pooled) = compressor._forward(kv, score, ape, FWD_CONFIGS[0], save_stats=True)
    ref_lse, ref_pooled = compressor.pool_stats_reference(kv, score, ape)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, ref_pooled, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="SAVED_STATS"):
        compressor._backward(kv, score, ape, grad, STATS_CONFIG)


FWD_CONFIGS = [
    {"BLOCK_G": 1, "BLOCK_D": 16, "num_warps": 1, "num_stages": 1},  # ragged channel blocks
    {"BLOCK_G": 4, "BLOCK_D": 16, "num_warps": 2, "num_stages": 1},  # entries of both batch elements
    {"BLOCK_G": 8, "BLOCK_D": 64, "num_warps": 8, "num_stages": 1},  # wider than d = 40
]
BWD_CONFIGS = [
    # One program walks every entry (one dape partial), and its atomic twin.
    {"BLOCK_G": 1, "BLOCK_D": 16, "SLABS": 1, "DAPE_ATOMIC": 0, "num_warps": 2, "num_stages": 1},
    {"BLOCK_G": 1, "BLOCK_D": 16, "SLABS": 1, "DAPE_ATOMIC": 1, "num_warps": 2, "num_stages": 1},
    # Ragged slabs of entries, with both dape modes.
    {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 3, "DAPE_ATOMIC": 0, "num_warps": 4, "num_stages": 2},
    {"BLOCK_G": 4, "BLOCK_D": 32, "SLABS": 32, "DAPE_ATOMIC": 1, "num_warps": 4, "num_stages": 1},
    # The last program of each channel block publishes dape: ragged slabs and channel blocks.
    {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 3, "DAPE_ATOMIC": 1, "DAPE_LAST": 1, "num_warps": 1, "num_stages": 2},
    # Channel blocks first, with each dape mode.
    {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 3, "DAPE_ATOMIC": 0, "CHANNELS_FIRST": 1, "num_warps": 1, "num_stages": 1},
    {"BLOCK_G": 4, "BLOCK_D": 16, "SLABS": 5, "DAPE_ATOMIC": 1, "CHANNELS_FIRST": 1, "num_warps": 1, "num_stages": 2},
    {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 3, "DAPE_ATOMIC": 1, "DAPE_LAST": 1, "CHANNELS_FIRST": 1, "num_warps": 1,
     "num_stages": 1},
    # 8 channels a program: 5 channel blocks over d = 40.
    {"BLOCK_G": 4, "BLOCK_D": 8, "SLABS": 4, "DAPE_ATOMIC": 1, "CHANNELS_FIRST": 1, "num_warps": 1, "num_stages": 2},
]
BWD_CONFIGS = [{"DAPE_LAST": 0, "CHANNELS_FIRST": 0, **c, "SAVED_STATS": 0, "BLOCK_P": 1} for c in BWD_CONFIGS] + [
    # From the saved statistics (HCA): 8 positions of 16 channels over entries 2 at a time (the
    # tail's virtual entry and both batch elements), and 32 positions of 32 channels, 4 at a time.
    {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 4, "DAPE_ATOMIC": 0, "DAPE_LAST": 0, "CHANNELS_FIRST": 0, "SAVED_STATS": 1,
     "BLOCK_P": 8, "num_warps": 2, "num_stages": 1},
    {"BLOCK_G": 4, "BLOCK_D": 32, "SLABS": 4, "DAPE_ATOMIC": 0, "DAPE_LAST": 0, "CHANNELS_FIRST": 0, "SAVED_STATS": 1,
     "BLOCK_P": 32, "num_warps": 4, "num_stages": 2},
]


@pytest.mark.parametrize(
    ("name", "config"),
    [("compressor_fwd", c) for c in FWD_CONFIGS] + [("compressor_bwd", c) for c in BWD_CONFIGS],
)
def test_tuned_configs_match_reference(name, config):
    kernel, space = registry.get(name), load_space(name)
    # Shapes the space prunes the config for are skipped: at least one must remain.
    assert any(space.violation(config, shape, current_arch()) is None for shape in kernel.presets["small"])
    assert_config_matches_reference(kernel, config, seed=3)


@pytest.mark.parametrize("name", ["compressor_fwd", "compressor_bwd"])
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    assert_seeded_random_inputs(kernel, kernel.presets["small"][0])


@pytest.mark.parametrize("name", ["compressor_fwd", "compressor_bwd"])
def test_defaults_fit_the_space_on_sm_90(name):
    assert_defaults_fit_space(name, ("v4-flash", "v4-pro", "small"))


def test_a_register_cap_holds_the_backward_to_it_on_sm_90():
    """32 window values a thread compile to about 200 registers without spills on sm_90, and spill
    under a 128-register cap (``python -m bench offline_compile``)."""
    space = load_space("compressor_bwd")
    shape = next(s for s in registry.get("compressor_bwd").presets["v4-flash"] if s["ratio"] == 128)
    config = {"BLOCK_G": 2, "BLOCK_D": 16, "SLABS": 32, "DAPE_ATOMIC": 0, "DAPE_LAST": 0, "CHANNELS_FIRST": 0,
              "SAVED_STATS": 0, "BLOCK_P": 1, "num_warps": 4, "num_stages": 1}
    assert space.violation({**config, "maxnreg": None}, shape, "sm_90") is None
    assert "maxnreg" in space.violation({**config, "maxnreg": 128}, shape, "sm_90")


def test_launches_resolve_registered_shapes(monkeypatch):
    looked_up = spy_on_resolve(monkeypatch, compressor)
    for ratio in (4, 128):
        kv, score, ape, grad = _inputs(1, 130, ratio, 8, torch.bfloat16, seed=0)
        compressor_pool(kv.requires_grad_(), score, ape).backward(grad)
    assert looked_up == [(f"compressor_{d}", f"batch=1,seq=130,ratio={r},dim=8") for r in (4, 128)
                         for d in ("fwd", "bwd")]


def test_bad_arguments_are_rejected():
    kv, score, ape, _ = _inputs(1, 8, 4, 8, torch.bfloat16, seed=0)
    with pytest.raises(ValueError):
        compressor_pool(kv, score[:, :4], ape)  # shapes differ
    with pytest.raises(ValueError):
        compressor_pool(kv, score.float(), ape)  # dtypes differ
    with pytest.raises(ValueError):
        compressor_pool(kv.half(), score.half(), ape)  # fp16 is not supported
    with pytest.raises(ValueError):
        compressor_pool(kv, score, ape[:, :8])  # ape narrower than the projections
    with pytest.raises(ValueError):
        compressor_pool(kv[..., :15], score[..., :15], ape[:, :15])  # CSA needs an even width


def test_bytes_moved_counts_each_tensor_once():
    shape = {"batch": 1, "seq": 4099, "ratio": 4, "dim": 512}  # 1024 groups and a 3-token tail
    pooled, tokens, out, ape = 1024 * 4 * 1024, 4099 * 1024, 1024 * 512, 4 * 1024
    assert registry.get("compressor_fwd").bytes_moved(shape) == 2 * (2 * pooled + out) + 4 * ape
    assert registry.get("compressor_bwd").bytes_moved(shape) == 2 * (2 * pooled + out + 2 * tokens) + 8 * ape
