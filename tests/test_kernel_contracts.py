"""The public kernel functions keep the input contracts their docstrings state: each input outside
one is refused with a ValueError naming the argument (not computed into a silently wrong result),
and well-formed edge inputs (ragged, padded, strided, empty) agree with the eager references."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from kernels import contracts
from kernels.arch import kernel_device
from kernels.compressor import compressor_pool, compressor_pool_reference
from kernels.grouped_gemm import expert_mlp, expert_mlp_reference
from kernels.indexer import indexer_topk, indexer_topk_reference
from kernels.mhc import mhc_collapse, mhc_enter, mhc_expand, mhc_glue
from kernels.moe_combine import moe_combine
from kernels.rmsnorm import rms_norm, rms_norm_reference
from kernels.rope import rope, rope_reference
from kernels.router import route, route_reference
from kernels.sinkhorn import sinkhorn, sinkhorn_reference
from kernels.sparse_attention import sparse_attention, sparse_attention_reference
from v4 import attention_ops

DEVICE = kernel_device()


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=DEVICE).to(dtype)


def _ints(*values: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _attention(indices: torch.Tensor, seq: int = 8) -> Callable[[], torch.Tensor]:
    """A CSA call at ``seq`` (``seq // 4`` compressed rows) with ``indices [1, seq, k]``."""
    return lambda: sparse_attention(_randn(1, seq, 2, 512, dtype=torch.bfloat16), _randn(1, seq, 512, dtype=torch.bfloat16),
                                    _randn(2), 4, _randn(1, seq // 4, 512, dtype=torch.bfloat16), indices, window=4)


def _expert_mlp(offsets: torch.Tensor) -> Callable[[], torch.Tensor]:
    """An expert_mlp call over 6 rows and 2 experts with ``offsets``."""
    return lambda: expert_mlp(_randn(6, 16, dtype=torch.bfloat16), offsets, _randn(6),
                              _randn(2, 32, 16, dtype=torch.bfloat16), _randn(2, 16, 16, dtype=torch.bfloat16))


def _hash_route(token_ids: torch.Tensor, tid2eid: torch.Tensor) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Hash routing of 3 tokens over 8 experts, top-2."""
    return lambda: route(_randn(3, 8), None, 2, 1.5, token_ids, tid2eid)


_TABLE = _ints(0, 1, 2, 3, 4, 5, dtype=torch.int64).view(3, 2)  # 3 token ids, 2 experts each
_H = _randn(2, 4, 8)  # mHC residual [tokens, 4 streams, D]

# (what is wrong, the call, the start of the message: the argument it names)
REFUSED = [
    ("rms_norm integer x", lambda: rms_norm(_ints(1, 2, 3)), "x must be a float tensor"),
    ("rms_norm 0-d x", lambda: rms_norm(_randn()), "x must be a float tensor"),
    ("rms_norm weight width", lambda: rms_norm(_randn(2, 8), _randn(7)), "weight must be [8]"),
    ("rms_norm weight device", lambda: rms_norm(_randn(2, 8), torch.ones(8, device="meta")), "weight is on meta"),
    ("sinkhorn 4x3 logits", lambda: sinkhorn(_randn(2, 4, 3)), "logits must be a float [..., 4, 4]"),
    ("sinkhorn iters not an int", lambda: sinkhorn(_randn(2, 4, 4), 2.5), "iters must be an int >= 1"),
    ("mhc_glue fn dtype", lambda: mhc_glue(_H, _randn(24, 32, dtype=torch.bfloat16), _randn(24), _randn(3)),
     "fn must be [24, 32] float32"),
    ("mhc_enter scale shape", lambda: mhc_enter(_H, _randn(24, 32), _randn(24), _randn(2)), "scale must be [3] float32"),
    ("mhc_enter 3-stream h", lambda: mhc_enter(_randn(2, 3, 8), _randn(24, 24), _randn(24), _randn(3)),
     "h must be [..., 4, D]"),
    ("mhc_collapse pre shape", lambda: mhc_collapse(_H, _randn(2, 3)), "pre must be [2, 4] float32"),
    ("mhc_expand f dtype", lambda: mhc_expand(_randn(2, 8, dtype=torch.bfloat16), _H, _randn(2, 4), _randn(2, 4, 4)),
     "f must be [2, 8]"),
    ("rope head width", lambda: rope(_randn(3, 2, 256), _ints(0, 1, 2)), "x must be a float tensor"),
    ("rope float positions", lambda: rope(_randn(3, 2, 512), _randn(3)), "pos must be integer"),
    ("route topk past the experts", lambda: route(_randn(3, 8), topk=9), "topk must be in [1, 8]"),
    ("route token id past the table", _hash_route(_ints(0, 3, 1), _TABLE), "token_ids must hold rows of tid2eid in [0, 2]"),
    ("route negative token id", _hash_route(_ints(0, -1, 1), _TABLE), "token_ids must hold rows of tid2eid"),
    ("route expert id past the experts", _hash_route(_ints(0, 1, 2), _TABLE + 3), "tid2eid must hold expert ids in [0, 7]"),
    ("route float table", _hash_route(_ints(0, 1, 2), _TABLE.float()), "tid2eid must be int32 or int64"),
    ("expert_mlp offsets past the rows", _expert_mlp(_ints(0, 4, 8)), "expert_offsets must rise from 0 to the 6 rows"),
    ("expert_mlp offsets short of the rows", _expert_mlp(_ints(0, 4, 5)), "expert_offsets must rise"),
    ("expert_mlp offsets not from 0", _expert_mlp(_ints(1, 4, 6)), "expert_offsets must rise"),
    ("expert_mlp offsets decreasing", _expert_mlp(_ints(0, 5, 4)), "expert_offsets must rise"),
    ("expert_mlp float offsets", _expert_mlp(_ints(0, 3, 6).float()), "expert_offsets must be int32 or int64"),
    ("moe_combine topk not dividing the rows", lambda: moe_combine(_randn(6, 4), _ints(0, 1, 2, 3, 4, 5), 4),
     "topk must be >= 1 and divide"),
    ("moe_combine order repeats a row", lambda: moe_combine(_randn(4, 4), _ints(0, 1, 1, 3), 2),
     "order must be a permutation"),
    ("moe_combine float order", lambda: moe_combine(_randn(4, 4), _ints(0, 1, 2, 3).float(), 2),
     "order must be int32 or int64"),
    ("moe_combine shared rows", lambda: moe_combine(_randn(4, 4), _ints(0, 1, 2, 3), 2, _randn(3, 4)),
     "shared must be [2, 4]"),
    ("sparse_attention pick past kv_compressed", _attention(torch.full((1, 8, 2), 2, dtype=torch.int32, device=DEVICE)),
     "indices must hold -1 (padding) or rows of kv_compressed in [-1, 1]"),
    ("sparse_attention padding below -1", _attention(torch.full((1, 8, 2), -2, dtype=torch.int32, device=DEVICE)),
     "indices must hold -1 (padding)"),
    ("sparse_attention int64 indices", _attention(torch.zeros(1, 8, 2, dtype=torch.int64, device=DEVICE)),
     "indices must be int32"),
    ("sparse_attention float window", lambda: sparse_attention(
        _randn(1, 8, 2, 512, dtype=torch.bfloat16), _randn(1, 8, 512, dtype=torch.bfloat16), _randn(2), 0, window=4.0),
     "window must be an int"),
    ("compressor ape width", lambda: compressor_pool(_randn(1, 8, 8), _randn(1, 8, 8), _randn(4, 6)), "ape must be"),
    ("indexer topk not an int", lambda: indexer_topk(_randn(1, 8, 2, 32, dtype=torch.bfloat16),
                                                     _randn(1, 2, 32, dtype=torch.bfloat16), _randn(1, 8, 2), 2.0),
     "ratio and topk must be positive ints"),
    ("eager attention pick past kv_compressed", lambda: attention_ops.sparse_attention(
        _randn(1, 8, 2, 16), _randn(1, 8, 16), _randn(2), 4, _randn(1, 2, 16),
        torch.full((1, 8, 2), 2, dtype=torch.int32, device=DEVICE), window=4), "indices must hold -1 (padding)"),
]


@pytest.mark.parametrize(("call", "message"), [pytest.param(c, m, id=i) for i, c, m in REFUSED])
def test_contract_violations_are_refused_by_name(call, message):
    with pytest.raises(ValueError) as refused:
        call()
    assert str(refused.value).startswith(message), str(refused.value)


def test_value_checks_run_on_the_cpu_and_on_a_device_under_the_debug_flag(monkeypatch):
    """Value checks need the tensor's contents: free on the CPU, a host sync on a device (a meta
    tensor stands in for one here), so there only with ``TUNER_CHECK_KERNEL_INPUTS=1``."""
    monkeypatch.delenv(contracts.CHECK_VALUES_ENV, raising=False)
    on_device = torch.zeros(2, device="meta")
    assert contracts.values_checked(torch.zeros(2)) and not contracts.values_checked(on_device)
    monkeypatch.setenv(contracts.CHECK_VALUES_ENV, "0")
    assert not contracts.values_checked(on_device)
    monkeypatch.setenv(contracts.CHECK_VALUES_ENV, "1")
    assert contracts.values_checked(on_device)


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 2e-2) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


def test_strided_inputs_match_the_references():
    """Transposed and sliced views (copied to contiguous by each function), fp16 beside an fp32 weight."""
    x = _randn(8, 6, dtype=torch.float16).t()  # [6, 8], strides (1, 6)
    weight = _randn(8)
    _close(rms_norm(x, weight), rms_norm_reference(x, weight))
    logits = _randn(4, 4, 3).permute(2, 0, 1)
    _close(sinkhorn(logits), sinkhorn_reference(logits), tol=1e-5)
    heads = _randn(2, 3, 512).transpose(0, 1)  # [3 tokens, 2 heads, 512]
    pos = _ints(0, 7, 4096, dtype=torch.int64)
    _close(rope(heads, pos), rope_reference(heads, pos), tol=1e-5)


def test_hash_routing_with_int32_ids_matches_the_reference():
    logits, token_ids = _randn(3, 8), _ints(2, 0, 2)
    table = _TABLE.int()
    for out, ref in zip(route(logits, None, 2, 1.5, token_ids, table), route_reference(logits, None, 2, 1.5, token_ids, table)):
        _close(out, ref, tol=1e-5)


def test_experts_without_rows_match_the_reference():
    """Ragged loads with the first and last experts empty, int64 offsets."""
    offsets = _ints(0, 0, 4, 6, 6, dtype=torch.int64)
    x, weights = _randn(6, 16, dtype=torch.bfloat16), _randn(6)
    w13, w2 = _randn(4, 32, 16, dtype=torch.bfloat16) / 4, _randn(4, 16, 16, dtype=torch.bfloat16) / 4
    _close(expert_mlp(x, offsets, weights, w13, w2), expert_mlp_reference(x, offsets, weights, w13, w2))


@pytest.mark.parametrize(("ratio", "seq"), [(4, 3), (128, 9)], ids=["csa", "hca"])
def test_attention_before_any_compressed_row_matches_the_reference(ratio, seq):
    """Sequences shorter than the ratio: no compressed row at all (CSA rows all padding)."""
    q, kv = _randn(1, seq, 2, 512, dtype=torch.bfloat16), _randn(1, seq, 512, dtype=torch.bfloat16)
    sink, kvc = _randn(2), _randn(1, 0, 512, dtype=torch.bfloat16)
    indices = torch.full((1, seq, 3), -1, dtype=torch.int32, device=DEVICE) if ratio == 4 else None
    _close(sparse_attention(q, kv, sink, ratio, kvc, indices, window=2),
           sparse_attention_reference(q, kv, sink, ratio, kvc, indices, window=2))


def test_pooling_with_a_partial_group_matches_the_reference():
    """S = 10 at ratio 4: two entries, the last two tokens pooled into none."""
    kv, score, ape = _randn(1, 10, 16), _randn(1, 10, 16), _randn(4, 16)
    out = compressor_pool(kv, score, ape)
    assert out.shape == (1, 2, 8)
    _close(out, compressor_pool_reference(kv, score, ape), tol=1e-5)


def test_indexer_pads_past_the_visible_entries_like_the_reference():
    """topk 5 at S = 9, ratio 4: queries see 0-2 entries, the rest of each row is -1 / -inf."""
    q = torch.randint(-2, 3, (1, 9, 2, 32), device=DEVICE).to(torch.bfloat16)
    k = torch.randint(-2, 3, (1, 2, 32), device=DEVICE).to(torch.bfloat16)
    w = torch.rand(1, 9, 2, device=DEVICE)
    indices, scores = indexer_topk(q, k, w, 5)
    ref_indices, ref_scores = indexer_topk_reference(q, k, w, 5)
    assert torch.equal(indices, ref_indices) and torch.equal(scores, ref_scores)
    assert (indices[0, :, 2:] == -1).all() and (indices[0, :3] == -1).all()
