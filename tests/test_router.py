"""MoE router tail: parity with the eager reference (top-k and hash routing), ties, tuned configs."""

from __future__ import annotations

import pytest
import torch

from kernels import registry, router
from kernels.arch import kernel_device
from kernels.router import route, route_reference
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, spy_on_resolve)

DEVICE = kernel_device()
# fp32 throughout; the kernel's exp/log/sqrt may differ from torch's in the last bits.
TOL = {"atol": 1e-5, "rtol": 1e-4}



def _check_route(logits, bias=None, topk=6, token_ids=None, tid2eid=None, route_scale=1.5):
    """Forward and weight gradients of ``route`` against the eager reference; returns the indices."""
    grad_w = torch.randn(logits.shape[0], topk, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    logits_k = logits.clone().requires_grad_()
    indices, weights = route(logits_k, bias, topk, route_scale, token_ids, tid2eid)
    weights.backward(grad_w)

    logits_r = logits.clone().requires_grad_()
    indices_r, weights_r = route_reference(logits_r, bias, topk, route_scale, token_ids, tid2eid)
    weights_r.backward(grad_w)

    assert indices.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(indices, indices_r)
    torch.testing.assert_close(weights, weights_r, **TOL)
    torch.testing.assert_close(weights.sum(-1), torch.full_like(weights[:, 0], route_scale), **TOL)
    torch.testing.assert_close(logits_k.grad, logits_r.grad, **TOL)
    return indices


@pytest.mark.parametrize("topk", [1, 6])
@pytest.mark.parametrize("experts", [7, 256, 384])
def test_topk_routing_matches_eager(experts, topk):
    gen = torch.Generator().manual_seed(experts + topk)
    logits = (2 * torch.randn(37, experts, generator=gen)).to(DEVICE)  # 37: not a multiple of BLOCK_N
    bias = torch.randn(experts, generator=gen).to(DEVICE)
    indices = _check_route(logits, bias, topk)
    # The bias steers the choice: without it some tokens pick other experts.
    assert not torch.equal(indices, _check_route(logits, None, topk))


def test_equal_scores_go_to_the_lowest_index():
    # Every row holds only three distinct values, so most picks are among equal scores.
    gen = torch.Generator().manual_seed(3)
    levels = torch.tensor([-1.0, 0.5, 2.0])
    logits = levels[torch.randint(3, (19, 12), generator=gen)].to(DEVICE)
    logits[0] = torch.tensor([0.5, 2.0, 2.0, -1.0, 2.0, 0.5, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    indices = _check_route(logits, topk=4)
    assert indices[0].tolist() == [1, 2, 4, 0]
    # Each top-k round's pick as a max then a min, or as one argmax. (The interpreter's argmax takes
    # the first of equal values whatever its tie flag; the GPU run of this test checks the flag.)
    for argmax in (0, 1):
        config = {"BLOCK_N": 4, "num_warps": 1, "num_stages": 1, "ARGMAX": argmax}
        picked, _ = router._forward(logits, None, 4, 1.5, None, None, config)
        assert torch.equal(picked, indices), argmax


def test_hash_routing_reads_the_table_and_ignores_bias():
    gen = torch.Generator().manual_seed(4)
    vocab, experts, topk = 50, 16, 6
    tid2eid = torch.randint(experts, (vocab, topk), generator=gen, dtype=torch.int32)
    tid2eid[7] = torch.tensor([3, 3, 5, 3, 0, 5], dtype=torch.int32)  # repeated experts: gradients add up
    token_ids = torch.randint(vocab, (21,), generator=gen)
    token_ids[0] = 7
    logits = (2 * torch.randn(21, experts, generator=gen)).to(DEVICE)
    tid2eid, token_ids = tid2eid.to(DEVICE), token_ids.to(DEVICE)
    indices = _check_route(logits, torch.randn(experts).to(DEVICE), topk, token_ids, tid2eid)
    assert torch.equal(indices, tid2eid[token_ids])


def test_tiny_scores_have_finite_gradients():
    # softplus(-30) ~ 1e-13: a naive log(1 + exp(x)) gives s = 0 and an infinite gradient.
    logits = torch.tensor([[-30.0, -29.0, -31.0, 1.0]]).to(DEVICE)
    tid2eid = torch.tensor([[0, 1]], dtype=torch.int32).to(DEVICE)
    _check_route(logits, topk=2, token_ids=torch.zeros(1, dtype=torch.long).to(DEVICE), tid2eid=tid2eid)


KERNELS = ("router_fwd", "router_hash_fwd", "router_bwd")
CONFIGS = [
    {"BLOCK_N": 1, "num_warps": 1, "num_stages": 1, "ARGMAX": 1},
    {"BLOCK_N": 4, "num_warps": 2, "num_stages": 1},
    {"BLOCK_N": 64, "num_warps": 8, "num_stages": 1},  # taller than most small shapes
]
# The hash routing's tile holds k picks a token, not a row of experts: every thread needs one.
HASH_CONFIGS = [
    {"BLOCK_N": 4, "num_warps": 1, "num_stages": 1},  # 37 tokens: a ragged last tile
    {"BLOCK_N": 16, "num_warps": 2, "num_stages": 1},
    {"BLOCK_N": 64, "num_warps": 8, "num_stages": 1},  # taller than most small shapes
]


@pytest.mark.parametrize(("name", "config"), [(n, c) for n in KERNELS
                                              for c in (HASH_CONFIGS if n == "router_hash_fwd" else CONFIGS)])
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


@pytest.mark.parametrize("experts", [7, 256, 384])
def test_sweep_inputs_keep_the_choice_away_from_ties(experts):
    inputs = registry.get("router_fwd").make_inputs({"tokens": 64, "experts": experts, "topk": 6}, DEVICE, 1)
    score = torch.nn.functional.softplus(inputs["logits"]).sqrt() + inputs["bias"]
    gaps = score.sort(-1).values.diff(dim=-1)
    assert gaps.min() >= 1e-3
    assert len(set(inputs["bias"].tolist())) > 1


@pytest.mark.parametrize("name", KERNELS)
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    for shape in kernel.presets["small"]:
        first, again, other = (kernel.make_inputs(shape, DEVICE, seed) for seed in (5, 5, 6))
        tensors = [key for key, value in first.items() if isinstance(value, torch.Tensor)]
        assert tensors
        for key in tensors:
            assert torch.equal(first[key], again[key])
            assert not torch.equal(first[key], other[key]) or first[key].numel() == 1
            if first[key].is_floating_point():
                assert torch.count_nonzero(first[key]) == first[key].numel()
        assert kernel.compile(first, kernel.default_config(shape)) is None


@pytest.mark.parametrize("name", KERNELS)
def test_defaults_fit_the_space_on_sm_90(name):
    assert_defaults_fit_space(name, ("v4-flash", "v4-pro"))


def test_launches_resolve_registered_shapes(monkeypatch):
    looked_up = spy_on_resolve(monkeypatch, router)
    logits = torch.randn(5, 9).to(DEVICE).requires_grad_()
    route(logits, topk=2)[1].sum().backward()
    tid2eid = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).to(DEVICE)
    route(logits, topk=2, token_ids=torch.tensor([0, 1, 1, 0, 1]).to(DEVICE), tid2eid=tid2eid)
    key = "tokens=5,experts=9,topk=2"
    assert looked_up == [("router_fwd", key), ("router_bwd", key), ("router_hash_fwd", key)]


def test_bad_arguments_are_rejected():
    logits = torch.randn(4, 8).to(DEVICE)
    with pytest.raises(ValueError):
        route(logits, topk=9)
    with pytest.raises(ValueError):
        route(logits, torch.zeros(7).to(DEVICE))
    with pytest.raises(ValueError):
        route(logits, topk=2, tid2eid=torch.zeros(3, 2, dtype=torch.int32).to(DEVICE))
    with pytest.raises(ValueError):
        route(logits, topk=2, token_ids=torch.zeros(4, dtype=torch.long).to(DEVICE),
              tid2eid=torch.zeros(3, 3, dtype=torch.int32).to(DEVICE))
