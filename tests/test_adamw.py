"""The fused AdamW update: parity with its eager reference (ragged lengths, the decay boundary, each
weight dtype), configs a sweep may pick, the contract, and the optimizer's weight groups.

An optimizer update has no gradient of its own to check: its outputs are the new state."""

from __future__ import annotations

import pytest
import torch

from kernels import adamw as adamw_module
from kernels import registry
from kernels.adamw import AdamWHyper, adamw_step_, adamw_step_reference_
from kernels.arch import kernel_device
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space,
                                 assert_seeded_random_inputs, spy_on_resolve)
from v4.optim import MixedPrecisionAdamW

DEVICE = kernel_device()
HYPER = AdamWHyper(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=2, grad_scale=0.7)


def _state(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(n, generator=gen)
    master = 0.02 * torch.randn(n, generator=gen)
    exp_avg = 1e-2 * torch.randn(n, generator=gen)
    exp_avg_sq = 1e-4 * torch.rand(n, generator=gen)
    return [t.to(DEVICE) for t in (grad, master, exp_avg, exp_avg_sq)]


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("n", "decayed"), [(1, 1), (1, 0), (1000, 333), (4097, 4097), (5000, 0)])
def test_the_kernel_updates_as_the_eager_ops_do(n, decayed, weight_dtype):
    grad, *state = _state(n, seed=n + decayed)
    kernel_state, reference_state = [t.clone() for t in state], [t.clone() for t in state]
    kernel_weight = torch.zeros(n, device=DEVICE, dtype=weight_dtype)
    reference_weight = kernel_weight.clone()
    adamw_step_(grad, *kernel_state, kernel_weight, HYPER, decayed=decayed)
    adamw_step_reference_(grad, *reference_state, reference_weight, HYPER, decayed=decayed)
    for name, out, ref, before in zip(("master", "exp_avg", "exp_avg_sq"), kernel_state, reference_state, state):
        torch.testing.assert_close(out, ref, atol=1e-9, rtol=2e-6, msg=name)
        assert not torch.equal(out, before), name  # it did update in place
    # the weight is the new master in its dtype (the interpreter rounds toward zero: one step off at most)
    step = 2.0 ** -7 if weight_dtype == torch.bfloat16 else 2.0 ** -22
    torch.testing.assert_close(kernel_weight.float(), kernel_state[0], atol=1e-9, rtol=step)


def test_decay_stops_at_the_boundary():
    """With zero gradients and moments the update is the decay alone: ``decayed`` elements shrink."""
    n, decayed = 300, 129
    grad, master = torch.zeros(n, device=DEVICE), torch.ones(n, device=DEVICE)
    exp_avg, exp_avg_sq, weight = torch.zeros(n, device=DEVICE), torch.zeros(n, device=DEVICE), torch.empty(n, device=DEVICE)
    hyper = AdamWHyper(lr=0.5, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.2, step=1)
    adamw_step_(grad, master, exp_avg, exp_avg_sq, weight, hyper, decayed=decayed)
    assert master[:decayed].tolist() == [pytest.approx(0.9)] * decayed
    assert master[decayed:].tolist() == [1.0] * (n - decayed)
    assert torch.equal(weight, master)


def test_an_empty_update_is_no_launch():
    empty = torch.empty(0, device=DEVICE)
    adamw_step_(empty, empty, empty, empty, empty.to(torch.bfloat16), HYPER)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: {**s, "grad": s["grad"].double()}, "grad must be a contiguous 1-D fp32"),
    (lambda s: {**s, "master": s["master"][:-1]}, "master must be a contiguous 1-D fp32 tensor of 8"),
    (lambda s: {**s, "exp_avg": s["exp_avg"].view(2, 4)}, "exp_avg must be"),
    (lambda s: {**s, "exp_avg_sq": s["exp_avg_sq"].view(2, 4).t().flatten()[::1].view(4, 2).t()}, "exp_avg_sq must be"),
    (lambda s: {**s, "weight": s["weight"].to(torch.int32)}, "weight must be a contiguous 1-D bf16"),
    (lambda s: {**s, "decayed": 9}, "decayed must be within 0..8"),
    (lambda s: {**s, "hyper": AdamWHyper(1e-3, 0.9, 0.95, 1e-8, 0.1, step=0)}, "step must be >= 1"),
    (lambda s: {**s, "hyper": AdamWHyper(1e-3, 1.0, 0.95, 1e-8, 0.1, step=1)}, "betas must be within"),
])
def test_the_contract_names_the_field(change, message):
    grad, master, exp_avg, exp_avg_sq = _state(8, seed=1)
    args = change({"grad": grad, "master": master, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                   "weight": torch.empty(8, device=DEVICE, dtype=torch.bfloat16), "hyper": HYPER, "decayed": 0})
    for update in (adamw_step_, adamw_step_reference_):
        with pytest.raises(ValueError, match=message):
            update(**args)


CONFIGS = [
    {"BLOCK": 256, "num_warps": 1, "num_stages": 1},
    {"BLOCK": 1024, "num_warps": 4, "num_stages": 1},  # ragged last blocks of 1,000 and 4,097
    {"BLOCK": 8192, "num_warps": 16, "num_stages": 1},  # longer than every small shape
]


@pytest.mark.parametrize("config", CONFIGS)
def test_tuned_configs_match_reference(config):
    assert_config_matches_reference(registry.get("adamw_step"), config, seed=4)


def test_the_sweep_check_catches_a_missing_bias_correction(monkeypatch):
    """The registry's inputs make the update ten times the masters, so that its loose tolerance (the
    bf16 weight's rounding) still fails an update that is wrong."""
    kernel = registry.get("adamw_step")
    inputs = kernel.make_inputs({"params": 1000}, DEVICE, seed=2)
    expected = kernel.reference(inputs)
    wrong = AdamWHyper(**{**adamw_module._HYPER.__dict__, "step": 10_000})  # corrections of about 1
    monkeypatch.setattr(adamw_module, "_HYPER", wrong)
    outputs = kernel.run(inputs, kernel.default_config({"params": 1000}))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(outputs[0], expected[0], atol=kernel.atol, rtol=kernel.rtol)


def test_defaults_fit_the_space_and_inputs_are_seeded():
    assert_defaults_fit_space("adamw_step", presets=("small",), grid_points=True)
    kernel = registry.get("adamw_step")
    assert_seeded_random_inputs(kernel, kernel.presets["small"][2])


def test_the_launch_asks_the_table_at_its_length(monkeypatch):
    asked = spy_on_resolve(monkeypatch, adamw_module)
    grad, *state = _state(77, seed=5)
    adamw_step_(grad, *state, torch.empty(77, device=DEVICE, dtype=torch.bfloat16), HYPER)
    assert asked == [("adamw_step", "params=77")]


def test_the_optimizer_groups_weights_by_dtype_and_writes_them_as_it_steps():
    """bf16 and fp32 parameters (as the mHC gates are) each become views of one flat buffer; a fused
    and an eager optimizer started alike stay alike, weights included."""
    def params() -> list[torch.nn.Parameter]:
        gen = torch.Generator().manual_seed(8)
        return [torch.nn.Parameter(torch.randn(*shape, generator=gen).to(DEVICE, dtype))
                for shape, dtype in (((7,), torch.float32), ((4, 9), torch.bfloat16), ((5,), torch.bfloat16),
                                     ((3, 3), torch.float32))]

    fused_params, eager_params = params(), params()
    fused = MixedPrecisionAdamW(fused_params, lr=1e-2, fused=True)
    eager = MixedPrecisionAdamW(eager_params, lr=1e-2)
    assert [p.dtype for p in fused.params] == [torch.bfloat16] * 2 + [torch.float32] * 2
    assert [p.dim() for p in fused.params] == [2, 1, 2, 1]  # matrices first in each group: decay is a prefix
    for step in range(3):
        for optimizer, ps in ((fused, fused_params), (eager, eager_params)):
            optimizer.zero_grad()
            sum(((p.float() * (i + step + 1)).square().sum() for i, p in enumerate(ps))).backward()
            optimizer.step()
        # after the first step, from the same weights, within fp32 rounding; after that the interpreter's
        # bf16 weights (rounded toward zero) feed the next gradients, a rounding step apart
        tolerance = {"atol": 1e-9, "rtol": 2e-6} if step == 0 else {"atol": 1e-6, "rtol": 1e-2}
        for p, q in zip(fused_params, eager_params):
            torch.testing.assert_close(fused.master_of(p), eager.master_of(q), **tolerance)
            rounding = 2.0 ** -7 if p.dtype == torch.bfloat16 else 2.0 ** -22
            torch.testing.assert_close(p.detach().float(), fused.master_of(p), atol=1e-9, rtol=rounding)
    assert all(not torch.equal(p.detach(), q.detach()) for p, q in zip(fused_params, params()))  # they trained
