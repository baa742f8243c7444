"""How many counting passes the indexer's selection takes per score row, on the benchmark's integer
inputs and on Gaussian ones (V4's scale), at the Flash and Pro indexer shapes.

The selection (``kernels/indexer.py``) builds the k-th largest uint32 key a bit at a time from the
top and stops a row once exactly k keys lie at or above its threshold, so its time depends on the
values, where the bisection it replaced always took 32 passes. This replays that search in torch,
on the CPU, over the scores of the eager reference.

Usage: python bench/indexer_select_passes.py OUT.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import registry
from kernels.indexer import INDEX_DIM, INDEX_HEADS, INDEX_RATIO, index_scores_reference

KEY_BITS = 32


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
    lines = ["| seq | topk | inputs | rows that pick (see > topk) | mean passes | max | rows taking all 32 |",
             "|---|---|---|---|---|---|---|"]
    for seq in (4096, 8192):
        inputs = kernel.make_inputs({"batch": 1, "seq": seq, "topk": 512}, torch.device("cpu"), 0)
        scores = {"integer (bench)": index_scores_reference(inputs["q"], inputs["k"], inputs["w"]),
                  "Gaussian": index_scores_reference(*gaussian_inputs(seq, 0))}
        for topk in (512, 1024):
            for name, rows in scores.items():
                picks = (rows[0] > -float("inf")).sum(-1) > topk  # the others take all they see: no pass
                picking = passes_per_row(rows, topk)[0, picks]
                if not picking.numel():
                    lines.append(f"| {seq} | {topk} | {name} | 0 | - | - | - |")
                    continue
                lines.append(f"| {seq} | {topk} | {name} | {picking.numel()} | {picking.float().mean():.1f} | "
                             f"{picking.max()} | {(picking == KEY_BITS).float().mean():.1%} |")
            print(lines[-1], flush=True)
    Path(sys.argv[1]).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
