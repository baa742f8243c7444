"""mHC glue, collapse and expand: parity with the eager reference, tuned configs, spaces and lookup."""

from __future__ import annotations


import pytest
import torch

from kernels import mhc, registry
from kernels.arch import kernel_device
from kernels.mhc import (
    mhc_collapse,
    mhc_collapse_reference,
    mhc_enter,
    mhc_enter_reference,
    mhc_expand,
    mhc_expand_reference,
    mhc_glue,
    mhc_glue_reference,
)
from kernels.rmsnorm import rms_norm, rms_norm_reference
from kernels.sinkhorn import sinkhorn, sinkhorn_reference
from search_spaces import load_space
from tests.kernel_checks import (assert_config_matches_reference, assert_defaults_fit_space, assert_seeded_random_inputs, spy_on_resolve)

DEVICE = kernel_device()
KERNELS = [f"mhc_{op}_{d}" for op in ("glue", "collapse", "expand") for d in ("fwd", "bwd")]
# fp32 results: the kernels sum in another order, and the glue's matmul splits fp32 operands
# into bf16 high and low parts (2^-16 relative; the interpreter truncates rather than rounds).
FP32_TOL = {"atol": 1e-4, "rtol": 1e-4}
# bf16 results: one rounding of the fp32 value (the interpreter truncates: up to 2^-7 relative).
BF16_TOL = {"atol": 1e-2, "rtol": 1e-2}


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return BF16_TOL if dtype == torch.bfloat16 else FP32_TOL


def _close(actual: torch.Tensor, expected: torch.Tensor, **tol: float) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def _leaves(*tensors: torch.Tensor, upcast: bool = False) -> list[torch.Tensor]:
    """Fresh leaves requiring grad: copies for the kernels, fp32 copies for the reference."""
    return [(t.float() if upcast else t.clone()).requires_grad_() for t in tensors]


def _glue_problem(lead: tuple[int, ...], hidden: int, dtype: torch.dtype, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    width = 4 * hidden
    h = torch.randn(*lead, 4, hidden, generator=gen).to(DEVICE, dtype)
    fn = (torch.randn(24, width, generator=gen) / width**0.5).to(DEVICE)
    base = (0.5 * torch.randn(24, generator=gen)).to(DEVICE)
    scale = (1 + 0.25 * torch.randn(3, generator=gen)).to(DEVICE)
    grads = [torch.randn(*lead, *tail, generator=gen).to(DEVICE) for tail in ((4,), (4,), (4, 4))]
    return (h, fn, base, scale), grads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("lead", "hidden"),
    [
        ((37,), 96),  # tokens not a multiple of BLOCK_N, 4D = 384 not a multiple of BLOCK_K
        ((2, 5), 40),  # leading batch dims, 4D = 160
        ((1,), 7),  # one token, 4D = 28 narrower than one chunk
        ((64 * 65 + 3,), 2),  # 66 first-pass token blocks: the closing sums take two ragged steps
    ],
)
def test_glue_forward_and_gradients_match_eager(lead, hidden, dtype):
    primals, grads = _glue_problem(lead, hidden, dtype)
    ours = _leaves(*primals)
    outputs = mhc_glue(*ours)
    torch.autograd.backward(outputs, grads)
    theirs = _leaves(*primals, upcast=True)
    expected = mhc_glue_reference(*theirs)
    torch.autograd.backward(expected, grads)

    for out, ref, tail in zip(outputs, expected, ((4,), (4,), (4, 4))):
        assert out.shape == (*lead, *tail) and out.dtype == torch.float32
        _close(out, ref, **FP32_TOL)
    # pre is a gate plus eps, post twice a gate.
    assert bool((outputs[0] > 0).all() and (outputs[0] <= 1 + 1e-6).all() and (outputs[1] < 2).all())
    dh, *param_grads = (leaf.grad for leaf in ours)
    assert dh.dtype == dtype
    _close(dh, theirs[0].grad, **_tol(dtype))
    for grad, ref in zip(param_grads, (leaf.grad for leaf in theirs[1:])):
        assert grad.dtype == torch.float32 and grad.shape == ref.shape
        # Sums over tokens of terms of about unit size: fp32 noise grows with the sum.
        _close(grad, ref, atol=1e-4 * lead[-1], rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("lead", "hidden"),
    [
        ((37,), 96),  # tokens not a multiple of BLOCK_N or BLOCK_T, 4D = 384 not a multiple of BLOCK_K
        ((2, 5), 40),  # leading batch dims; D = 40 splits chunks of 64 across two streams
        ((1,), 7),  # one token, 4D = 28 narrower than one chunk
    ],
)
def test_entry_is_the_glue_then_the_collapse_in_one_op_forward_and_backward(lead, hidden, dtype):
    (h, fn, base, scale), (_, grad_post, grad_comb) = _glue_problem(lead, hidden, dtype)
    gen = torch.Generator().manual_seed(2)
    grad_u = torch.randn(*lead, hidden, generator=gen).to(DEVICE, dtype)
    grad_h = torch.randn(*lead, 4, hidden, generator=gen).to(DEVICE, dtype)  # what the expand hands back
    ours, theirs = _leaves(h, fn, base, scale), _leaves(h, fn, base, scale, upcast=True)
    outputs = mhc_enter(*ours)
    torch.autograd.backward(outputs, (grad_u, grad_post, grad_comb, grad_h))
    expected = mhc_enter_reference(*theirs)
    torch.autograd.backward(expected, (grad_u.float(), grad_post, grad_comb, grad_h.float()))

    u, post, comb, h_through = outputs
    assert u.shape == (*lead, hidden) and u.dtype == dtype
    assert post.shape == (*lead, 4) and comb.shape == (*lead, 4, 4)
    assert h_through.dtype == dtype and torch.equal(h_through, h)
    _close(u, expected[0], **_tol(dtype))
    _close(post, expected[1], **FP32_TOL)
    _close(comb, expected[2], **FP32_TOL)
    # dh: the glue's part, the collapse's pre_j du and the expand's, summed inside the glue backward
    assert ours[0].grad.dtype == dtype
    _close(ours[0].grad, theirs[0].grad, **_tol(dtype))
    for grad, ref in zip((leaf.grad for leaf in ours[1:]), (leaf.grad for leaf in theirs[1:])):
        assert grad.dtype == torch.float32 and grad.shape == ref.shape
        _close(grad, ref, atol=1e-4 * lead[-1], rtol=1e-4)


def test_fn_split_is_its_bf16_rounding_and_the_remainder():
    """The glue forward's one-launch split of fn: a high part within a bf16 step of fn and a low
    part that brings the pair within 2^-15 (the interpreter truncates where the GPU rounds), over
    an element count (24 x 4000) that is not a multiple of the launch's block."""
    gen = torch.Generator().manual_seed(5)
    fn = (torch.randn(24, 4000, generator=gen) * torch.logspace(-3, 3, 4000)).to(DEVICE)
    parts = mhc._split_fn(fn, compile_only=False)
    assert parts.shape == (2, 24, 4000) and parts.dtype == torch.bfloat16
    high, low = parts.float()
    assert bool(((high - fn).abs() <= fn.abs() * 2**-7).all())
    assert bool(((high + low - fn).abs() <= fn.abs() * 2**-15).all())
    assert bool((low.abs() <= fn.abs() * 2**-7).all())


def test_fn_split_zeroes_the_fused_gates_arrival_counters():
    """The counters a FUSED_GATES forward counts its split programs' arrivals in start at zero on every
    call: the split launch, which runs first, clears them (here more of them than fn has elements)."""
    fn = torch.randn(24, 8).to(DEVICE)
    arrivals = torch.full((5000,), 7, dtype=torch.int32, device=DEVICE)
    mhc._split_fn(fn, compile_only=False, arrivals=arrivals)
    assert int(arrivals.abs().sum()) == 0


def _streams_problem(lead: tuple[int, ...], hidden: int, dtype: torch.dtype, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, 4, hidden, generator=gen).to(DEVICE, dtype)
    f = torch.randn(*lead, hidden, generator=gen).to(DEVICE, dtype)
    pre = (torch.sigmoid(torch.randn(*lead, 4, generator=gen)) + 1e-6).to(DEVICE)
    post = (2 * torch.sigmoid(torch.randn(*lead, 4, generator=gen))).to(DEVICE)
    comb = torch.softmax(torch.randn(*lead, 4, 4, generator=gen), -1).to(DEVICE)
    grad_u = torch.randn(*lead, hidden, generator=gen).to(DEVICE, dtype)
    grad_h = torch.randn(*lead, 4, hidden, generator=gen).to(DEVICE, dtype)
    return h, f, pre, post, comb, grad_u, grad_h


STREAM_SHAPES = [
    ((37,), 96),  # tokens not a multiple of BLOCK_T, hidden not a power of two
    ((2, 3), 40),  # leading batch dims
    ((1,), 1000),  # one token, D ragged in every chunk size up to 1024
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("lead", "hidden"), STREAM_SHAPES)
def test_collapse_forward_and_gradients_match_eager(lead, hidden, dtype):
    h, _, pre, _, _, grad_u, _ = _streams_problem(lead, hidden, dtype)
    ours, theirs = _leaves(h, pre), _leaves(h, pre, upcast=True)
    u = mhc_collapse(*ours)
    u.backward(grad_u)
    u_ref = mhc_collapse_reference(*theirs)
    u_ref.backward(grad_u.float())

    assert u.shape == (*lead, hidden) and u.dtype == dtype
    _close(u, u_ref, **_tol(dtype))
    assert ours[0].grad.dtype == dtype
    _close(ours[0].grad, theirs[0].grad, **_tol(dtype))
    # dpre sums D products of unit-size values.
    _close(ours[1].grad, theirs[1].grad, atol=1e-5 * hidden, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(("lead", "hidden"), STREAM_SHAPES)
def test_expand_forward_and_gradients_match_eager(lead, hidden, dtype):
    h, f, _, post, comb, _, grad_h = _streams_problem(lead, hidden, dtype)
    ours, theirs = _leaves(f, h, post, comb), _leaves(f, h, post, comb, upcast=True)
    out = mhc_expand(*ours)
    out.backward(grad_h)
    out_ref = mhc_expand_reference(*theirs)
    out_ref.backward(grad_h.float())

    assert out.shape == h.shape and out.dtype == dtype
    _close(out, out_ref, **_tol(dtype))
    for ours_leaf, ref_leaf in zip(ours[:2], theirs[:2]):  # df, dh
        assert ours_leaf.grad.dtype == dtype
        _close(ours_leaf.grad, ref_leaf.grad, **_tol(dtype))
    for ours_leaf, ref_leaf in zip(ours[2:], theirs[2:]):  # dpost, dcomb
        assert ours_leaf.grad.dtype == torch.float32
        _close(ours_leaf.grad, ref_leaf.grad, atol=1e-5 * hidden, rtol=1e-4)


def test_sublayer_round_trip_matches_eager():
    """glue -> Sinkhorn -> collapse -> RMSNorm -> expand, as a V4 block wires them (fp32)."""
    (h, fn, base, scale), _ = _glue_problem((9,), 24, torch.float32, seed=5)
    weight = torch.linspace(0.5, 1.5, 24, device=DEVICE)

    def sublayer(glue, project, collapse, norm, expand, leaves):
        h, fn, base, scale = leaves
        pre, post, comb = glue(h, fn, base, scale)
        u = collapse(h, pre)
        return expand(norm(u, weight), h, post, project(comb))

    ours, theirs = _leaves(h, fn, base, scale), _leaves(h, fn, base, scale)
    out = sublayer(mhc_glue, sinkhorn, mhc_collapse, rms_norm, mhc_expand, ours)
    out_ref = sublayer(mhc_glue_reference, sinkhorn_reference, mhc_collapse_reference, rms_norm_reference,
                       mhc_expand_reference, theirs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    out.backward(grad)
    out_ref.backward(grad)
    # The gates carry the split matmul's ~2^-15 relative error (fp32 h, interpreter truncation);
    # the chain keeps every result within 5e-5 of its largest magnitude: bound it normwise.
    for actual, expected in zip((out, *(leaf.grad for leaf in ours)), (out_ref, *(leaf.grad for leaf in theirs))):
        _close(actual, expected, atol=2e-4 * float(expected.detach().abs().max()), rtol=0)


_GLUE_FWD = {"FUSED_GATES": 0, "GATES_BLOCK_N": 0, "num_warps": 4, "num_stages": 3}
CONFIGS = {
    "mhc_glue_fwd": [
        {**_GLUE_FWD, "BLOCK_N": 16, "SPLIT_K": 1, "BLOCK_K": 64},  # ragged chunks of 4D = 160
        {**_GLUE_FWD, "BLOCK_N": 32, "SPLIT_K": 1, "BLOCK_K": 32},
        # a token tile wider than the 37 tokens (the space prunes wider ones)
        {**_GLUE_FWD, "BLOCK_N": 64, "SPLIT_K": 1, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4},
        {**_GLUE_FWD, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 4},  # 4D in 4 ragged splits
        # splits past 4D's end (4D = 384 at 37 tokens: 64-column splits, the last two empty)
        {**_GLUE_FWD, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 8},
        # the gates launch over 16-token blocks, narrower than the projection's 32 (37 tokens: 3 ragged ones)
        {**_GLUE_FWD, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 4, "GATES_BLOCK_N": 16},
        # the gates by each token block's last split program to arrive, not a third launch
        {**_GLUE_FWD, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 4, "FUSED_GATES": 1},
        {**_GLUE_FWD, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 8, "FUSED_GATES": 1},
    ],
    "mhc_glue_bwd": [
        {"BLOCK_N": 16, "BLOCK_K": 64, "SLABS": 1, "DFN_TRANSPOSED": 0, "TMA": 0, "num_warps": 4, "num_stages": 1},  # one slab
        # ragged last slab
        {"BLOCK_N": 16, "BLOCK_K": 128, "SLABS": 2, "DFN_TRANSPOSED": 0, "TMA": 0, "num_warps": 4, "num_stages": 2},
        # more slabs than blocks (8 for one 64-token block of 37 tokens); dfn accumulated transposed
        {"BLOCK_N": 64, "BLOCK_K": 128, "SLABS": 8, "DFN_TRANSPOSED": 1, "TMA": 0, "num_warps": 8, "num_stages": 2},
        # by TMA descriptors: token tiles past the tokens and 4D chunks past 4D zero-filled and clipped
        {"BLOCK_N": 16, "BLOCK_K": 64, "SLABS": 2, "DFN_TRANSPOSED": 0, "TMA": 1, "num_warps": 4, "num_stages": 2},
        {"BLOCK_N": 64, "BLOCK_K": 128, "SLABS": 1, "DFN_TRANSPOSED": 1, "TMA": 1, "num_warps": 4, "num_stages": 1},
        # descriptors built by each program on the device
        {"BLOCK_N": 16, "BLOCK_K": 64, "SLABS": 2, "DFN_TRANSPOSED": 0, "TMA": 2, "num_warps": 4, "num_stages": 2},
        {"BLOCK_N": 64, "BLOCK_K": 128, "SLABS": 1, "DFN_TRANSPOSED": 1, "TMA": 2, "num_warps": 4, "num_stages": 1},
    ],
    **{
        name: [
            {"BLOCK_T": 2, "BLOCK_D": 32, "num_warps": 2, "num_stages": 1},  # D walked in ragged chunks
            {"BLOCK_T": 4, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2},
            {"BLOCK_T": 8, "BLOCK_D": 256, "num_warps": 8, "num_stages": 2},  # one chunk wider than D
        ]
        for name in KERNELS[2:]
    },
}



@pytest.mark.parametrize(("name", "config"), [(n, c) for n, configs in CONFIGS.items() for c in configs])
def test_tuned_configs_match_reference(name, config):
    assert_config_matches_reference(registry.get(name), config, seed=3)


def test_launches_resolve_their_own_kernel_at_tokens_and_hidden(monkeypatch):
    asked = spy_on_resolve(monkeypatch, mhc)
    h, f, pre, post, comb, _, _ = _streams_problem((3, 2), 40, torch.bfloat16)
    (_, fn, base, scale), _ = _glue_problem((3, 2), 40, torch.bfloat16)
    h, fn, base, scale, f, pre, post, comb = _leaves(h, fn, base, scale, f, pre, post, comb)
    loss = sum(t.float().sum() for t in mhc_glue(h, fn, base, scale))
    loss = loss + mhc_collapse(h, pre).float().sum() + mhc_expand(f, h, post, comb).float().sum()
    loss.backward()
    assert sorted(asked, key=lambda a: a[0]) == [(name, "tokens=6,hidden=40") for name in sorted(KERNELS)]


def test_bad_shapes_and_dtypes_are_rejected():
    (h, fn, base, scale), _ = _glue_problem((3,), 8, torch.bfloat16)
    h3 = torch.zeros(3, 3, 8, device=DEVICE, dtype=torch.bfloat16)
    pre = torch.ones(3, 4, device=DEVICE)
    bad_calls = [
        lambda: mhc_glue(h3, fn, base, scale),  # three streams
        lambda: mhc_glue(h.half(), fn, base, scale),
        lambda: mhc_glue(h, fn[:, :-1], base, scale),
        lambda: mhc_glue(h, fn, base.double(), scale),
        lambda: mhc_collapse(h, pre.bfloat16()),
        lambda: mhc_collapse(h, pre[:2]),
        lambda: mhc_expand(torch.zeros(3, 8, device=DEVICE), h, pre, pre[..., None].expand(3, 4, 4)),  # f dtype
        lambda: mhc_expand(h[:, 0], h, pre, pre),  # comb not [..., 4, 4]
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
    assert 40 <= load_space(name).size("sm_90") <= 1000  # TPE samples the larger ones (bench/sweep_specs.py)
    assert_defaults_fit_space(name, grid_points=True)


def test_bytes_moved_counts_each_tensor_once():
    tokens, hidden = 4096, 7168
    shape = {"tokens": tokens, "hidden": hidden}
    residual, row = 2 * tokens * 4 * hidden, 2 * tokens * hidden  # bf16 [tokens, 4, D] and [tokens, D]
    fn = 4 * 24 * 4 * hidden + 4 * 27  # fp32 fn, base, scale
    assert registry.get("mhc_glue_fwd").bytes_moved(shape) == residual + fn + 4 * 24 * tokens
    assert registry.get("mhc_glue_bwd").bytes_moved(shape) == 2 * (residual + fn) + 4 * (24 + 25) * tokens
    assert registry.get("mhc_collapse_fwd").bytes_moved(shape) == residual + row + 4 * 4 * tokens
    assert registry.get("mhc_collapse_bwd").bytes_moved(shape) == 2 * residual + row + 4 * 8 * tokens
    assert registry.get("mhc_expand_fwd").bytes_moved(shape) == 2 * residual + row + 4 * 20 * tokens
    assert registry.get("mhc_expand_bwd").bytes_moved(shape) == 3 * residual + 2 * row + 4 * 40 * tokens


def test_glue_backward_tma_forms_stage_the_same_shared_memory():
    """Host-encoded (TMA 1) and device-built (TMA 2) descriptors stage the same dh tile: a config at
    the sm_90 budget with one fits with the other (TMA is a mode, not a count)."""
    space = load_space("mhc_glue_bwd")
    config = {"BLOCK_N": 64, "BLOCK_K": 256, "SLABS": 2, "DFN_TRANSPOSED": 1, "num_warps": 8, "num_stages": 1}
    shape = {"tokens": 4096, "hidden": 4096}
    assert [space.violation({**config, "TMA": mode}, shape, "sm_90") for mode in (1, 2)] == [None, None]
    assert "shared memory" in space.violation({**config, "TMA": 2, "num_stages": 2}, shape, "sm_90")
