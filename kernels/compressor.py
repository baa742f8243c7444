"""DeepSeek-V4 compressor pooling: a per-channel softmax over each group's window pools kv.

Inputs are the compressor's two projections, already computed, ``kv`` and ``score``
``[B, S, coff*d]``, and its learned position bias ``ape [r, coff*d]``. Group g holds the r
tokens ``g*r .. g*r + r - 1``; only closed groups produce an entry (``G = S // r``; a tail
of ``S % r`` tokens is dropped). Per entry g and channel j, with ``l = score + ape``::

    c[g, j] = sum_i softmax_i(l[i, j]) * kv[i, j]        over the window of entry g

* HCA (``r = 128``, ``coff = 1``): the window is the group's own r tokens, channel j.
* CSA (``r = 4``, ``coff = 2``, the only overlapping ratio, as in the V4 reference): a
  window of 2r = 8 positions, the previous group's 4 tokens on channel j (the first half
  of the projections) then the group's own 4 tokens on channel ``d + j`` (the second
  half). Group 0 has no previous group: those 4 positions take no part (a -inf score).

Window position i of entry g is token ``(g + 1 - coff) * r + i`` and column
``(i // r) * d + j``, and ape row ``i % r`` of that column, so one formula covers both.
d is 512 for the attention compressor and 128 for the indexer's; any d works (masked).
The RMSNorm and RoPE that follow are separate kernels.

Forward (``compressor_fwd``): each program holds a ``[BLOCK_G entries, window, BLOCK_D
channels]`` tile in registers, so kv and score are read once; the softmax (max-subtracted)
and the weighted sum are fp32, the output is rounded once to kv's dtype.

Backward (``compressor_bwd``): nothing is saved but the inputs; each program recomputes its
entries' softmax ``p`` and fp32 ``c`` from the same tile and writes ``dkv_i = p_i dc`` and
``dscore_i = p_i dc (kv_i - c)``. Each element of dkv and dscore belongs to exactly one
entry's window, except the first half of the last closed group (CSA) and the dropped tail,
whose gradient is zero. Programs also walk ``coff - 1`` (plus one when there is a tail)
"virtual" entries past the last closed group per batch, whose dc is zero, so the kernel
writes every element once and the gradients need no zero-filled buffers. ``dape`` is the
sum of dscore over batch and groups: each of at most ``SLABS`` programs per channel block
walks a contiguous slab of entries, accumulating its ``[window, BLOCK_D]`` share in fp32
registers, and then either atomically adds it into an fp32 ``[r, coff*d]`` buffer
(``DAPE_ATOMIC = 1``: the order of the additions, so the last bits, vary run to run; the
buffer's zeroing is a fill launch of its own, except with ``DAPE_LAST``, where the adds go to a
zero-at-rest accumulator that the last program of the channel block copies out and zeroes) or
writes it as one row of an fp32 ``[slabs, r, coff*d]`` buffer summed afterwards
(``DAPE_ATOMIC = 0``: deterministic, but the partials cost ``slabs * r * coff * d * 4``
bytes each way, which for HCA, with few entries per slab, nears the traffic of the
gradients themselves). With ``SAVED_STATS`` (HCA only), the forward also saves each entry's
fp32 log-sum-exp and c (``[B, G, d]`` each: 64 KB at S = 4,096, d = 512), so any ``p`` needs
no other window position: a program takes ``BLOCK_P`` window positions of ``BLOCK_D``
channels over every entry, and its dape share is complete, written once, with no partials,
atomics or second launch (deterministic). The autograd Function resolves the backward's config
in the forward, to know whether to save them.

Floor to compare against: HBM bytes at full bandwidth (``bytes_moved``); the arithmetic is
a few operations per byte. Forward: kv and score of the closed groups read, c written.
Backward: kv, score, dc read, dkv and dscore written (every token), ape and dape.

Error bounds per output (against a fp32 reference fed the same inputs): c, dkv and dscore
are fp32 results rounded once to bf16, relative error at most 2**-8 (below 2**-7 under
Triton's CPU interpreter, whose casts truncate) plus fp32 evaluation error of about 1e-6
of the inputs' size; dape is fp32 and differs by summation order only (about 1e-6 of the
sum of its terms' magnitudes). A truncated and a rounded bf16 value of the same number
differ by at most one step, below 2**-7 (0.0078) relative, so the registered tolerance
(atol 1e-3, rtol 1e-2) checks every output tightly at any size.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels import zero_at_rest
from kernels.contracts import check_same_device
from kernels.host_math import cdiv, next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve
from kernels.zero_at_rest import last_to_arrive

CSA_RATIO = 4  # the only ratio whose windows overlap (coff = 2), as in the V4 reference
_BF16_BYTES = 2
_FP32_BYTES = 4


def window_factor(ratio: int) -> int:
    """``coff``: 2 for the overlapping CSA compressor (ratio 4), 1 otherwise (HCA, ratio 128)."""
    return 2 if ratio == CSA_RATIO else 1


@triton.jit
def _window_tile(rows, pos, cols, n_rows, entries, seq, dim, RATIO: tl.constexpr, COFF: tl.constexpr):
    """Offsets into kv/score and the mask of a ``[rows, window positions, channels]`` tile.

    ``rows`` count entries over the flattened batch, ``entries`` per batch element.
    """
    batch = rows // entries
    token = (rows % entries + 1 - COFF) * RATIO + pos
    mask = (rows < n_rows) & (pos < COFF * RATIO) & (token >= 0) & (token < seq) & (cols < dim)
    return (batch * seq + token).to(tl.int64) * (COFF * dim) + (pos // RATIO) * dim + cols, mask


@triton.jit
def _ape_tile(pos, cols, dim, RATIO: tl.constexpr, COFF: tl.constexpr):
    """Offsets into ape (and dape) and the mask of a ``[window positions, channels]`` tile."""
    offsets = (pos % RATIO)[:, None] * (COFF * dim) + (pos // RATIO)[:, None] * dim + cols[None, :]
    return offsets, (pos < COFF * RATIO)[:, None] & (cols < dim)[None, :]


@triton.jit
def _pool(kv_ptr, score_ptr, ape, offsets, mask):
    """Softmax weights ``p`` over the window (axis 1), the fp32 kv tile, ``c = sum p kv``, and the
    softmax's log-sum-exp (what a backward needs, with c, to rebuild any ``p`` alone)."""
    logit = tl.load(score_ptr + offsets, mask=mask, other=0.0).to(tl.float32) + ape[None, :, :]
    logit = tl.where(mask, logit, -float("inf"))
    top = tl.max(logit, axis=1)
    top = tl.where(top == -float("inf"), 0.0, top)  # a lane with no token at all (masked out)
    weight = tl.exp(logit - top[:, None, :])
    total = tl.sum(weight, axis=1)
    total = tl.where(total == 0.0, 1.0, total)  # a lane with no token: p = 0
    p = weight * (1.0 / total)[:, None, :]
    kv = tl.load(kv_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return p, kv, tl.sum(p * kv, axis=1), top + tl.log(total)


@triton.jit
def _compressor_fwd_kernel(
    kv_ptr, score_ptr, ape_ptr, out_ptr, lse_ptr, pooled_ptr, n_rows, seq, dim,
    RATIO: tl.constexpr, COFF: tl.constexpr, WINDOW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    SAVE_STATS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    pos = tl.arange(0, WINDOW)
    ape_offsets, ape_mask = _ape_tile(pos, cols, dim, RATIO, COFF)
    ape = tl.load(ape_ptr + ape_offsets, mask=ape_mask, other=0.0).to(tl.float32)
    offsets, mask = _window_tile(
        rows[:, None, None], pos[None, :, None], cols[None, None, :], n_rows, seq // RATIO, seq, dim, RATIO, COFF)
    _, _, c, lse = _pool(kv_ptr, score_ptr, ape, offsets, mask)
    out_offsets = rows.to(tl.int64)[:, None] * dim + cols[None, :]
    out_mask = (rows < n_rows)[:, None] & (cols < dim)[None, :]
    tl.store(out_ptr + out_offsets, c.to(out_ptr.dtype.element_ty), mask=out_mask)
    if SAVE_STATS:  # fp32 c and the log-sum-exp, for the backward that reads them (SAVED_STATS)
        tl.store(pooled_ptr + out_offsets, c, mask=out_mask)
        tl.store(lse_ptr + out_offsets, lse, mask=out_mask)


@triton.jit
def _compressor_bwd_kernel(
    kv_ptr, score_ptr, ape_ptr, dc_ptr, dkv_ptr, dscore_ptr, dape_ptr, acc_ptr, arrivals_ptr,
    n_rows, entries, seq, dim, rows_per_slab,
    RATIO: tl.constexpr, COFF: tl.constexpr, WINDOW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    DAPE_ATOMIC: tl.constexpr, DAPE_LAST: tl.constexpr, CHANNELS_FIRST: tl.constexpr,
):
    """dkv and dscore of a slab of entries over BLOCK_D channels, and the slab's dape share: stored as
    its own partial, added by atomics into a zeroed dape, or (DAPE_LAST) added into a zero-at-rest
    accumulator (``kernels.zero_at_rest``) that the channel block's last program to arrive, counted
    in ``arrivals_ptr``, copies into dape in ape's dtype and zeroes again: no fill launch before.
    The grid is (slab, channel block), or with CHANNELS_FIRST (channel block, slab): then the
    programs that launch together read the same rows' neighbouring channels, whose 32-byte sectors
    share DRAM bursts, rather than the same channels of far-apart rows."""
    slab_axis: tl.constexpr = 1 if CHANNELS_FIRST else 0
    slab = tl.program_id(slab_axis)
    channel_block = tl.program_id(1 - slab_axis)
    cols = channel_block * BLOCK_D + tl.arange(0, BLOCK_D)
    pos = tl.arange(0, WINDOW)
    groups = seq // RATIO
    ape_offsets, ape_mask = _ape_tile(pos, cols, dim, RATIO, COFF)
    ape = tl.load(ape_ptr + ape_offsets, mask=ape_mask, other=0.0).to(tl.float32)
    dape = tl.zeros([WINDOW, BLOCK_D], dtype=tl.float32)
    first_row = slab * rows_per_slab
    for r0 in range(first_row, tl.minimum(first_row + rows_per_slab, n_rows), BLOCK_G):
        rows = r0 + tl.arange(0, BLOCK_G)
        offsets, mask = _window_tile(
            rows[:, None, None], pos[None, :, None], cols[None, None, :], n_rows, entries, seq, dim, RATIO, COFF)
        p, kv, c, _ = _pool(kv_ptr, score_ptr, ape, offsets, mask)
        group = rows % entries
        closed = (rows < n_rows) & (group < groups)  # a real entry; the virtual ones get dc = 0
        dc_rows = (rows // entries * groups + group).to(tl.int64)
        dc = tl.load(dc_ptr + dc_rows[:, None] * dim + cols[None, :], mask=closed[:, None] & (cols < dim)[None, :],
                     other=0.0).to(tl.float32)
        dkv = p * dc[:, None, :]
        dlogit = dkv * (kv - c[:, None, :])
        tl.store(dkv_ptr + offsets, dkv.to(dkv_ptr.dtype.element_ty), mask=mask)
        tl.store(dscore_ptr + offsets, dlogit.to(dscore_ptr.dtype.element_ty), mask=mask)
        dape += tl.sum(dlogit, axis=0)
    if DAPE_LAST:
        tl.atomic_add(acc_ptr + ape_offsets, dape, mask=ape_mask, sem="relaxed")
        if last_to_arrive(arrivals_ptr, channel_block, tl.num_programs(slab_axis)):
            total = tl.load(acc_ptr + ape_offsets, mask=ape_mask, other=0.0, cache_modifier=".cg")
            tl.store(dape_ptr + ape_offsets, total.to(dape_ptr.dtype.element_ty), mask=ape_mask)
            tl.store(acc_ptr + ape_offsets, tl.zeros_like(total), mask=ape_mask)
            tl.store(arrivals_ptr + channel_block, 0)
    elif DAPE_ATOMIC:
        # relaxed: the sums need no ordering against other memory; the default acq_rel fenced
        # every add (membar stalls under Nsight Compute)
        tl.atomic_add(dape_ptr + ape_offsets, dape, mask=ape_mask, sem="relaxed")
    else:
        tl.store(dape_ptr + slab * (RATIO * COFF * dim) + ape_offsets, dape, mask=ape_mask)


@triton.jit
def _compressor_bwd_stats_kernel(
    kv_ptr, score_ptr, ape_ptr, dc_ptr, lse_ptr, pooled_ptr, dkv_ptr, dscore_ptr, dape_ptr,
    n_rows, entries, seq, dim,
    RATIO: tl.constexpr, COFF: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """The backward from the forward's saved log-sum-exp and fp32 c: ``p`` of a window position needs
    no other position, so a program takes BLOCK_P positions of BLOCK_D channels and walks every
    entry, and its dape share is complete (no partials, no atomics, no second launch)."""
    pos = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    groups = seq // RATIO
    ape_offsets, ape_mask = _ape_tile(pos, cols, dim, RATIO, COFF)
    ape = tl.load(ape_ptr + ape_offsets, mask=ape_mask, other=0.0).to(tl.float32)
    dape = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for r0 in range(0, n_rows, BLOCK_G):
        rows = r0 + tl.arange(0, BLOCK_G)
        offsets, mask = _window_tile(
            rows[:, None, None], pos[None, :, None], cols[None, None, :], n_rows, entries, seq, dim, RATIO, COFF)
        group = rows % entries
        closed = (rows < n_rows) & (group < groups)  # a real entry; the virtual ones get zero gradients
        stat_offsets = (rows // entries * groups + group).to(tl.int64)[:, None] * dim + cols[None, :]
        stat_mask = closed[:, None] & (cols < dim)[None, :]
        dc = tl.load(dc_ptr + stat_offsets, mask=stat_mask, other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + stat_offsets, mask=stat_mask, other=0.0)
        c = tl.load(pooled_ptr + stat_offsets, mask=stat_mask, other=0.0)
        logit = tl.load(score_ptr + offsets, mask=mask, other=0.0).to(tl.float32) + ape[None, :, :]
        p = tl.where(mask & stat_mask[:, None, :], tl.exp(logit - lse[:, None, :]), 0.0)
        kv = tl.load(kv_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dkv = p * dc[:, None, :]
        dlogit = dkv * (kv - c[:, None, :])
        tl.store(dkv_ptr + offsets, dkv.to(dkv_ptr.dtype.element_ty), mask=mask)
        tl.store(dscore_ptr + offsets, dlogit.to(dscore_ptr.dtype.element_ty), mask=mask)
        dape += tl.sum(dlogit, axis=0)
    tl.store(dape_ptr + ape_offsets, dape.to(dape_ptr.dtype.element_ty), mask=ape_mask)


def _constexprs(ratio: int, config: Config) -> dict[str, int]:
    coff = window_factor(ratio)
    return {"RATIO": ratio, "COFF": coff, "WINDOW": next_pow2(coff * ratio),
            "BLOCK_G": config["BLOCK_G"], "BLOCK_D": config["BLOCK_D"]}


def _forward(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, config: Config,
             compile_only: bool = False, save_stats: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Launch the forward on contiguous inputs (the ratio is ``ape.shape[0]``); returns ``c [B, S // r, d]``
    and, with ``save_stats``, the fp32 ``(lse, c)`` of the same shape a SAVED_STATS backward reads."""
    batch, seq, width = kv.shape
    ratio = ape.shape[0]
    dim = width // window_factor(ratio)
    out = kv.new_empty(batch, seq // ratio, dim)
    stats = tuple(torch.empty(out.shape, dtype=torch.float32, device=kv.device) for _ in range(2)) if save_stats else ()
    n_rows = batch * (seq // ratio)
    launch(
        _compressor_fwd_kernel,
        (cdiv(n_rows, config["BLOCK_G"]), cdiv(dim, config["BLOCK_D"])),
        (kv, score, ape, out, *(stats or (out, out)), n_rows, seq, dim),
        {**_constexprs(ratio, config), "SAVE_STATS": save_stats},
        config,
        compile_only,
    )
    return out, stats


def _backward(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, grad_out: torch.Tensor, config: Config,
              compile_only: bool = False, stats: tuple[torch.Tensor, ...] = ()
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward on contiguous tensors; returns ``(dkv, dscore, dape)``, dape in ape's dtype.
    A SAVED_STATS config needs the forward's ``stats`` (``_forward(..., save_stats=True)``)."""
    batch, seq, width = kv.shape
    ratio = ape.shape[0]
    coff = window_factor(ratio)
    dim = width // coff
    # Closed groups, then the virtual entries whose windows hold the zero-gradient halves and tail.
    entries = cdiv(seq, ratio) + coff - 1
    n_rows = batch * entries
    dkv, dscore = torch.empty_like(kv), torch.empty_like(score)
    if config.get("SAVED_STATS", 0):  # configs tuned before SAVED_STATS existed lack it
        if len(stats) != 2:
            raise ValueError("a SAVED_STATS backward needs the forward's (lse, c) statistics")
        dape = torch.empty_like(ape)
        launch(
            _compressor_bwd_stats_kernel,
            (cdiv(coff * ratio, config["BLOCK_P"]), cdiv(dim, config["BLOCK_D"])),
            (kv, score, ape, grad_out, *stats, dkv, dscore, dape, n_rows, entries, seq, dim),
            {"RATIO": ratio, "COFF": coff, "BLOCK_G": config["BLOCK_G"], "BLOCK_P": config["BLOCK_P"],
             "BLOCK_D": config["BLOCK_D"]},
            config,
            compile_only,
        )
        return dkv, dscore, dape
    block_g = config["BLOCK_G"]
    row_blocks = cdiv(n_rows, block_g)
    rows_per_slab = cdiv(row_blocks, max(1, min(config["SLABS"], row_blocks))) * block_g
    slabs = cdiv(n_rows, rows_per_slab)
    channel_blocks = cdiv(dim, config["BLOCK_D"])
    dape_last = bool(config.get("DAPE_LAST", 0))  # configs tuned before DAPE_LAST lack it
    if dape_last:
        dape = torch.empty_like(ape)
        slot, acc, arrivals = zero_at_rest.take(kv.device, ape.numel(), channel_blocks)
    elif config["DAPE_ATOMIC"]:
        dape = torch.zeros(ratio, width, dtype=torch.float32, device=kv.device)
    else:
        dape = torch.empty(slabs, ratio, width, dtype=torch.float32, device=kv.device)
    channels_first = bool(config.get("CHANNELS_FIRST", 0))  # configs tuned before CHANNELS_FIRST lack it
    try:
        launch(
            _compressor_bwd_kernel,
            (channel_blocks, slabs) if channels_first else (slabs, channel_blocks),
            (kv, score, ape, grad_out, dkv, dscore, dape, *((acc, arrivals) if dape_last else (dape, dape)),
             n_rows, entries, seq, dim, rows_per_slab),  # dape twice: unread without DAPE_LAST
            {**_constexprs(ratio, config), "DAPE_ATOMIC": bool(config["DAPE_ATOMIC"]), "DAPE_LAST": dape_last,
             "CHANNELS_FIRST": channels_first},
            config,
            compile_only,
        )
    except BaseException:
        if dape_last:
            zero_at_rest.restore(kv.device, slot)
        raise
    if not (config["DAPE_ATOMIC"] or dape_last):
        dape = dape.sum(0)
    return dkv, dscore, dape.to(ape.dtype)


def _resolved(kernel: str, kv: torch.Tensor, ratio: int) -> Config:
    batch, seq, width = kv.shape
    config, _ = resolve(kernel, {"batch": batch, "seq": seq, "ratio": ratio, "dim": width // window_factor(ratio)})
    return config


class _CompressorPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
        fwd_config = _resolved("compressor_fwd", kv, ape.shape[0])
        # The backward's config is resolved here: the forward saves the statistics it reads, if any.
        ctx.bwd_config = _resolved("compressor_bwd", kv, ape.shape[0]) if any(ctx.needs_input_grad) else None
        save_stats = bool(ctx.bwd_config and ctx.bwd_config.get("SAVED_STATS", 0))
        out, stats = _forward(kv, score, ape, fwd_config, save_stats=save_stats)
        ctx.save_for_backward(kv, score, ape, *stats)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        kv, score, ape, *stats = ctx.saved_tensors
        return _backward(kv, score, ape, grad_out.contiguous(), ctx.bwd_config, stats=tuple(stats))


def compressor_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Pooled entries ``c [B, S // r, d]`` of the V4 compressor; differentiable in kv, score and ape.

    Contract: ``kv`` and ``score [B, S, coff*d]`` (both bf16 or both fp32, B and S >= 1) are the
    two projections, ``ape [r, coff*d]`` (any float dtype) the position bias; the ratio r is
    ``ape.shape[0]`` (4: CSA, overlapping windows, coff 2; any other, e.g. 128 for HCA: coff 1);
    a trailing partial group of ``S % r`` tokens makes no entry; all on one device, any strides
    (copied). The output has kv's dtype, the gradients their inputs' dtypes. Launch
    parameters come from ``kernels.tuning.resolve``.
    """
    check_same_device(kv=kv, score=score, ape=ape)
    if kv.dim() != 3 or score.shape != kv.shape:
        raise ValueError(f"kv and score must both be [B, S, coff*d], got {list(kv.shape)} and {list(score.shape)}")
    if kv.dtype not in (torch.bfloat16, torch.float32) or score.dtype != kv.dtype:
        raise ValueError(f"kv and score must both be bfloat16 or both float32, got {kv.dtype} and {score.dtype}")
    if ape.dim() != 2 or ape.shape[0] < 1 or ape.shape[1] != kv.shape[2] or not ape.is_floating_point():
        raise ValueError(f"ape must be a float [ratio, {kv.shape[2]}], got {list(ape.shape)} {ape.dtype}")
    coff = window_factor(ape.shape[0])
    if kv.shape[2] % coff or kv.shape[0] < 1 or kv.shape[1] < 1:
        raise ValueError(f"ratio {ape.shape[0]} needs a non-empty [B, S, {coff}*d] kv, got {list(kv.shape)}")
    return _CompressorPool.apply(kv.contiguous(), score.contiguous(), ape.contiguous())


def _overlap(grouped: torch.Tensor, dim: int, fill: float) -> torch.Tensor:
    """``[B, G, r, 2d] -> [B, G, 2r, d]``: the previous group's first half (``fill`` for group 0), then
    the group's own second half."""
    previous = torch.cat([torch.full_like(grouped[:, :1, :, :dim], fill), grouped[:, :-1, :, :dim]], dim=1)
    return torch.cat([previous, grouped[..., dim:]], dim=2)


def _windows(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(values, logits)`` ``[B, G, window, d]`` of every closed group's window."""
    batch, seq, width = kv.shape
    ratio = ape.shape[0]
    closed = seq // ratio * ratio
    values = kv[:, :closed].float().unflatten(1, (-1, ratio))
    logits = score[:, :closed].float().unflatten(1, (-1, ratio)) + ape.float()
    if window_factor(ratio) == 2:
        values, logits = _overlap(values, width // 2, 0.0), _overlap(logits, width // 2, -float("inf"))
    return values, logits


def compressor_pool_reference(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Eager fp32 math of ``compressor_pool`` (differentiable), in kv's dtype."""
    values, logits = _windows(kv, score, ape)
    return (logits.softmax(dim=2) * values).sum(dim=2).to(kv.dtype)


def pool_stats_reference(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager fp32 ``(lse, c)`` ``[B, S // r, d]``: what ``_forward(..., save_stats=True)`` saves."""
    values, logits = _windows(kv, score, ape)
    return logits.logsumexp(dim=2), (logits.softmax(dim=2) * values).sum(dim=2)


# ----- registration -------------------------------------------------------------------


def _make_inputs(shape: Shape, device: torch.device, seed: int, backward: bool) -> Inputs:
    """bf16 kv and score (unit normal), fp32 ape (std 0.5), and for the backward a unit-normal dc."""
    gen = torch.Generator().manual_seed(seed)
    batch, seq, ratio, dim = shape["batch"], shape["seq"], shape["ratio"], shape["dim"]
    width = window_factor(ratio) * dim
    tensors = {
        "kv": torch.randn(batch, seq, width, generator=gen).to(torch.bfloat16),
        "score": torch.randn(batch, seq, width, generator=gen).to(torch.bfloat16),
        "ape": 0.5 * torch.randn(ratio, width, generator=gen),
    }
    if backward:
        tensors["grad_out"] = torch.randn(batch, seq // ratio, dim, generator=gen).to(torch.bfloat16)
        tensors["lse"], tensors["pooled"] = pool_stats_reference(tensors["kv"], tensors["score"], tensors["ape"])
    return {name: t.to(device) for name, t in tensors.items()}


def _run_fwd(inputs: Inputs, config: Config) -> torch.Tensor:
    return _forward(inputs["kv"], inputs["score"], inputs["ape"], config)[0]


def _compile_fwd(inputs: Inputs, config: Config) -> None:
    _forward(inputs["kv"], inputs["score"], inputs["ape"], config, compile_only=True)


def _reference_fwd(inputs: Inputs) -> torch.Tensor:
    return compressor_pool_reference(inputs["kv"], inputs["score"], inputs["ape"])


def _run_bwd(inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(inputs["kv"], inputs["score"], inputs["ape"], inputs["grad_out"], config,
                     stats=(inputs["lse"], inputs["pooled"]))


def _compile_bwd(inputs: Inputs, config: Config) -> None:
    _backward(inputs["kv"], inputs["score"], inputs["ape"], inputs["grad_out"], config, compile_only=True,
              stats=(inputs["lse"], inputs["pooled"]))


def _reference_bwd(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients by autograd through the eager fp32 math, in the inputs' dtypes."""
    with torch.enable_grad():
        leaves = [inputs[name].detach().float().requires_grad_() for name in ("kv", "score", "ape")]
        out = compressor_pool_reference(*leaves)
        grads = torch.autograd.grad(out, leaves, inputs["grad_out"].float())
    return tuple(g.to(inputs[name].dtype) for g, name in zip(grads, ("kv", "score", "ape")))


def _tile(shape: Shape) -> tuple[int, int]:
    """``(BLOCK_G, BLOCK_D)`` of about 4096 window values: 64 channels (128-byte rows) for CSA's
    8-wide window, 32 for HCA's 128-wide one, with as many entries as fill the rest."""
    ratio, dim = shape["ratio"], shape["dim"]
    window = next_pow2(window_factor(ratio) * ratio)
    block_d = min(next_pow2(dim), max(16, min(64, 4096 // window)))
    entries = max(1, shape["batch"] * (shape["seq"] // ratio))
    return min(max(1, 4096 // (window * block_d)), next_pow2(entries)), block_d


def _default_fwd_config(shape: Shape) -> Config:
    """One 4096-value window tile per program over 8 warps: 16 values of kv and score per thread."""
    block_g, block_d = _tile(shape)
    return {"BLOCK_G": block_g, "BLOCK_D": block_d, "num_warps": 8, "num_stages": 1}


def _default_bwd_config(shape: Shape) -> Config:
    """The forward's tile; 128 slabs per channel block where there are that many entry blocks (fewer,
    down to 32, for HCA); atomics for dape where per-slab partials would add more than an eighth to
    the bytes moved (HCA, with few entries per slab)."""
    block_g, block_d = _tile(shape)
    ratio, dim = shape["ratio"], shape["dim"]
    entry_blocks = cdiv(shape["batch"] * (cdiv(shape["seq"], ratio) + window_factor(ratio) - 1), block_g)
    slabs = max(s for s in (32, 64, 128) if s <= max(32, entry_blocks))
    partial_bytes = 2 * min(slabs, entry_blocks) * ratio * window_factor(ratio) * dim * _FP32_BYTES
    return {"BLOCK_G": block_g, "BLOCK_D": block_d, "SLABS": slabs, "SAVED_STATS": 0, "BLOCK_P": 1,
            "DAPE_ATOMIC": int(8 * partial_bytes > _bytes_bwd(shape)), "DAPE_LAST": 0, "CHANNELS_FIRST": 0,
            "num_warps": 8, "num_stages": 1}


def _sizes(shape: Shape) -> tuple[int, int, int, int]:
    """Elements of one of kv/score (all tokens), of its closed groups, of c, and of ape."""
    batch, seq, ratio, dim = shape["batch"], shape["seq"], shape["ratio"], shape["dim"]
    width = window_factor(ratio) * dim
    groups = seq // ratio
    return batch * seq * width, batch * groups * ratio * width, batch * groups * dim, ratio * width


def _bytes_fwd(shape: Shape) -> int:
    """kv and score of the closed groups read, ape read, c written."""
    _, pooled, out, ape = _sizes(shape)
    return _BF16_BYTES * (2 * pooled + out) + _FP32_BYTES * ape


def _bytes_bwd(shape: Shape) -> int:
    """kv, score (closed groups) and dc read; dkv and dscore written for every token; ape read, dape written."""
    tokens, pooled, out, ape = _sizes(shape)
    return _BF16_BYTES * (2 * pooled + out + 2 * tokens) + 2 * _FP32_BYTES * ape


_SHAPE_FIELDS = ("batch", "seq", "ratio", "dim")
# V4-Flash and V4-Pro share the compressor shapes: latent d 512 (CSA r 4 and HCA r 128) and
# the CSA indexer's own compressor (r 4, d 128).
_V4_SHAPES = [{"batch": 1, "seq": seq, "ratio": ratio, "dim": dim}
              for seq in (4096, 8192) for ratio, dim in ((4, 512), (4, 128), (128, 512))]
_PRESETS = {
    "v4-flash": _V4_SHAPES,
    "v4-pro": _V4_SHAPES,
    # Tails of 2 and 44 tokens, d not a power of two, and a sequence shorter than one HCA group.
    "small": [{"batch": 2, "seq": 38, "ratio": 4, "dim": 40},
              {"batch": 2, "seq": 300, "ratio": 128, "dim": 24},
              {"batch": 2, "seq": 9, "ratio": 4, "dim": 128},
              {"batch": 2, "seq": 100, "ratio": 128, "dim": 16}],
}

register(
    TunableKernel(
        name="compressor_fwd",
        shape_fields=_SHAPE_FIELDS,
        exact_fields=("ratio", "dim"),
        make_inputs=functools.partial(_make_inputs, backward=False),
        run=_run_fwd,
        reference=_reference_fwd,
        default_config=_default_fwd_config,
        bytes_moved=_bytes_fwd,
        compile=_compile_fwd,
        atol=1e-3,
        rtol=1e-2,
        presets=_PRESETS,
    )
)
register(
    TunableKernel(
        name="compressor_bwd",
        shape_fields=_SHAPE_FIELDS,
        exact_fields=("ratio", "dim"),
        make_inputs=functools.partial(_make_inputs, backward=True),
        run=_run_bwd,
        reference=_reference_bwd,
        default_config=_default_bwd_config,
        bytes_moved=_bytes_bwd,
        compile=_compile_bwd,
        atol=1e-3,
        rtol=1e-2,
        presets=_PRESETS,
    )
)
