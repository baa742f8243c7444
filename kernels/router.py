"""DeepSeek-V4 MoE router tail: ``sqrt(softplus(logits))`` scores -> expert indices and weights.

Per token: ``s = sqrt(softplus(logits))``; the k experts are the top-k of ``s + bias``
(the bias steers selection only) or, on hash-routed layers, ``tid2eid[token_id]``; the
weights are the chosen scores normalised to sum to one, times ``route_scale``.

Forward: each program holds ``BLOCK_N`` tokens. Top-k runs over the scores padded to
``next_pow2(experts)`` columns (padding scores -inf) as k rounds of "take the row maximum,
then knock it out"; equal scores go to the lowest expert index first. The chosen logits are
then re-read (k per token, cached) and their scores recomputed, which is the whole of the
hash mode: it never reads the full row, and is registered as its own kernel
(``router_hash_fwd``; learned routing is ``router_fwd``).

Backward: indices are not differentiable; the weight gradient flows through the
normalisation and ``sqrt(softplus)`` into the k chosen logits of each token. Each program
builds its tokens' dense ``[BLOCK_N, experts]`` gradient in registers (zeros elsewhere,
repeated experts summed) and writes it once.

``softplus`` is computed as ``max(x, 0) + log1p(exp(-|x|))`` with ``log1p`` from a short
series below 2**-7: ``tl.log(1 + y)`` alone loses all precision for tiny y (on GPUs the
fast ``log`` is accurate only in absolute terms near 1), and a tiny score's gradient
``sigmoid(x) / (2 s)`` divides by it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.contracts import check_integer, check_range, check_same_device
from kernels.host_math import cdiv, next_pow2
from kernels.launch import launch
from kernels.registry import Config, Inputs, Shape, TunableKernel, register
from kernels.tuning import resolve

DEFAULT_TOPK = 6
DEFAULT_ROUTE_SCALE = 1.5  # V4-Flash; V4-Pro uses 2.5
V4_VOCAB = 129_280
_FP32_BYTES = 4
_INDEX_BYTES = 4


@triton.jit
def _sqrt_softplus(x):
    y = tl.exp(-tl.abs(x))
    series = y * (1.0 - y * (0.5 - y * (1.0 / 3.0 - y * 0.25)))
    log1p_y = tl.where(y < 0.0078125, series, tl.log(1.0 + y))
    return tl.sqrt(tl.maximum(x, 0.0) + log1p_y)


@triton.jit
def _token_tile(n_tokens, TOPK: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's token rows (int64), their mask, the k columns and the [BLOCK_N, K_PAD] mask."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_tokens
    k_cols = tl.arange(0, K_PAD)
    pick_mask = row_mask[:, None] & (k_cols < TOPK)[None, :]
    return rows.to(tl.int64), row_mask, k_cols, pick_mask


@triton.jit
def _top_k(logits_ptr, bias_ptr, rows, row_mask, n_experts, k_cols,
           TOPK: tl.constexpr, E_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, ARGMAX: tl.constexpr):
    """Indices ``[BLOCK_N, K_PAD]`` of the top-k of ``s + bias`` per row; ties: lowest index.

    Each round finds its pick by a max and then a min over the columns holding it, or with
    ``ARGMAX`` by one (value, index) reduction, ``tl.argmax`` (offline sm_90, one token a warp:
    93 instructions a round against 195; at two tokens 178 against 126).
    """
    cols = tl.arange(0, E_PAD)
    col_mask = cols < n_experts
    x = tl.load(logits_ptr + rows[:, None] * n_experts + cols[None, :],
                mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    score = _sqrt_softplus(x)
    if HAS_BIAS:
        score += tl.load(bias_ptr + cols, mask=col_mask, other=0.0)[None, :]
    score = tl.where(col_mask[None, :], score, -float("inf"))
    picks = tl.zeros([rows.shape[0], k_cols.shape[0]], dtype=tl.int32)
    for j in range(TOPK):
        if ARGMAX:
            pick = tl.argmax(score, axis=1, tie_break_left=True)
        else:
            best = tl.max(score, axis=1)
            pick = tl.min(tl.where(score == best[:, None], cols[None, :], E_PAD), axis=1)
        picks = tl.where(k_cols[None, :] == j, pick[:, None], picks)
        score = tl.where(cols[None, :] == pick[:, None], -float("inf"), score)
    return picks


@triton.jit
def _router_fwd_kernel(
    logits_ptr, bias_ptr, token_ids_ptr, tid2eid_ptr, indices_ptr, weights_ptr,
    n_tokens, n_experts, route_scale,
    TOPK: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    HASH: tl.constexpr, HAS_BIAS: tl.constexpr, ARGMAX: tl.constexpr,
):
    rows, row_mask, k_cols, pick_mask = _token_tile(n_tokens, TOPK, K_PAD, BLOCK_N)
    if HASH:
        tokens = tl.load(token_ids_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        picks = tl.load(tid2eid_ptr + tokens[:, None] * TOPK + k_cols[None, :], mask=pick_mask, other=0)
        picks = picks.to(tl.int32)
    else:
        picks = _top_k(logits_ptr, bias_ptr, rows, row_mask, n_experts, k_cols, TOPK, E_PAD, HAS_BIAS, ARGMAX)
    x = tl.load(logits_ptr + rows[:, None] * n_experts + picks, mask=pick_mask, other=0.0)
    s = tl.where(pick_mask, _sqrt_softplus(x), 0.0)
    total = tl.where(row_mask, tl.sum(s, axis=1), 1.0)
    offsets = rows[:, None] * TOPK + k_cols[None, :]
    tl.store(indices_ptr + offsets, picks, mask=pick_mask)
    tl.store(weights_ptr + offsets, s * (route_scale / total)[:, None], mask=pick_mask)


@triton.jit
def _router_bwd_kernel(
    logits_ptr, indices_ptr, grad_weights_ptr, grad_logits_ptr, n_tokens, n_experts, route_scale,
    TOPK: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows, row_mask, k_cols, pick_mask = _token_tile(n_tokens, TOPK, K_PAD, BLOCK_N)
    offsets = rows[:, None] * TOPK + k_cols[None, :]
    picks = tl.load(indices_ptr + offsets, mask=pick_mask, other=0)
    x = tl.load(logits_ptr + rows[:, None] * n_experts + picks, mask=pick_mask, other=0.0)
    s = tl.where(pick_mask, _sqrt_softplus(x), 0.0)
    total = tl.where(row_mask, tl.sum(s, axis=1), 1.0)
    grad_w = tl.load(grad_weights_ptr + offsets, mask=pick_mask, other=0.0)
    # w_j = c s_j / S  =>  dL/ds_j = (c g_j - sum_l g_l w_l) / S,  sum_l g_l w_l = c sum_l g_l s_l / S.
    grad_s = route_scale * (grad_w - (tl.sum(grad_w * s, axis=1) / total)[:, None]) / total[:, None]
    # ds/dx = sigmoid(x) / (2 s), which tends to 0 with s; s is 0 only where it underflowed or is masked.
    positive = s > 0.0
    grad_x = tl.where(positive, grad_s * tl.sigmoid(x) / (2.0 * tl.where(positive, s, 1.0)), 0.0)
    cols = tl.arange(0, E_PAD)
    grad = tl.zeros([BLOCK_N, E_PAD], dtype=tl.float32)
    for j in range(TOPK):
        column = k_cols[None, :] == j
        pick = tl.sum(tl.where(column, picks, 0), axis=1)
        grad += tl.where(cols[None, :] == pick[:, None], tl.sum(tl.where(column, grad_x, 0.0), axis=1)[:, None], 0.0)
    tl.store(grad_logits_ptr + rows[:, None] * n_experts + cols[None, :], grad,
             mask=row_mask[:, None] & (cols < n_experts)[None, :])


def _pads(n_experts: int, topk: int) -> dict[str, int]:
    return {"TOPK": topk, "K_PAD": next_pow2(topk), "E_PAD": next_pow2(n_experts)}


def _forward(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    route_scale: float,
    token_ids: torch.Tensor | None,
    tid2eid: torch.Tensor | None,
    config: Config,
    compile_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on contiguous fp32 ``logits [tokens, experts]``; returns (indices, weights)."""
    n_tokens, n_experts = logits.shape
    indices = torch.empty(n_tokens, topk, dtype=torch.int32, device=logits.device)
    weights = torch.empty(n_tokens, topk, dtype=torch.float32, device=logits.device)
    hashed = tid2eid is not None
    launch(
        _router_fwd_kernel,
        (cdiv(n_tokens, config["BLOCK_N"]),),
        (logits, logits if bias is None else bias, token_ids if hashed else indices, tid2eid if hashed else indices,
         indices, weights, n_tokens, n_experts, route_scale),
        {**_pads(n_experts, topk), "BLOCK_N": config["BLOCK_N"], "HASH": hashed, "HAS_BIAS": bias is not None,
         "ARGMAX": bool(config.get("ARGMAX", 0))},
        config,
        compile_only,
    )
    return indices, weights


def _backward(
    logits: torch.Tensor,
    indices: torch.Tensor,
    grad_weights: torch.Tensor,
    route_scale: float,
    config: Config,
    compile_only: bool = False,
) -> torch.Tensor:
    """Launch the backward; returns the dense fp32 ``dL/dlogits [tokens, experts]``."""
    n_tokens, n_experts = logits.shape
    grad_logits = torch.empty_like(logits)
    launch(
        _router_bwd_kernel,
        (cdiv(n_tokens, config["BLOCK_N"]),),
        (logits, indices, grad_weights, grad_logits, n_tokens, n_experts, route_scale),
        {**_pads(n_experts, indices.shape[1]), "BLOCK_N": config["BLOCK_N"]},
        config,
        compile_only,
    )
    return grad_logits


class _Router(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, bias, topk, route_scale, token_ids, tid2eid):
        shape = {"tokens": logits.shape[0], "experts": logits.shape[1], "topk": topk}
        config, _ = resolve("router_fwd" if tid2eid is None else "router_hash_fwd", shape)
        indices, weights = _forward(logits, bias, topk, route_scale, token_ids, tid2eid, config)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(logits, indices)
        ctx.route_scale, ctx.shape = route_scale, shape
        return indices, weights

    @staticmethod
    def backward(ctx, _grad_indices, grad_weights):
        logits, indices = ctx.saved_tensors
        config, _ = resolve("router_bwd", ctx.shape)
        grad_logits = _backward(logits, indices, grad_weights.float().contiguous(), ctx.route_scale, config)
        return grad_logits, None, None, None, None, None


def route(
    logits: torch.Tensor,
    bias: torch.Tensor | None = None,
    topk: int = DEFAULT_TOPK,
    route_scale: float = DEFAULT_ROUTE_SCALE,
    token_ids: torch.Tensor | None = None,
    tid2eid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``indices [N, k]`` int32 and routing ``weights [N, k]`` fp32 from ``logits [N, E]``.

    Learned routing (default): top-k of ``sqrt(softplus(logits)) + bias``, equal scores
    taking the lowest expert index first. Hash routing: pass ``token_ids [N]`` and the
    ``tid2eid [vocab, k]`` table; ``bias`` is then unused. Weights are differentiable in
    ``logits``; launch parameters come from ``kernels.tuning.resolve``.

    Contract: ``logits [N, E]`` any float dtype (upcast to fp32), ``1 <= topk <= E``, ``bias [E]``;
    ``token_ids [N]`` and ``tid2eid [vocab, topk]`` int32 or int64, token ids in ``[0, vocab)``
    and the table's expert ids in ``[0, E)`` (the kernel gathers with them: an id out of range
    reads out of bounds, so they are checked where ``kernels.contracts`` checks values); all
    on one device, any strides (copied).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [tokens, experts], got {list(logits.shape)}")
    n_tokens, n_experts = logits.shape
    if not 1 <= topk <= n_experts:
        raise ValueError(f"topk must be in [1, {n_experts}], got {topk}")
    check_same_device(logits=logits, bias=bias, token_ids=token_ids, tid2eid=tid2eid)
    if (token_ids is None) != (tid2eid is None):
        raise ValueError("hash routing needs both token_ids and tid2eid")
    if tid2eid is not None:
        if tid2eid.dim() != 2 or tid2eid.shape[1] != topk or token_ids.shape != (n_tokens,):
            raise ValueError(
                f"hash routing needs tid2eid [vocab, {topk}] and token_ids [{n_tokens}], "
                f"got {list(tid2eid.shape)} and {list(token_ids.shape)}"
            )
        check_integer("token_ids", token_ids)
        check_integer("tid2eid", tid2eid)
        check_range("token_ids", token_ids, 0, tid2eid.shape[0], "rows of tid2eid")
        check_range("tid2eid", tid2eid, 0, n_experts, "expert ids")
        tid2eid, token_ids, bias = tid2eid.contiguous(), token_ids.contiguous(), None
    elif bias is not None:
        if bias.shape != (n_experts,):
            raise ValueError(f"bias must be [{n_experts}], got {list(bias.shape)}")
        bias = bias.float().contiguous()
    return _Router.apply(logits.float().contiguous(), bias, topk, route_scale, token_ids, tid2eid)


def route_reference(
    logits: torch.Tensor,
    bias: torch.Tensor | None = None,
    topk: int = DEFAULT_TOPK,
    route_scale: float = DEFAULT_ROUTE_SCALE,
    token_ids: torch.Tensor | None = None,
    tid2eid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager fp32 math of ``route`` (differentiable weights); a stable sort gives its tie rule."""
    s = F.softplus(logits.float()).sqrt()
    if tid2eid is not None:
        indices = tid2eid[token_ids].long()
    else:
        score = s.detach() if bias is None else s.detach() + bias.float()
        indices = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :topk]
    weights = s.gather(-1, indices)
    return indices.int(), weights / weights.sum(-1, keepdim=True) * route_scale


def _distinct_experts(rows: int, n_experts: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """``[rows, topk]`` int32 expert ids, distinct within a row: a random start and a stride coprime to E."""
    strides = torch.tensor([d for d in range(1, n_experts + 1) if math.gcd(d, n_experts) == 1])
    start = torch.randint(n_experts, (rows, 1), generator=gen)
    stride = strides[torch.randint(len(strides), (rows, 1), generator=gen)]
    return ((start + stride * torch.arange(topk)) % n_experts).int()


def _separated_logits(tokens: int, n_experts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and bias whose top-k cannot flip under last-bit differences of exp/log/sqrt.

    Each token's logits are a permutation of E values evenly spaced in (-1, 1), so its
    scores ``s`` lie in (0.55, 1.15), apart by >= 1e-3 for E <= 384; the bias takes values
    in {-1.5, -0.5, 0.5, 1.5}, so it really steers the choice and every pair of
    ``s + bias`` stays at least 1e-3 apart. Random floats would put two scores within a few
    ulps in some token of a large batch, and the reference could then pick the other one.
    """
    grid = -1.0 + 2.0 * (torch.arange(n_experts) + 0.25) / n_experts
    logits = grid[torch.rand(tokens, n_experts, generator=gen).argsort(dim=1)]
    bias = torch.randint(4, (n_experts,), generator=gen).float() - 1.5
    return logits, bias


def _make_fwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    logits, bias = _separated_logits(shape["tokens"], shape["experts"], gen)
    return {"topk": shape["topk"], "logits": logits.to(device), "bias": bias.to(device)}


def _make_hash_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    tokens, n_experts, topk = shape["tokens"], shape["experts"], shape["topk"]
    tensors = {"logits": torch.randn(tokens, n_experts, generator=gen),
               "token_ids": torch.randint(V4_VOCAB, (tokens,), generator=gen),
               "tid2eid": _distinct_experts(V4_VOCAB, n_experts, topk, gen)}
    return {"topk": topk, **{name: t.to(device) for name, t in tensors.items()}}


def _make_bwd_inputs(shape: Shape, device: torch.device, seed: int) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    tokens, n_experts, topk = shape["tokens"], shape["experts"], shape["topk"]
    tensors = {"logits": 2 * torch.randn(tokens, n_experts, generator=gen),
               "indices": _distinct_experts(tokens, n_experts, topk, gen),
               "grad_weights": torch.randn(tokens, topk, generator=gen)}
    return {name: t.to(device) for name, t in tensors.items()}


def _fwd_args(inputs: Inputs) -> tuple:
    return (inputs["logits"], inputs.get("bias"), inputs["topk"], DEFAULT_ROUTE_SCALE,
            inputs.get("token_ids"), inputs.get("tid2eid"))


def _run_fwd(inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(*_fwd_args(inputs), config)


def _compile_fwd(inputs: Inputs, config: Config) -> None:
    _forward(*_fwd_args(inputs), config, compile_only=True)


def _reference_fwd(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    return route_reference(*_fwd_args(inputs))


def _run_bwd(inputs: Inputs, config: Config) -> torch.Tensor:
    return _backward(inputs["logits"], inputs["indices"], inputs["grad_weights"], DEFAULT_ROUTE_SCALE, config)


def _compile_bwd(inputs: Inputs, config: Config) -> None:
    _backward(inputs["logits"], inputs["indices"], inputs["grad_weights"], DEFAULT_ROUTE_SCALE, config,
              compile_only=True)


def _reference_bwd(inputs: Inputs) -> torch.Tensor:
    """dL/dlogits by autograd through the eager math, at the given indices (as a hash table
    with one row per token)."""
    indices = inputs["indices"]
    token_ids = torch.arange(indices.shape[0], device=indices.device)
    with torch.enable_grad():
        logits = inputs["logits"].detach().requires_grad_()
        _, weights = route_reference(logits, None, indices.shape[1], DEFAULT_ROUTE_SCALE, token_ids, indices)
        (grad,) = torch.autograd.grad(weights, logits, inputs["grad_weights"])
    return grad


def _default_config(shape: Shape, row: int | None = None) -> Config:
    """About 4096 values per program (16 tokens of 256 experts), 4 warps.

    ``row`` is the number of values a program holds per token: the padded expert row by default.
    """
    row = row or next_pow2(shape["experts"])
    block_n = max(1, min(256, 4096 // row, next_pow2(shape["tokens"])))
    return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 1}


def _default_topk_config(shape: Shape) -> Config:
    """``_default_config`` with the max-then-min pick of each top-k round (``ARGMAX`` 0)."""
    return {**_default_config(shape), "ARGMAX": 0}


def _default_hash_config(shape: Shape) -> Config:
    """As ``_default_config``, but a hash-routed program holds only the k picks of each token."""
    return _default_config(shape, row=next_pow2(shape["topk"]))


def _bytes_fwd(shape: Shape) -> int:
    """Every logit and the bias read; k indices and weights per token written."""
    tokens, experts, topk = shape["tokens"], shape["experts"], shape["topk"]
    return (tokens + 1) * experts * _FP32_BYTES + tokens * topk * (_INDEX_BYTES + _FP32_BYTES)


def _bytes_hash_fwd(shape: Shape) -> int:
    """Token ids (int64), their table rows and the k picked logits read; indices and weights written."""
    tokens, topk = shape["tokens"], shape["topk"]
    return tokens * (8 + 2 * topk * (_INDEX_BYTES + _FP32_BYTES))


def _bytes_bwd(shape: Shape) -> int:
    tokens, experts, topk = shape["tokens"], shape["experts"], shape["topk"]
    return tokens * topk * (_INDEX_BYTES + 2 * _FP32_BYTES) + tokens * experts * _FP32_BYTES


_SHAPE_FIELDS = ("tokens", "experts", "topk")
_PRESETS = {
    "v4-flash": [{"tokens": t, "experts": 256, "topk": 6} for t in (4096, 16384)],
    "v4-pro": [{"tokens": t, "experts": 384, "topk": 6} for t in (4096, 16384)],
    # Expert counts that are not powers of two, k of 3 and 1, a single token at E = 384.
    "small": [{"tokens": 37, "experts": 7, "topk": 3}, {"tokens": 20, "experts": 7, "topk": 1},
              {"tokens": 1, "experts": 384, "topk": 6}, {"tokens": 33, "experts": 256, "topk": 6}],
}

# Learned (top-k) and hash routing are separate kernels to tune: one reads every logit, the
# other k per token.
for name, make_inputs, default_config, bytes_moved in (
    ("router_fwd", _make_fwd_inputs, _default_topk_config, _bytes_fwd),
    ("router_hash_fwd", _make_hash_inputs, _default_hash_config, _bytes_hash_fwd),
):
    register(
        TunableKernel(
            name=name,
            shape_fields=_SHAPE_FIELDS,
            exact_fields=_SHAPE_FIELDS[1:],
            make_inputs=make_inputs,
            run=_run_fwd,
            reference=_reference_fwd,
            default_config=default_config,
            bytes_moved=bytes_moved,
            compile=_compile_fwd,
            atol=1e-5,
            rtol=1e-4,
            presets=_PRESETS,
        )
    )
register(
    TunableKernel(
        name="router_bwd",
        shape_fields=_SHAPE_FIELDS,
        exact_fields=_SHAPE_FIELDS[1:],
        make_inputs=_make_bwd_inputs,
        run=_run_bwd,
        reference=_reference_bwd,
        default_config=_default_config,
        bytes_moved=_bytes_bwd,
        compile=_compile_bwd,
        atol=1e-5,
        rtol=1e-4,
        presets=_PRESETS,
    )
)
