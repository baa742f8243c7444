"""Partial interleaved RoPE: parity with the eager reference, tuned configs, spaces and lookup."""

from __future__ import annotations


import pytest
import torch

from kernels import registry, rope as rope_module
from kernels.arch import kernel_device
from kernels.rope import HEAD_DIM, ROPE_DIM, rope, rope_reference
from search_spaces import load_space
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
NOPE = HEAD_DIM - ROPE_DIM
KERNELS = ["rope_fwd", "rope_bwd"]
# The kernel and the reference build the same fp32 angles, so results differ by cos/sin and
# multiply-add rounding only (fp32), or by one bf16 rounding (the interpreter truncates: 2^-7).
TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2}}


def _problem(lead: tuple[int, ...], heads: int, dtype: torch.dtype, max_pos: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, heads, HEAD_DIM, generator=gen).to(DEVICE, dtype)
    pos = torch.randint(0, max_pos, lead, generator=gen).to(DEVICE)
    grad = torch.randn(*lead, heads, HEAD_DIM, generator=gen).to(DEVICE, dtype)
    return x, pos, grad


@pytest.mark.parametrize("inverse", [False, True], ids=["rotate", "inverse"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("lead", "heads"),
    [
        ((37,), 3),  # tokens and heads not multiples of the tile
        ((2, 5), 1),  # leading batch dims; one head, as the KV latent
        ((1,), 64),  # one token, V4-Flash query heads
    ],
)
def test_forward_and_gradients_match_eager(lead, heads, dtype, inverse):
    x, pos, grad = _problem(lead, heads, dtype, max_pos=1 << 16)
    x_k, x_r = x.clone().requires_grad_(), x.float().requires_grad_()
    out = rope(x_k, pos, inverse=inverse)
    out.backward(grad)
    out_r = rope_reference(x_r, pos, inverse=inverse)
    out_r.backward(grad.float())

    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(out[..., :NOPE], x[..., :NOPE])  # copied through bit for bit
    torch.testing.assert_close(out.float(), out_r, **TOLERANCES[dtype])
    assert x_k.grad.dtype == dtype
    assert torch.equal(x_k.grad[..., :NOPE], grad[..., :NOPE])
    torch.testing.assert_close(x_k.grad.float(), x_r.grad, **TOLERANCES[dtype])


def test_inverse_undoes_the_rotation_and_pairs_keep_their_norm():
    x, pos, _ = _problem((9,), 4, torch.float32, max_pos=1 << 20)
    out = rope(x, pos)
    pair_norms = lambda t: t[..., NOPE:].unflatten(-1, (ROPE_DIM // 2, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_norms(out), pair_norms(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope(out, pos, inverse=True), x, atol=1e-5, rtol=1e-5)
    # Position 0 is the identity; the first pair turns by exactly pos radians.
    zero = torch.zeros_like(pos)
    assert torch.equal(rope(x, zero), x)
    angle = pos.double()
    expected = torch.polar(torch.ones_like(angle), angle)[:, None] * torch.complex(
        x[..., NOPE].double(), x[..., NOPE + 1].double()
    )
    torch.testing.assert_close(torch.view_as_real(expected).float(), out[..., NOPE:NOPE + 2], atol=1e-4, rtol=0)


def test_far_positions_and_other_theta_match_eager():
    """At positions near 2^20 a one-ulp change of a frequency moves the angle by ~0.1 rad."""
    x, pos, _ = _problem((16,), 2, torch.float32, max_pos=1 << 20)
    pos += 1 << 20
    for theta in (10000.0, 160000.0):
        torch.testing.assert_close(rope(x, pos, theta=theta), rope_reference(x, pos, theta=theta), atol=1e-4, rtol=0)


CONFIGS = [
    {"BLOCK_T": 1, "BLOCK_H": 1, "num_warps": 1, "num_stages": 1},
    {"BLOCK_T": 4, "BLOCK_H": 2, "num_warps": 2, "num_stages": 1},  # ragged token and head blocks
    # 16-token blocks over 37 tokens (a ragged third), one head block of 4 over 3 heads (the space
    # prunes blocks wider than the next power of two)
    {"BLOCK_T": 16, "BLOCK_H": 4, "num_warps": 8, "num_stages": 1},
]


@pytest.mark.parametrize(("name", "config"), [(n, c) for n in KERNELS for c in CONFIGS])
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


def test_launches_resolve_their_own_kernel_at_tokens_and_heads(monkeypatch):
    asked = spy_on_resolve(monkeypatch, rope_module)
    x, pos, _ = _problem((2, 3), 5, torch.bfloat16, max_pos=100)
    x = x.requires_grad_()
    rope(x, pos).float().sum().backward()
    assert asked == [("rope_fwd", "tokens=6,heads=5"), ("rope_bwd", "tokens=6,heads=5")]


def test_bad_shapes_and_dtypes_are_rejected():
    x, pos, _ = _problem((3,), 2, torch.bfloat16, max_pos=100)
    bad_calls = [
        lambda: rope(x[..., :256], pos),  # head dim not 512
        lambda: rope(x, pos.float()),
        lambda: rope(x, pos[:2]),
        lambda: rope(x.to(torch.int32), pos),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("name", KERNELS)
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    shape = kernel.presets["small"][0]
    assert_seeded_random_inputs(kernel, shape)


@pytest.mark.parametrize("name", KERNELS)
def test_defaults_are_valid_configs_of_the_space(name):
    assert 40 <= load_space(name).size("sm_90") <= 250
    assert_defaults_fit_space(name, grid_points=True)


def test_bytes_moved_counts_each_tensor_once():
    for name in KERNELS:
        assert registry.get(name).bytes_moved({"tokens": 4096, "heads": 128}) == 2 * 2 * 4096 * 128 * 512 + 8 * 4096
