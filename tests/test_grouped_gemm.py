"""Grouped expert GEMMs with clamped SwiGLU: parity with eager per-expert loops, tile table, tuned configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import grouped_gemm, registry, tuning
from kernels.arch import kernel_device
from kernels.grouped_gemm import SWIGLU_CLAMP, expert_mlp, expert_mlp_reference
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
LAUNCHES = ("expert_up_fwd", "expert_down_fwd", "expert_down_bwd_dx", "expert_down_bwd_dw", "expert_up_bwd_dx",
            "expert_up_bwd_dw")



def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 3e-2) -> None:
    """Within ``tol`` of the expected tensor's RMS, or ``tol`` relative per element.

    The kernels round a and dgu to bf16 (the interpreter by truncation), which the fp32
    reference does not: errors up to ~10% of the RMS on single elements of dW13 and dW2,
    about 1% on average.
    """
    expected = expected.float()
    scale = expected.square().mean().sqrt().item() if expected.numel() else 1.0
    torch.testing.assert_close(actual.float(), expected, atol=tol * scale, rtol=tol)


def _problem(loads: list[int], hidden: int, ffn: int, seed: int) -> dict[str, torch.Tensor]:
    """A ragged problem whose gate and up pre-activations often pass +-10.

    x holds small integers and W13 quarters, so g and u are exact in bf16 and fp32 alike
    (some exactly +-10): kernel and reference put the clamp masks on the same elements.
    """
    gen = torch.Generator().manual_seed(seed)
    n_experts, tokens = len(loads), sum(loads)
    offsets = torch.tensor([0, *torch.tensor(loads).cumsum(0).tolist()], dtype=torch.int32)
    tensors = {
        "x": torch.randint(-2, 3, (tokens, hidden), generator=gen).float(),
        "weights": 0.1 + torch.rand(tokens, generator=gen),
        "w13": torch.randint(-3, 4, (n_experts, 2 * ffn, hidden), generator=gen) / 4,
        "w2": torch.randn(n_experts, hidden, ffn, generator=gen) * ffn ** -0.5,
        "dy": torch.randn(tokens, hidden, generator=gen),
    }
    problem = {k: v.to(DEVICE, torch.float32 if k == "weights" else torch.bfloat16) for k, v in tensors.items()}
    return {**problem, "offsets": offsets.to(DEVICE)}


def _reference_grads(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    leaves = {k: p[k].float().requires_grad_() for k in ("x", "weights", "w13", "w2")}
    y = expert_mlp_reference(leaves["x"], p["offsets"], leaves["weights"], leaves["w13"], leaves["w2"])
    y.float().backward(p["dy"].float())
    return y, {k: v.grad for k, v in leaves.items()}


LOADS = [
    pytest.param([5, 0, 17], 64, 48, id="5-0-17"),  # an empty expert; 17 rows = two row tiles of 16
    pytest.param([0, 37, 0, 3], 40, 24, id="0-37-0-3"),  # D and F not multiples of 16 or 32
    pytest.param([0, 0], 32, 16, id="no-tokens"),  # nothing routed: weight gradients are zeros
]


ROW_GEMMS = ("expert_up_fwd", "expert_down_fwd", "expert_down_bwd_dx", "expert_up_bwd_dx")


@pytest.fixture(params=[False, True], ids=["pointers", "tma"])
def row_gemm_loads(request, monkeypatch):
    """Run every GEMM by masked pointer loads (their defaults) or, overridden, by TMA descriptors."""
    if request.param:
        for name in LAUNCHES:
            monkeypatch.setenv(f"TUNER_CONFIG_{name.upper()}", '{"TMA": 1, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}')
    tuning.clear_cache()
    yield request.param
    tuning.clear_cache()


@pytest.mark.parametrize(("loads", "hidden", "ffn"), LOADS)
def test_expert_mlp_forward_and_gradients_match_eager(loads, hidden, ffn, row_gemm_loads):
    p = _problem(loads, hidden, ffn, seed=sum(loads) + hidden)
    leaves = {k: p[k].clone().requires_grad_() for k in ("x", "weights", "w13", "w2")}
    y = expert_mlp(leaves["x"], p["offsets"], leaves["weights"], leaves["w13"], leaves["w2"])
    y.backward(p["dy"])
    y_ref, grads_ref = _reference_grads(p)

    assert y.dtype == torch.bfloat16 and y.shape == y_ref.shape
    _close(y, y_ref)
    for name, grad in grads_ref.items():
        assert leaves[name].grad.dtype == p[name].dtype, name
        # dweights = sum_f a * (dy @ W2_e) meets no bf16 intermediate: a is recomputed from g and u.
        _close(leaves[name].grad, grad, tol=1e-3 if name == "weights" else 3e-2)
    if sum(loads):
        gu = torch.cat([p["x"][a:b].float() @ p["w13"][e].float().T
                        for e, (a, b) in enumerate(zip(p["offsets"][:-1].tolist(), p["offsets"][1:].tolist()))])
        g, u = gu.chunk(2, dim=-1)
        assert (g > SWIGLU_CLAMP).any() and (u.abs() > SWIGLU_CLAMP).any()  # the clamps are active
    else:
        assert not leaves["w13"].grad.any() and not leaves["w2"].grad.any()


@pytest.mark.parametrize("buffer_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_weight_gradients_accumulate_in_place_into_given_buffers(buffer_dtype):
    p = _problem([5, 0, 17], 64, 48, seed=11)
    gen = torch.Generator().manual_seed(12)
    prefill = {k: torch.randn(p[k].shape, generator=gen).to(DEVICE, buffer_dtype) for k in ("w13", "w2")}
    buffers = {k: v.clone() for k, v in prefill.items()}
    pointers = {k: v.data_ptr() for k, v in buffers.items()}
    leaves = {k: p[k].clone().requires_grad_() for k in ("x", "weights", "w13", "w2")}
    y = expert_mlp(leaves["x"], p["offsets"], leaves["weights"], leaves["w13"], leaves["w2"],
                   grad_buffers=(buffers["w13"], buffers["w2"]))
    y.backward(p["dy"])
    _, grads_ref = _reference_grads(p)

    assert leaves["w13"].grad is None and leaves["w2"].grad is None
    _close(leaves["x"].grad, grads_ref["x"])
    for name in ("w13", "w2"):
        assert buffers[name].data_ptr() == pointers[name] and buffers[name].dtype == buffer_dtype
        _close(buffers[name], prefill[name].float() + grads_ref[name])


def test_tile_table_skips_empty_experts():
    offsets = torch.tensor([0, 5, 5, 22], dtype=torch.int32).to(DEVICE)
    table, tiles = grouped_gemm._tile_table(offsets, 16, 22)
    assert tiles == 22 // 16 + 3
    valid = table[0] >= 0
    assert table[0].tolist() == [0, 2, 2, -1]
    assert table[1][valid].tolist() == [0, 5, 21] and table[2][valid].tolist() == [5, 22, 22]


@pytest.mark.parametrize("experts, block_m", [(1, 128), (9, 16), (32, 64), (300, 32)])
def test_tile_table_launch_matches_its_eager_form(experts, block_m):
    gen = torch.Generator().manual_seed(experts)
    loads = torch.randint(0, 3 * block_m, (experts,), generator=gen)
    loads[::4] = 0  # empty experts, the first among them
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), loads.cumsum(0)]).int().to(DEVICE)
    n_rows = int(offsets[-1])
    table, tiles = grouped_gemm._tile_table(offsets, block_m, n_rows)
    reference = grouped_gemm.tile_table_reference(offsets, block_m, n_rows)
    assert table.dtype == torch.int32 and table.shape == (3, tiles) == reference.shape
    assert torch.equal(table.cpu(), reference.cpu())


def test_tile_table_of_no_rows_is_empty():
    offsets = torch.zeros(5, dtype=torch.int32, device=DEVICE)
    table, tiles = grouped_gemm._tile_table(offsets, 64, 0)
    assert tiles == 0 and table.shape == (3, 0)


@pytest.mark.parametrize("block_m", [16, 64])
def test_tile_table_covers_every_row_once(block_m):
    gen = torch.Generator().manual_seed(block_m)
    loads = torch.randint(0, 3 * block_m, (9,), generator=gen)
    loads[::3] = 0
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), loads.cumsum(0)]).int()
    table, _ = grouped_gemm._tile_table(offsets.to(DEVICE), block_m, int(offsets[-1]))
    owner = torch.full((int(offsets[-1]),), -1)
    for expert, start, end in table.cpu().T.tolist():
        if expert < 0:
            continue
        rows = torch.arange(start, min(start + block_m, end))
        assert offsets[expert] <= start < end == offsets[expert + 1]
        assert (owner[rows] == -1).all()
        owner[rows] = expert
    assert torch.equal(owner, torch.repeat_interleave(torch.arange(9), loads))


CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 1, "num_stages": 1, "TMA": 0, "WARP_SPECIALIZE": 0},
    # K steps past the edge of D = 40 and F = 24; swizzle groups of 4 over a ragged row-tile count.
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 2, "num_stages": 2, "TMA": 0, "WARP_SPECIALIZE": 0},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 2, "num_warps": 4, "num_stages": 3, "TMA": 0, "WARP_SPECIALIZE": 0},
    # TMA descriptors: tiles past the expert's rows, the K edge and, for W13's gate half, into the up
    # rows; for the weight-gradient launches, descriptors over each expert's rows (empty ones included).
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 1, "num_stages": 1, "TMA": 1, "WARP_SPECIALIZE": 0},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 2, "num_stages": 2, "TMA": 1, "WARP_SPECIALIZE": 0},
    # Warp-specialized: tiles past the last one run no step instead of returning early (16-row tiles
    # leave some at the small shapes); at 64 x 64 x 64 Triton 3.6 compiles the specialized form for
    # sm_90 (offline), which the GPU parity run then checks.
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2, "TMA": 1,
     "WARP_SPECIALIZE": 1},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "TMA": 1,
     "WARP_SPECIALIZE": 1},
]


def _for_launch(name: str, config: dict) -> dict:
    """The weight-gradient launches' K is an expert's tokens, at most 8 at the small shapes: their
    space allows K steps of 16 only there (still a ragged K). The dgu launch's epilogue runs whole
    unless a config asks for halves."""
    if name == "expert_down_bwd_dx":
        return {"EPILOGUE_HALVES": 0, **config}
    return {**config, "BLOCK_K": 16} if name.endswith("_dw") else config


@pytest.mark.parametrize("config", CONFIGS, ids=["16-16-16", "16-32-32", "32-16-64", "tma-16-16-16", "tma-16-32-32",
                                               "tma-ws-16-32-32", "tma-ws-64-64-64"])
@pytest.mark.parametrize("name", LAUNCHES)
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), _for_launch(name, config), seed=3)


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[4]], ids=["pointers", "tma"])
def test_the_swiglu_backward_over_column_halves_matches_the_whole_tile(config):
    """EPILOGUE_HALVES: the same dgu and routing-weight gradient, tile by half tile (ragged F = 24 and 48)."""
    assert_config_matches_reference(registry.get("expert_down_bwd_dx"), {**config, "EPILOGUE_HALVES": 1}, seed=4)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[4]], ids=["pointers", "tma"])
def test_weights_applied_before_the_down_weight_gradient_give_its_sums(config, prefetch):
    """PRESCALE: w * a formed (and rounded to bf16) before the kernel, which then runs unscaled."""
    config = _for_launch("expert_down_bwd_dw", {**config, "PRESCALE": 1, "PREFETCH_GRAD": prefetch})
    assert_config_matches_reference(registry.get("expert_down_bwd_dw"), config, seed=6)


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[4]], ids=["pointers", "tma"])
@pytest.mark.parametrize("name", ["expert_down_bwd_dw", "expert_up_bwd_dw"])
def test_a_prefetched_gradient_tile_adds_as_after_the_reduction(name, config):
    """PREFETCH_GRAD reads the fp32 gradient tile before the reduction: the same sums, at ragged tiles."""
    assert_config_matches_reference(registry.get(name), _for_launch(name, {**config, "PREFETCH_GRAD": 1}), seed=5)


@pytest.mark.parametrize("name", ["expert_down_bwd_dw", "expert_up_bwd_dw"])
def test_weight_gradient_runs_leave_their_inputs_alone(name):
    # The sweep runs a config many times on the same inputs: the gradient buffer must stay as drawn.
    kernel = registry.get(name)
    shape = kernel.presets["small"][0]
    inputs = kernel.make_inputs(shape, DEVICE, seed=1)
    before = {k: v.clone() for k, v in inputs.items()}
    first = kernel.run(inputs, CONFIGS[0])
    again = kernel.run(inputs, CONFIGS[0])
    assert all(torch.equal(before[k], inputs[k]) for k in inputs)
    assert torch.equal(first, again)


@pytest.mark.parametrize("name", LAUNCHES)
def test_inputs_are_seeded_random_and_compile_accepts_default(name):
    kernel = registry.get(name)
    shape = kernel.presets["small"][0]
    offsets = kernel.make_inputs(shape, DEVICE, 5)["offsets"]
    assert offsets[0] == 0 and offsets[-1] == shape["tokens"] and (offsets.diff() >= 0).all()
    # Balanced loads over 3 experts: two seeds may well draw the same expert order.
    assert_seeded_random_inputs(kernel, shape, integers_nonzero=False, fixed=("offsets",))


@pytest.mark.parametrize("name", LAUNCHES)
def test_defaults_fit_the_space_on_sm_90(name):
    assert_defaults_fit_space(name, ("v4-flash", "v4-pro"))


def test_launches_resolve_registered_shapes(monkeypatch):
    looked_up = spy_on_resolve(monkeypatch, grouped_gemm)
    p = _problem([3, 2], 32, 16, seed=0)
    leaves = {k: p[k].clone().requires_grad_() for k in ("x", "weights", "w13", "w2")}
    expert_mlp(leaves["x"], p["offsets"], leaves["weights"], leaves["w13"], leaves["w2"]).backward(p["dy"])
    key = "tokens=5,experts=2,hidden=32,ffn=16,skew=0"
    assert looked_up == [(name, key) for name in ("expert_up_fwd", "expert_down_fwd", "expert_down_bwd_dx",
                                                  "expert_up_bwd_dx", "expert_down_bwd_dw", "expert_up_bwd_dw")]


def test_flops_and_bytes_count_each_tensor_once():
    shape = {"tokens": 3072, "experts": 32, "hidden": 4096, "ffn": 2048, "skew": 0}
    t, e, d, f = 3072, 32, 4096, 2048
    up = registry.get("expert_up_fwd")
    assert up.flops(shape) == 2 * t * d * 2 * f
    assert up.bytes_moved(shape) == 2 * (t * d + e * 2 * f * d + t * f + t * 2 * f) + 4 * (e + 1)
    down_dw = registry.get("expert_down_bwd_dw")
    assert down_dw.flops(shape) == 2 * t * d * f
    assert down_dw.bytes_moved(shape) == 2 * (t * d + t * f) + 4 * (t + e + 1) + 2 * 4 * e * d * f


def test_bad_arguments_are_rejected():
    p = _problem([2, 3], 32, 16, seed=0)
    args = (p["x"], p["offsets"], p["weights"], p["w13"], p["w2"])
    with pytest.raises(ValueError):
        expert_mlp(p["x"].float(), *args[1:])
    with pytest.raises(ValueError):
        expert_mlp(*args[:4], p["w2"][:, :, :8])
    with pytest.raises(ValueError):
        expert_mlp(*args, grad_buffers=(torch.zeros_like(p["w13"], dtype=torch.float16), torch.zeros_like(p["w2"])))


@pytest.mark.parametrize(("tokens", "experts"), [(24576, 32), (24576, 256), (5, 8), (37, 5)])
def test_expert_loads_are_balanced_or_skewed_as_asked(tokens, experts):
    gen = torch.Generator().manual_seed(3)
    balanced = grouped_gemm.expert_loads(tokens, experts, 0, gen)
    assert balanced.sum() == tokens and balanced.max() - balanced.min() <= 1
    skewed = grouped_gemm.expert_loads(tokens, experts, 50, gen)
    assert skewed.sum() == tokens
    ranked = skewed.sort(descending=True).values.double()
    # i-th busiest share ~ i^-0.5, up to the one row of integer rounding
    expected = torch.arange(1, experts + 1, dtype=torch.float64) ** -0.5
    expected = expected / expected.sum() * tokens
    assert (ranked - expected).abs().max() <= 1
    again = grouped_gemm.expert_loads(tokens, experts, 50, torch.Generator().manual_seed(3))
    assert torch.equal(again.sort().values, skewed.sort().values)


_COMPILE_FOR_SM_90 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.grouped_gemm import _grouped_gemm_kernel as kernel

kmajor, epilogue = sys.argv[1] == "kmajor", sys.argv[2]
b_block = "[1,128,64]" if kmajor else "[1,64,128]"
signature = {"a_ref": "tensordesc<bf16[128,64]>", "b_ref": f"tensordesc<bf16{b_block}>", "table_ptr": "*i32",
             "out_ptr": "*bf16", "scale_ptr": "*fp32", "gu_ptr": "*bf16", "partial_ptr": "*fp32", "tiles_m": "i32",
             "N": "i32", "K": "i32", "stride_be": "i32", "stride_bk": "i32", "stride_bn": "i32"}
constexprs = {"EPILOGUE": epilogue, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "TMA": True,
              "B_KMAJOR": kmajor, "UPCAST": False, "WARP_SPECIALIZE": False, "EPILOGUE_HALVES": sys.argv[3] == "halves"}
source = ASTSource(fn=kernel, signature={**signature, **{c: "constexpr" for c in constexprs}},
                   constexprs={(kernel.arg_names.index(c),): v for c, v in constexprs.items()})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
print("tma loads:", compiled.asm["ptx"].count("cp.async.bulk.tensor"))
"""


_COMPILE_WGRAD_FOR_SM_90 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.grouped_gemm import _grouped_wgrad_kernel as kernel

signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "offsets_ptr": "*i32", "scale_ptr": "*fp32", "grad_in_ptr": "*fp32",
             "grad_out_ptr": "*fp32", "M": "i32", "N": "i32"}
constexprs = {"HAS_SCALE": True, "ACCUMULATE": True, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
              "UPCAST": False, "TMA": True, "PREFETCH_GRAD": sys.argv[1] == "prefetch"}
source = ASTSource(fn=kernel, signature={**signature, **{c: "constexpr" for c in constexprs}},
                   constexprs={(kernel.arg_names.index(c),): v for c, v in constexprs.items()})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
ptx = compiled.asm["ptx"]
loop = ptx.index("wgmma.mma_async")  # the reduction's first MMA
print("tma loads:", ptx.count("cp.async.bulk.tensor"), "fp32 loads before the MMAs:", ptx[:loop].count("ld.global"))
"""


@pytest.mark.parametrize("prefetch", ["prefetch", "after"])
def test_weight_gradient_tma_path_compiles_for_sm_90(prefetch):
    """The weight-gradient kernel's descriptors are built on the device, per expert: compile that path for
    Hopper with the wheel's own compiler and ptxas (a child process without TRITON_INTERPRET). With
    PREFETCH_GRAD the gradient tile's loads come before the reduction's MMAs, as the compiler leaves them."""
    import re

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_WGRAD_FOR_SM_90, prefetch], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {name.strip(): int(value) for name, value in re.findall(r"([A-Za-z0-9 ]+): (\d+)", done.stdout)}
    assert figures["tma loads"] > 0  # the token tiles come through TMA
    # a 128 x 128 fp32 tile over 256 threads: 64 values a thread, in loads of up to four; without the
    # prefetch only the expert's bounds are read before the MMAs
    tile_loads = figures["fp32 loads before the MMAs"] >= 128 * 128 // 256 // 4
    assert tile_loads == (prefetch == "prefetch")


@pytest.mark.parametrize(("kmajor", "epilogue", "halves"),
                         [("kmajor", "swiglu", "whole"), ("nmajor", "swiglu_bwd", "whole"),
                          ("nmajor", "swiglu_bwd", "halves")], ids=["w13-up", "w2-down-dx", "w2-down-dx-halves"])
def test_tma_path_compiles_for_sm_90(kmajor, epilogue, halves):
    """The interpreter runs code that Triton's compiler may reject (it once did: a constexpr branch that
    returned early); compile the TMA path for Hopper with the wheel's own compiler and ptxas, outside
    the interpreter (a child process without TRITON_INTERPRET)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM_90, kmajor, epilogue, halves], env=env,
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    loads = int(done.stdout.split("tma loads:")[1])
    assert loads > 0  # the tiles come through TMA
