"""How many counting passes the indexer's selection takes per score row, on the benchmark's integer
inputs and on Gaussian ones (V4's scale), at the Flash and Pro indexer shapes.

The selection (``kernels/indexer.py``) either builds the k-th largest uint32 key a bit at a time
from the top, stopping a row once exactly k keys lie at or above its threshold, or
(``SELECT_INTERP``) interpolates the counts between the ends of a bracket of keys. Either way its
time depends on the values. This replays both searches in torch, on the CPU, over the scores of
the eager reference; "key work" weighs each pass by the per-key reductions it takes (1 for a
count, 3 once the interpolating search also snaps its ends to the nearest keys).

Usage: python bench/indexer_select_passes.py OUT.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import registry
from kernels.indexer import (_BISECT_AFTER, _SNAP_AFTER, INDEX_DIM, INDEX_HEADS, INDEX_RATIO,
                             index_scores_reference)

KEY_BITS = 32
NO_KEY = 1 << KEY_BITS


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """The kernel's order-preserving uint32 keys as int64 (-0.0 joins +0.0), 0 where not visible."""
    visible = scores > -float("inf")
    x = torch.where(visible, scores, torch.zeros_like(scores))
    bits = x.view(torch.int32).long()
    keys = torch.where(bits < 0, ~bits & 0xFFFFFFFF, bits | (1 << 31))
    keys = torch.where(x == 0, torch.full_like(keys, 1 << 31), keys)
    return torch.where(visible, keys, torch.zeros_like(keys))


def passes_per_row(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Counting passes of each row of ``scores [..., keys]`` (-inf = not visible) before it stops."""
    keys = order_keys(scores)
    visible = (scores > -float("inf")).sum(-1)
    want = visible.clamp(max=topk)
    threshold = torch.zeros_like(want)
    at_or_above = visible.clone()
    passes = torch.zeros_like(want)
    for bit in range(KEY_BITS - 1, -1, -1):
        passes += at_or_above != want
        candidate = threshold | (1 << bit)
        n = (keys >= candidate[..., None]).sum(-1)
        enough = n >= want
        threshold = torch.where(enough, candidate, threshold)
        at_or_above = torch.where(enough, n, at_or_above)
    return passes


def key_values(keys: torch.Tensor) -> torch.Tensor:
    """fp32 values of int64 order keys (the kernel's ``_key_value``)."""
    bits = torch.where(keys >= 1 << 31, keys - (1 << 31), NO_KEY - 1 - keys)
    return torch.where(bits >= 1 << 31, bits - NO_KEY, bits).to(torch.int32).view(torch.float32)


def interpolated_passes_per_row(scores: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counting passes, reductions over the keys, and the threshold key each row ends at, under the
    interpolating search (``kernels.indexer._interpolated_threshold``, step for step)."""
    keys = order_keys(scores)
    visible = scores > -float("inf")
    want = visible.sum(-1).clamp(max=topk)
    lo = torch.where(visible, keys, NO_KEY - 1).min(-1).values
    hi = keys.max(-1).values + 1
    n_lo = visible.sum(-1)
    res_lo, res_hi = (n_lo - want).float(), -want.float()
    kept = torch.zeros_like(want)
    passes, work = torch.zeros_like(want), torch.zeros_like(want)
    active = (n_lo != want) & (hi - lo > 1)
    step = 0
    while active.any():
        share = res_lo / torch.where(active, res_lo - res_hi, torch.ones_like(res_lo))
        value_lo, value_hi = key_values(lo), key_values(hi - 1)
        guess = order_keys(value_lo + (value_hi - value_lo) * share)
        if step >= _BISECT_AFTER:
            guess = lo + (hi - lo) // 2
        candidate = torch.minimum(torch.maximum(guess, lo + 1), hi - 1)
        at_or_above = (keys >= candidate[..., None]) & visible
        n = at_or_above.sum(-1)
        new_lo, new_hi = candidate, candidate
        if step >= _SNAP_AFTER:
            new_lo = torch.where(at_or_above, keys, NO_KEY).min(-1).values
            new_hi = torch.where(at_or_above | ~visible, -1, keys).max(-1).values + 1
        up, down = active & (n >= want), active & (n < want)
        res_lo, res_hi = (torch.where(up, (n - want).float(), torch.where(down & (kept == -1), 0.5 * res_lo, res_lo)),
                          torch.where(down, (n - want).float(), torch.where(up & (kept == 1), 0.5 * res_hi, res_hi)))
        lo, n_lo, hi = torch.where(up, new_lo, lo), torch.where(up, n, n_lo), torch.where(down, new_hi, hi)
        kept = torch.where(up, 1, torch.where(down, -1, kept))
        passes += active
        work += active * (3 if step >= _SNAP_AFTER else 1)
        active = (n_lo != want) & (hi - lo > 1)
        step += 1
    return passes, work, lo


def gaussian_inputs(seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k unit-normal bf16 and w ~ N(0, 1/(H*D)), as the V4 model scales them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seq, INDEX_HEADS, INDEX_DIM, generator=gen).bfloat16()
    k = torch.randn(1, seq // INDEX_RATIO, INDEX_DIM, generator=gen).bfloat16()
    w = torch.randn(1, seq, INDEX_HEADS, generator=gen) * (INDEX_HEADS * INDEX_DIM) ** -0.5
    return q, k, w


def main() -> None:
    if len(sys.argv) != 2:
        print(__doc__.split("Usage: ")[1], file=sys.stderr, end="")
        sys.exit(2)
    kernel = registry.get("indexer_fwd")
    lines = ["| seq | topk | inputs | rows that pick (see > topk) | bisection: mean passes | max | rows taking all 32 "
             "| interpolating: mean passes | max | mean key work |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for seq in (4096, 8192):
        inputs = kernel.make_inputs({"batch": 1, "seq": seq, "topk": 512}, torch.device("cpu"), 0)
        scores = {"integer (bench)": index_scores_reference(inputs["q"], inputs["k"], inputs["w"]),
                  "Gaussian": index_scores_reference(*gaussian_inputs(seq, 0))}
        for topk in (512, 1024):
            for name, rows in scores.items():
                picks = (rows[0] > -float("inf")).sum(-1) > topk  # the others take all they see: no pass
                picking = passes_per_row(rows, topk)[0, picks]
                if not picking.numel():
                    lines.append(f"| {seq} | {topk} | {name} | 0 | - | - | - | - | - | - |")
                    continue
                passes, work = (t[0, picks].float() for t in interpolated_passes_per_row(rows, topk)[:2])
                lines.append(f"| {seq} | {topk} | {name} | {picking.numel()} | {picking.float().mean():.1f} | "
                             f"{picking.max()} | {(picking == KEY_BITS).float().mean():.1%} | {passes.mean():.1f} | "
                             f"{passes.max():.0f} | {work.mean():.1f} |")
            print(lines[-1], flush=True)
    Path(sys.argv[1]).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
