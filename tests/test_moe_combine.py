"""MoE combine and dispatch: parity with the eager index_add_ and index (forward and gradients,
ragged shapes), tuned configs, and the contract."""

from __future__ import annotations

import pytest
import torch

from kernels import moe_combine as combine_module
from kernels import registry
from kernels.arch import kernel_device
from kernels.moe_combine import moe_combine, moe_combine_reference, moe_dispatch, moe_dispatch_reference, slots_of
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space,
                                 assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
# bf16 outputs of an fp32 sum: the two summation orders may round one bf16 step apart.
TOL = {torch.bfloat16: {"atol": 2e-2, "rtol": 1e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-5}}


def _problem(tokens: int, hidden: int, topk: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    routed = torch.randn(tokens * topk, hidden, generator=gen).to(DEVICE, dtype)
    shared = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    order = torch.randperm(tokens * topk, generator=gen).to(DEVICE)
    grad_y = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    return routed, order, shared, grad_y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("with_shared", [True, False], ids=["shared", "routed-only"])
@pytest.mark.parametrize(("tokens", "hidden", "topk"), [(37, 96, 3), (5, 40, 1), (1, 128, 6), (19, 2048, 6)])
def test_forward_and_gradients_match_eager(tokens, hidden, topk, with_shared, dtype):
    routed, order, shared, grad_y = _problem(tokens, hidden, topk, dtype, seed=tokens + hidden + topk)
    shared = shared if with_shared else None
    inputs_k = [routed.clone().requires_grad_(), None if shared is None else shared.clone().requires_grad_()]
    inputs_r = [routed.clone().requires_grad_(), None if shared is None else shared.clone().requires_grad_()]
    y = moe_combine(inputs_k[0], order, topk, inputs_k[1])
    y.backward(grad_y)
    y_r = moe_combine_reference(inputs_r[0], order, topk, inputs_r[1])
    y_r.backward(grad_y)
    assert y.shape == (tokens, hidden) and y.dtype == dtype
    torch.testing.assert_close(y, y_r, **TOL[dtype])
    for kernel_input, reference_input in zip(inputs_k, inputs_r):
        if kernel_input is not None:  # gathers and copies of grad_y: exact
            assert torch.equal(kernel_input.grad, reference_input.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("tokens", "hidden", "topk"), [(37, 96, 3), (5, 40, 1), (1, 128, 6), (19, 2048, 6)])
def test_dispatch_gathers_and_its_gradient_is_the_fp32_sum(tokens, hidden, topk, dtype):
    """Forward: the eager index, exactly. Backward: each token's k row gradients summed in fp32, then
    rounded once to the dtype (within one step of the fp32 sum: the interpreter rounds toward zero,
    a GPU to nearest), where eager autograd accumulates in the dtype itself."""
    _, order, x, _ = _problem(tokens, hidden, topk, dtype, seed=tokens * topk)
    grad_rows = torch.randn(tokens * topk, hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    x_k, x_r = x.clone().requires_grad_(), x.clone().requires_grad_()
    rows = moe_dispatch(x_k, order, topk)
    rows.backward(grad_rows)
    rows_r = moe_dispatch_reference(x_r, order, topk)
    rows_r.backward(grad_rows)
    assert torch.equal(rows, rows_r)
    exact = torch.zeros(tokens, hidden, device=DEVICE).index_add_(0, order // topk, grad_rows.float())
    assert x_k.grad.dtype == dtype
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22
    torch.testing.assert_close(x_k.grad.float(), exact, atol=1e-6, rtol=step)
    if dtype == torch.float32:  # in bf16 the eager sum rounds at each of its k adds: up to 0.1 off here
        torch.testing.assert_close(x_k.grad, x_r.grad, **TOL[dtype])


def test_the_sum_is_each_tokens_own_rows():
    """Two tokens, k 2: y[t] is the sum of exactly the rows ``order`` assigns to t."""
    routed = torch.tensor([[1.0], [10.0], [100.0], [1000.0]], device=DEVICE)
    order = torch.tensor([3, 0, 2, 1], device=DEVICE)  # sorted rows 0..3 answer (1,1), (0,0), (1,0), (0,1)
    assert moe_combine(routed, order, 2).flatten().tolist() == [10.0 + 1000.0, 1.0 + 100.0]
    assert slots_of(order, 2).tolist() == [[1, 3], [2, 0]]


CONFIGS = [
    {"BLOCK_T": 1, "BLOCK_D": 128, "num_warps": 1, "num_stages": 1},
    {"BLOCK_T": 4, "BLOCK_D": 128, "num_warps": 4, "num_stages": 1},  # ragged column tiles of 96 and 40
    {"BLOCK_T": 16, "BLOCK_D": 128, "num_warps": 8, "num_stages": 1},  # taller than 5 and 1 tokens
]


@pytest.mark.parametrize("config", CONFIGS)
def test_tuned_configs_match_reference(config):
    assert_config_matches_reference(registry.get("moe_combine_fwd"), config, seed=3)


def test_defaults_fit_the_space_and_inputs_are_seeded():
    assert_defaults_fit_space("moe_combine_fwd", grid_points=True)
    kernel = registry.get("moe_combine_fwd")
    assert_seeded_random_inputs(kernel, kernel.presets["small"][0], integers_nonzero=False)


def test_the_launch_asks_the_table_at_its_shape(monkeypatch):
    asked = spy_on_resolve(monkeypatch, combine_module)
    routed, order, shared, _ = _problem(5, 40, 3, torch.bfloat16, seed=1)
    moe_combine(routed, order, 3, shared)
    assert asked == [("moe_combine_fwd", "tokens=5,hidden=40,topk=3")]
