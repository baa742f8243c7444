"""The sparse-attention forward's gather, three ways, at the Flash CSA shape (seq 4,096) on one GPU.

* ``two_bases``: the project kernel; each entry row's pointer is picked from kv or kv_compressed.
* ``table_masked``: commit 9bdc103's kernel (reverted): one entry table (kv's rows, then the
  compressed rows) and a masked load; given as the path of that commit's module, written by
  ``git show 9bdc103:kernels/sparse_attention.py > PATH``.
* ``table_unmasked``: the same table, masked rows clamped to row 0 and loaded anyway (their
  logits are masked), so the gather has no load predicate (``fwd_unmasked`` below).

Per launch config: median ms (``do_bench``, 50 warm-up), TFLOP/s, registers, spills, shared
memory, and the largest difference from the project kernel's output.

Usage (on a GPU): python bench/attention_gather_variants.py TABLE_MODULE_PATH OUT_JSON
"""
import importlib.util
import json
import sys

import torch
import triton
import triton.language as tl

from kernels import sparse_attention as sa
from kernels.sparse_attention import _D, _LN2_C, _LOG2E_C, _attend_tile, _entry_count, _head_offsets

@triton.jit
def fwd_unmasked(q_ptr, table_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr, S, H, SC, TOPK, WINDOW, kv_rows, qk_scale,
               RATIO: tl.constexpr, BLOCK_H: tl.constexpr, TILE_K: tl.constexpr, UPCAST: tl.constexpr):
    s = tl.program_id(0)
    b = tl.program_id(2)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offsets = _head_offsets(b, s, S, H, heads)
    q = tl.load(q_ptr + offsets)
    m = tl.load(sink_ptr + heads) * _LOG2E_C
    denom = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, _D], dtype=tl.float32)
    n_pos = _entry_count(s, TOPK, WINDOW, RATIO)
    n_win = tl.minimum(s + 1, WINDOW)
    idx_row = idx_ptr + (b * S + s).to(tl.int64) * TOPK
    for p0 in range(0, n_pos, TILE_K):
        pos = p0 + tl.arange(0, TILE_K)
        c = pos - n_win
        t = tl.load(idx_row + c, mask=(c >= 0) & (pos < n_pos), other=-1)
        in_win = pos < n_win
        row = tl.where(in_win, (b * S + s + 1 - n_win + pos).to(tl.int64), kv_rows + (b * SC + t).to(tl.int64))
        valid = (in_win | (t >= 0)) & (pos < n_pos)
        e = tl.load(table_ptr + tl.where(valid, row, 0)[:, None] * _D + tl.arange(0, _D)[None, :])
        m, denom, acc = _attend_tile(q, e, valid, m, denom, acc, qk_scale)
    tl.store(o_ptr + offsets, (acc / denom[:, None]).to(o_ptr.dtype.element_ty))
    tl.store(lse_ptr + (b * S + s).to(tl.int64) * H + heads, (m + tl.log2(denom)) * _LN2_C)

def _load_module(path: str):
    spec = importlib.util.spec_from_file_location("entry_table_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(table_module: str, out: str) -> None:
    entry_table = _load_module(table_module)
    shape = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 4, "topk": 512, "window": 128}
    dev = torch.device("cuda")
    inp = sa._make_fwd_inputs(shape, dev, 0)
    q, kv, kvc, idx, sink = inp["q"], inp["kv"], inp["kv_compressed"], inp["indices"], inp["sink"]
    ref_o, _ = sa._forward(q, kv, kvc, idx, sink, 4, 128, {"BLOCK_H": 64, "TILE_K": 32, "num_warps": 8, "num_stages": 1})
    table = entry_table._entry_table(kv, kvc)
    S, H, SC, TOPK = 4096, 64, 1024, 512
    rows = []
    flops = sa._flops_fwd(shape)
    for bh, tk, nw, ns in [(64, 64, 8, 1), (64, 32, 8, 1), (64, 32, 8, 2), (64, 64, 8, 2), (64, 32, 8, 3), (64, 16, 8, 3), (64, 16, 8, 4)]:
        o = torch.empty_like(q); lse = torch.empty(1, S, H, device=dev)
        grid = (S, H // bh, 1)
        cands = {
            "two_bases": lambda: sa._sparse_attn_fwd_kernel[grid](q, kv, kvc, idx, sink, o, lse, S, H, SC, TOPK, 128, sa.SOFTMAX_SCALE * sa._LOG2E, RATIO=4, BLOCK_H=bh, TILE_K=tk, UPCAST=False, num_warps=nw, num_stages=ns),
            "table_masked": lambda: entry_table._sparse_attn_fwd_kernel[grid](q, table, idx, sink, o, lse, S, H, SC, TOPK, 128, S, sa.SOFTMAX_SCALE * sa._LOG2E, RATIO=4, BLOCK_H=bh, TILE_K=tk, UPCAST=False, num_warps=nw, num_stages=ns),
            "table_unmasked": lambda: fwd_unmasked[grid](q, table, idx, sink, o, lse, S, H, SC, TOPK, 128, S, sa.SOFTMAX_SCALE * sa._LOG2E, RATIO=4, BLOCK_H=bh, TILE_K=tk, UPCAST=False, num_warps=nw, num_stages=ns),
        }
        for name, fn in cands.items():
            try:
                k = fn(); torch.cuda.synchronize()
                err = (o.float() - ref_o.float()).abs().max().item()
                ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
                k._init_handles()  # loads the binary, so that n_regs and n_spills are known
                row = {"variant": name, "config": [bh, tk, nw, ns], "ms": ms, "tflops": flops / ms / 1e9, "max_abs_diff_from_project_kernel": err,
                       "n_regs": k.n_regs, "n_spills": k.n_spills, "shared": k.metadata.shared}
            except Exception as exc:
                row = {"variant": name, "config": [bh, tk, nw, ns], "error": repr(exc)[:300]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
