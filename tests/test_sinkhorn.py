"""mHC Sinkhorn projection: parity with the eager reference, tuned configs, and the run-time lookup."""

from __future__ import annotations

import pytest
import torch

from kernels import registry, sinkhorn as sinkhorn_module, tuning
from kernels.arch import kernel_device
from kernels.sinkhorn import sinkhorn, sinkhorn_reference
from tests.kernel_checks import assert_config_matches_reference, assert_seeded_random_inputs

DEVICE = kernel_device()
OUTPUT_TOL = {"atol": 1e-5, "rtol": 1e-4}
# fp32 gradients through up to 39 normalisation steps; bf16 ones are rounded once at the end.
GRAD_TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-3}, torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2}}



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("shape", "iters"),
    [
        ((33, 4, 4), 20),  # tokens not a multiple of BLOCK_N; 19 pairs in segments of 5, 5, 5, 4
        ((2, 3, 4, 4), 20),  # leading batch dims
        ((1, 4, 4), 1),  # priming column normalisation only
        ((5, 4, 4), 2),  # one row/column pair
        ((9, 4, 4), 6),  # 5 pairs in segments of 3 and 2
    ],
)
def test_forward_and_gradients_match_eager(shape, iters, dtype):
    gen = torch.Generator().manual_seed(2)
    logits = (2 * torch.randn(shape, generator=gen)).to(DEVICE, dtype)
    grad_out = torch.randn(shape, generator=gen).to(DEVICE)

    logits_k = logits.clone().requires_grad_()
    out = sinkhorn(logits_k, iters=iters)
    out.backward(grad_out)

    logits_r = logits.float().requires_grad_()
    out_r = sinkhorn_reference(logits_r, iters=iters)
    out_r.backward(grad_out)

    assert out.dtype == torch.float32 and out.shape == logits.shape
    torch.testing.assert_close(out, out_r, **OUTPUT_TOL)
    # The last step normalises columns: each sums to c / (c + eps), within 1e-5 of one.
    torch.testing.assert_close(out.sum(-2), torch.ones_like(out.sum(-2)), atol=1e-5, rtol=0)
    assert logits_k.grad.dtype == dtype
    torch.testing.assert_close(logits_k.grad.float(), logits_r.grad, **GRAD_TOL[dtype])


@pytest.mark.parametrize(
    ("name", "config"),
    [
        (name, config)
        for name in ("sinkhorn_fwd", "sinkhorn_bwd")
        for config in (
            {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
            {"BLOCK_N": 32, "num_warps": 1, "num_stages": 1},  # 33 tokens: a ragged second block
            {"BLOCK_N": 128, "num_warps": 4, "num_stages": 1},  # one block wider than 100 tokens
        )
    ],
)
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=4)


def test_env_override_reaches_the_launch(monkeypatch, fresh_lookup):
    monkeypatch.setenv("TUNER_CONFIG_SINKHORN_FWD", '{"BLOCK_N": 16}')
    monkeypatch.setenv("TUNER_CONFIG_SINKHORN_BWD", '{"BLOCK_N": 64}')
    tuning.clear_cache()
    config, source = tuning.resolve("sinkhorn_fwd", {"tokens": 40})
    assert source == "env" and config["BLOCK_N"] == 16

    launched = []
    real_launch = sinkhorn_module.launch

    def spy(kernel, grid, args, constexprs, config, compile_only=False):
        launched.append((grid, constexprs["BLOCK_N"]))
        return real_launch(kernel, grid, args, constexprs, config, compile_only)

    monkeypatch.setattr(sinkhorn_module, "launch", spy)
    logits = torch.randn(40, 4, 4).to(DEVICE).requires_grad_()
    out = sinkhorn(logits, iters=3)
    out.sum().backward()
    assert launched == [((3,), 16), ((1,), 64)]
    torch.testing.assert_close(out, sinkhorn_reference(logits, iters=3), **OUTPUT_TOL)


def test_malformed_env_override_is_an_error(monkeypatch, fresh_lookup):
    monkeypatch.setenv("TUNER_CONFIG_SINKHORN_FWD", "not json")
    with pytest.raises(tuning.ConfigOverrideError):
        sinkhorn(torch.randn(2, 4, 4).to(DEVICE))


def test_bad_shape_or_iters_is_rejected():
    with pytest.raises(ValueError):
        sinkhorn(torch.randn(2, 4, 3).to(DEVICE))
    with pytest.raises(ValueError):
        sinkhorn(torch.randn(2, 4, 4).to(DEVICE), iters=0)


@pytest.mark.parametrize("name", ["sinkhorn_fwd", "sinkhorn_bwd"])
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    shape = kernel.presets["small"][1]
    for value in kernel.make_inputs(shape, DEVICE, 5).values():
        assert value.shape == (shape["tokens"], 4, 4) and value.dtype == torch.float32
    assert_seeded_random_inputs(kernel, shape)


def test_bytes_moved_counts_each_tensor_once():
    assert registry.get("sinkhorn_fwd").bytes_moved({"tokens": 4096}) == 4096 * 64 * 2
    assert registry.get("sinkhorn_bwd").bytes_moved({"tokens": 4096}) == 4096 * 64 * 3
