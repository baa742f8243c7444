"""Eager PyTorch versions of V4's attention-side ops, one function per op, straight from the math.

They carry the signatures of the Triton kernels being written for them
(``kernels/sparse_attention.py``, ``kernels/compressor.py``, ``kernels/indexer.py``), so that
``v4.ops`` can swap a kernel in for a function without touching the model:

* ``sparse_attention``: single-latent (MQA) attention over the sliding window plus the compressed
  entries, with the per-head sink in the softmax denominator;
* ``compress_pool``: the compressor's softmax pooling (CSA's overlapping window of 8, HCA's 128);
* ``indexer_topk``: the lightning indexer's causal scores and top-k selection;
* ``rope_tail``: interleaved RoPE on the trailing dims of any head width (the indexer's 128-wide
  heads; ``kernels.rope`` covers V4's 512-wide heads).

Reductions run in fp32; results come back in the input dtype. The sparse attention is written
densely (every query against every key, then masked), which is the plainest statement of the math
but costs ``B * H * S * (S + S/r)`` fp32 scores per layer: fine for tests and short proxies, the
reason the Triton kernel exists for long sequences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.contracts import check_range
from v4.config import CSA_RATIO


def rope_tail(x: Tensor, pos: Tensor, theta: float, inverse: bool = False, rope_dim: int = 64) -> Tensor:
    """Rotate the last ``rope_dim`` dims of ``x [..., H, d]`` as interleaved pairs by positions ``pos [...]``.

    Pair ``(2i, 2i+1)`` turns by ``pos * theta^(-2i/rope_dim)`` (``inverse`` turns back), as
    ``kernels.rope`` does for 512-wide heads; the leading ``d - rope_dim`` dims pass through.
    """
    exponents = torch.arange(0, rope_dim, 2, dtype=torch.float64, device=x.device) / rope_dim
    angle = pos.float()[..., None, None] * (theta ** -exponents).float()
    cos, sin = angle.cos(), angle.sin() * (-1.0 if inverse else 1.0)
    even, odd = x[..., -rope_dim:].float().unflatten(-1, (rope_dim // 2, 2)).unbind(-1)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], rotated.to(x.dtype)), -1)


def _closed_groups(seq: int, ratio: int, device: torch.device) -> Tensor:
    """``[S]``: how many compressed entries query s may see, the groups closed at s: ``(s + 1) // ratio``."""
    return torch.div(torch.arange(1, seq + 1, device=device), ratio, rounding_mode="floor")


def sparse_attention(
    q: Tensor,
    kv: Tensor,
    sink: Tensor,
    compress_ratio: int,
    kv_compressed: Tensor | None = None,
    indices: Tensor | None = None,
    window: int = 128,
) -> Tensor:
    """``o [B,S,H,d]``: each query's softmax-weighted sum over its entries, the sink adding to the denominator.

    Entries of query s: the raw latents ``kv[max(0, s-window+1) .. s]``; for HCA (ratio > 4) every
    closed compressed entry ``t < (s+1)//ratio`` of ``kv_compressed [B,T,d]``; for CSA (ratio 4)
    the compressed entries listed in ``indices [B,S,k]``: each slot one entry (a pick listed twice
    weighs twice), -1 = none wherever it stands, values in ``[-1, T)`` (refused otherwise where
    ``kernels.contracts`` checks values; unchecked, skipped), as ``kernels.sparse_attention``
    reads them. The latent is both key and value; logits are scaled by ``1/sqrt(d)``; ``sink [H]``
    is one fp32 logit per head.
    """
    batch, seq, heads, dim = q.shape
    qf, kvf = q.float(), kv.float()
    s = torch.arange(seq, device=q.device)
    offset = s[:, None] - s[None, :]
    allowed = ((offset >= 0) & (offset < window)).expand(batch, seq, seq)  # [B, S, S]
    keys = kvf
    if compress_ratio:
        if kv_compressed is None:
            raise ValueError(f"compress_ratio {compress_ratio} needs kv_compressed")
        kcf = kv_compressed.float()
        n_entries = kcf.shape[1]
        if compress_ratio == CSA_RATIO:
            if indices is None:
                raise ValueError("CSA attention (ratio 4) needs the indexer's indices")
            check_range("indices", indices, -1, n_entries, "-1 (padding) or rows of kv_compressed")
            picks = (indices >= 0) & (indices < n_entries)
            slots = torch.where(picks, indices.long(), n_entries)  # padding -> a spare column
            counts = torch.zeros(batch, seq, n_entries + 1, device=q.device).scatter_add_(-1, slots, picks.float())
            compressed = counts[..., :n_entries]
        else:
            closed = _closed_groups(seq, compress_ratio, q.device)
            compressed = (torch.arange(n_entries, device=q.device)[None, :] < closed[:, None]).expand(batch, -1, -1)
        allowed = torch.cat((allowed.float(), compressed.float()), -1)
        keys = torch.cat((kvf, kcf), 1)
    # Each entry's logit plus the log of how often the query lists it: -inf for 0, 0 for once.
    logits = torch.einsum("bshd,btd->bhst", qf, keys) * dim ** -0.5 + allowed.float().log()[:, None]
    sink_logit = sink.float()[None, :, None, None].expand(batch, heads, seq, 1)
    probs = torch.softmax(torch.cat((logits, sink_logit), -1), -1)[..., :-1]
    return torch.einsum("bhst,btd->bshd", probs, keys).to(q.dtype)


def compress_pool(kv: Tensor, score: Tensor, ape: Tensor, ratio: int) -> Tensor:
    """``c [B, S//ratio, d]``: per channel, a softmax over a group's tokens of ``score + ape`` weighting ``kv``.

    ``kv`` and ``score`` are ``[B, S, coff*d]`` (coff 2 for CSA, 1 for HCA), ``ape [ratio, coff*d]``.
    CSA overlaps: entry g pools the previous group's tokens on the first channel half and its own
    on the second (a window of 8); group 0's missing half has -inf scores. A trailing partial
    group produces no entry.
    """
    batch, seq, channels = kv.shape
    groups = seq // ratio
    coff = 2 if ratio == CSA_RATIO else 1
    dim = channels // coff
    if groups == 0:
        return kv.new_zeros(batch, 0, dim)
    kv_g = kv[:, : groups * ratio].float().view(batch, groups, ratio, channels)
    score_g = score[:, : groups * ratio].float().view(batch, groups, ratio, channels) + ape.float()
    if coff == 2:
        prev_kv = F.pad(kv_g[:, :-1, :, :dim], (0, 0, 0, 0, 1, 0))
        prev_score = F.pad(score_g[:, :-1, :, :dim], (0, 0, 0, 0, 1, 0), value=float("-inf"))
        kv_g = torch.cat((prev_kv, kv_g[..., dim:]), 2)
        score_g = torch.cat((prev_score, score_g[..., dim:]), 2)
    weights = torch.softmax(score_g, dim=2)
    return (weights * kv_g).sum(2).to(kv.dtype)


def indexer_topk(q_i: Tensor, k_i: Tensor, w: Tensor, topk: int, ratio: int = CSA_RATIO) -> tuple[Tensor, Tensor]:
    """The lightning indexer: ``indices [B,S,topk]`` int32 (-1 padded) and their scores, highest first.

    ``I[s,t] = sum_h w[s,h] * ReLU(q_i[s,h] . k_i[t])`` over the closed entries ``t < (s+1)//ratio``
    of ``k_i [B,T,dim]``; a query with fewer than ``topk`` closed entries gets -1 in the rest
    (score -inf). Equal scores keep ``torch.topk``'s order. Not differentiable: the indexer is frozen.
    """
    batch, seq = q_i.shape[:2]
    n_entries = k_i.shape[1]
    with torch.no_grad():
        scores = torch.einsum("bshd,btd->bsht", q_i.float(), k_i.float()).relu()
        scores = (scores * w.float()[..., None]).sum(2)
        closed = _closed_groups(seq, ratio, q_i.device)
        valid = torch.arange(n_entries, device=q_i.device)[None, :] < closed[:, None]
        scores = scores.masked_fill(~valid, float("-inf"))
        values, indices = scores.topk(min(topk, n_entries), dim=-1)
        indices = torch.where(torch.isfinite(values), indices, -1)
        missing = topk - values.shape[-1]
        if missing:
            values = F.pad(values, (0, missing), value=float("-inf"))
            indices = F.pad(indices, (0, missing), value=-1)
    return indices.int(), values
