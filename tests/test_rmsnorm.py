"""Fused RMSNorm: parity with the eager reference, tuned configs, and the run-time lookup."""

from __future__ import annotations

import pytest
import torch

from kernels import registry, rmsnorm, tuning
from kernels.arch import kernel_device
from kernels.rmsnorm import rms_norm, rms_norm_reference
from tests.kernel_checks import assert_config_matches_reference, assert_seeded_random_inputs

DEVICE = kernel_device()
# bf16 outputs are compared with a fp32 reference: about one bf16 rounding step apart.
TOLERANCES = {torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-5}}


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCES[dtype])



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("shape", "weight_dtype"),
    [
        ((37, 96), "same"),  # tokens not a multiple of BLOCK_M, hidden not a power of two
        ((2, 5, 40), torch.float32),  # leading batch dims, fp32 weight
        ((3, 64), None),  # no weight
        ((1, 7), "same"),  # a single short row
    ],
)
def test_forward_and_gradients_match_eager(shape, weight_dtype, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    weight = None
    if weight_dtype is not None:
        weight = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype if weight_dtype == "same" else weight_dtype)
    grad_out = torch.randn(shape, generator=gen).to(DEVICE, dtype)

    x_k = x.clone().requires_grad_()
    w_k = None if weight is None else weight.clone().requires_grad_()
    y = rms_norm(x_k, w_k)
    y.backward(grad_out)

    x_r = x.float().requires_grad_()
    w_r = None if weight is None else weight.float().requires_grad_()
    y_r = rms_norm_reference(x_r, w_r)
    y_r.backward(grad_out.float())

    assert y.dtype == dtype and y.shape == x.shape
    _close(y, y_r, dtype)
    assert x_k.grad.dtype == dtype
    _close(x_k.grad, x_r.grad, dtype)
    if weight is not None:
        assert w_k.grad.dtype == weight.dtype
        _close(w_k.grad, w_r.grad, weight.dtype)


FWD_CONFIGS = [
    {"BLOCK_M": 1, "BLOCK_D": 0, "num_warps": 1, "num_stages": 1},
    {"BLOCK_M": 2, "BLOCK_D": 32, "num_warps": 2, "num_stages": 2},  # ragged chunks of 96 and 40
    {"BLOCK_M": 16, "BLOCK_D": 16, "num_warps": 4, "num_stages": 1},
    {"BLOCK_M": 4, "BLOCK_D": 0, "num_warps": 8, "num_stages": 1},  # one pass over the whole (padded) row
]
BWD_CONFIGS = [
    {"BLOCK_M": 1, "PROGRAMS": 1, "num_warps": 1, "num_stages": 1},  # one program loops over every row
    {"BLOCK_M": 2, "PROGRAMS": 3, "num_warps": 2, "num_stages": 2},  # ragged slabs of rows
    {"BLOCK_M": 8, "PROGRAMS": 128, "num_warps": 4, "num_stages": 1},  # more programs than row blocks
]


@pytest.mark.parametrize(
    ("name", "config"),
    [("rmsnorm_fwd", c) for c in FWD_CONFIGS] + [("rmsnorm_bwd", c) for c in BWD_CONFIGS],
)
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


def test_env_override_reaches_the_launch(monkeypatch, fresh_lookup):
    monkeypatch.setenv("TUNER_CONFIG_RMSNORM_FWD", '{"BLOCK_M": 2}')
    monkeypatch.setenv("TUNER_CONFIG_RMSNORM_BWD", '{"BLOCK_M": 4, "PROGRAMS": 2}')
    tuning.clear_cache()
    config, source = tuning.resolve("rmsnorm_fwd", {"tokens": 37, "hidden": 96})
    assert source == "env" and config["BLOCK_M"] == 2

    launched = []
    real_launch = rmsnorm.launch

    def spy(kernel, grid, args, constexprs, config, compile_only=False):
        launched.append((grid, constexprs["BLOCK_M"]))
        return real_launch(kernel, grid, args, constexprs, config, compile_only)

    monkeypatch.setattr(rmsnorm, "launch", spy)
    x = torch.randn(37, 96).to(DEVICE).requires_grad_()
    y = rms_norm(x)
    y.sum().backward()
    # forward: 37 rows in blocks of 2; backward: at most 2 programs of 4-row steps.
    assert launched == [((19,), 2), ((2,), 4)]
    torch.testing.assert_close(y, rms_norm_reference(x), atol=1e-5, rtol=1e-5)


def test_malformed_env_override_is_an_error(monkeypatch, fresh_lookup):
    monkeypatch.setenv("TUNER_CONFIG_RMSNORM_FWD", "[2]")
    with pytest.raises(tuning.ConfigOverrideError):
        rms_norm(torch.randn(4, 8).to(DEVICE))


def test_weight_of_wrong_shape_or_dtype_is_rejected():
    x = torch.randn(4, 8).to(DEVICE, torch.bfloat16)
    with pytest.raises(ValueError):
        rms_norm(x, torch.ones(9).to(DEVICE, torch.bfloat16))
    with pytest.raises(ValueError):
        rms_norm(x, torch.ones(8).to(DEVICE, torch.float16))


@pytest.mark.parametrize("name", ["rmsnorm_fwd", "rmsnorm_bwd"])
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    shape = kernel.presets["small"][0]
    assert_seeded_random_inputs(kernel, shape)


def test_forward_and_backward_problems_share_x_and_weight():
    shape = registry.get("rmsnorm_fwd").presets["small"][0]
    fwd = registry.get("rmsnorm_fwd").make_inputs(shape, torch.device("cpu"), 3)
    bwd = registry.get("rmsnorm_bwd").make_inputs(shape, torch.device("cpu"), 3)
    assert set(fwd) == {"x", "weight"} and {"grad_out", "rstd"} <= set(bwd)
    assert torch.equal(fwd["x"], bwd["x"]) and torch.equal(fwd["weight"], bwd["weight"])


def test_bytes_moved_counts_each_tensor_once():
    shape = {"tokens": 4096, "hidden": 7168}
    tokens_by_hidden = 4096 * 7168
    assert registry.get("rmsnorm_fwd").bytes_moved(shape) == 2 * (2 * tokens_by_hidden + 7168)
    assert registry.get("rmsnorm_bwd").bytes_moved(shape) == 2 * (3 * tokens_by_hidden + 2 * 7168) + 4 * 4096


def test_a_config_the_space_prunes_at_every_small_preset_is_refused():
    """assert_config_matches_reference fails where it would compare nothing: a chunk as wide as the row
    is pruned at every small shape (it is the one-pass config again)."""
    with pytest.raises(AssertionError, match="would test nothing"):
        assert_config_matches_reference(registry.get("rmsnorm_fwd"),
                                        {"BLOCK_M": 4, "BLOCK_D": 4096, "num_warps": 8, "num_stages": 1}, seed=3)
