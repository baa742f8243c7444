"""Per-layer cost profiles of a V4 model on one device: ``profile_layers(...) -> list[LayerCost]``.

For each layer kind the model has (``v4.config.layer_kind``: window / CSA / HCA × hash / learned
routing, the MTP layer) plus the embedding and the head with its losses, one piece is built
alone (``v4.model.build_*``), measured and freed before the next, so a full-width V4-Flash
layer fits next to nothing else. Per piece, for one microbatch of ``mbs × seq`` tokens:

* ``forward_ms`` / ``backward_ms``: the forward, then the backward from a random output gradient
  (the head: from its loss ``lm + mtp_loss_scale · mtp``), with the optimizer's main-gradient
  hooks attached as in training;
* ``recompute_backward_ms``: the backward of a forward run under full (non-reentrant) checkpoint,
  i.e. the recomputed forward plus the backward;
* ``activation_bytes`` / ``recompute_kept_bytes``: bytes saved for backward
  (``v4.memory.SavedActivations``, weights and buffers left out) by a plain forward, and by the
  checkpointed one (its inputs); ``selective_kept_bytes``: for a decoder or MTP layer, the bytes
  saved with each selective-recompute module (``v4.recompute.SELECTIVE_MODULES``) on alone;
* ``params``: every parameter, frozen ones included (``expert_params`` of them the routed experts'
  weights, the part expert parallelism divides); ``optimizer_ms_per_param``: the median time
  of ``MixedPrecisionAdamW.step`` over the piece's trainable parameters, divided by their count;
* ``p2p_bytes``: what the piece's stage would send on per microbatch: the four mHC streams
  ``[mbs, seq, 4, hidden]`` (the MTP layer adds its ``[mbs, seq, hidden]`` output; the head sends
  nothing).

Not in any of these times: the expert-parallel all-to-all. One device has no EP peers, so the
dispatch and combine a MoE layer runs with ``ep > 1`` are measured apart, across ``ep`` GPUs of
one node, by ``tuner profile alltoall`` (``workers.alltoall_cost``); the planner adds that time
to each MoE layer's forward, backward and recompute.

Timing: CUDA events around each phase after ``warmup`` rounds, the median of ``reps`` rounds on
a GPU; the wall clock (``time.perf_counter``) on the CPU. With ``trace_dir``, one more round of
forward + backward per piece runs under ``torch.profiler``: ``<kind>.json`` (a Chrome trace) and
``<kind>.txt`` (the ops by device time, the CPU's where there is no GPU) show where a layer's time
goes when it is slower than its kernels; on a GPU, ``kernel_shares.json`` gives each kind's device
time in GEMMs, attention and the rest, the total over the first two, and the host syncs of that round
with where each was made (``tuner.train.kernel_shares``).

Expert parallelism: with ``ep = N`` the decoder and MTP layers are built from the config with
``experts / N`` experts (the experts one EP rank holds) and the same ``experts_per_token = k``.
Fed the rank's own ``mbs × seq`` tokens, the router sends each token to ``k`` of the local
experts, so the local experts together receive ``mbs · seq · k`` (token, expert) rows,
``mbs · seq · k · N / experts`` per expert: what a rank's experts receive from all N EP peers
(each dispatching ``1 / N`` of its ``mbs · seq · k`` rows to each rank) when routing is uniform
over all experts. The hash-routed layers' token→expert table is uniform over the local experts
by construction; learned routing from the random initial gate is near-uniform. The gate itself
is then ``experts / N`` rows instead of ``experts`` (router FLOPs ``2 · hidden · experts`` per
token, under 1 % of a V4-Flash layer), and the dispatch / combine all-to-all is not timed here
(see above).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tuner.train.kernel_shares import device_activities, host_syncs, time_shares, with_timed_ms
from v4.config import STREAMS, ModelConfig, ModelArgumentError, expert_parallel_config, layer_kind
from v4.memory import SavedActivations
from v4.moe import MoE
from v4.model import Block, build_embedding, build_head, build_layer, set_selective, to_streams
from v4.recompute import SELECTIVE_MODULES
from v4.optim import MixedPrecisionAdamW


class ProfileError(ModelArgumentError):
    """Profile arguments that do not fit the model; the message names the argument."""


@dataclass(frozen=True)
class LayerCost:
    """One piece's measured costs for one microbatch (see the module doc for each figure)."""

    layer_kind: str
    forward_ms: float
    backward_ms: float
    recompute_backward_ms: float
    activation_bytes: int
    recompute_kept_bytes: int
    params: int
    expert_params: int
    optimizer_ms_per_param: float
    p2p_bytes: int
    selective_kept_bytes: dict[str, int] | None = None


@dataclass
class Piece:
    """A module, a maker of fresh inputs, and how its outputs become the tensors to differentiate."""

    kind: str
    module: nn.Module
    inputs: Callable[[], tuple[Tensor, ...]]
    roots: Callable[[object], tuple[list[Tensor], list[Tensor | None]]]
    p2p_bytes: int


def _random_grads(outputs: Tensor | tuple[Tensor, ...]) -> tuple[list[Tensor], list[Tensor | None]]:
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    return outs, [torch.randn_like(o) * 1e-2 for o in outs]


def pieces(config: ModelConfig, local: ModelConfig, seq: int, mbs: int, kernels: str,
           device: torch.device, dtype: torch.dtype) -> list[Callable[[], Piece]]:
    """Builders of one piece per kind, in model order; each builds only when called."""
    element = torch.empty((), dtype=dtype).element_size()
    streams_bytes = mbs * seq * STREAMS * config.hidden * element

    def ids() -> Tensor:
        return torch.randint(config.vocab, (mbs, seq), device=device)

    def act(*shape: int) -> Tensor:
        return torch.randn(mbs, seq, *shape, device=device, dtype=dtype).requires_grad_()

    def layer(layer_id: int) -> Callable[[], Piece]:
        def build() -> Piece:
            module = build_layer(local, layer_id, kernels, device=device, dtype=dtype)
            if layer_id == config.mtp_id:
                return Piece("mtp", module, lambda: (act(STREAMS, config.hidden), act(config.hidden), ids()),
                             _random_grads, streams_bytes + mbs * seq * config.hidden * element)
            return Piece(layer_kind(config, layer_id), module, lambda: (act(STREAMS, config.hidden), ids()),
                         _random_grads, streams_bytes)
        return build

    def embedding() -> Piece:
        module = build_embedding(config, device, dtype)
        return Piece("embedding", _Streams(module), lambda: (ids(),), _random_grads, streams_bytes)

    def head() -> Piece:
        module = build_head(config, kernels, device, dtype)
        mtp = config.mtp_layers > 0

        def inputs() -> tuple[Tensor, ...]:
            main = (act(STREAMS, config.hidden), ids())
            return main + (act(config.hidden), ids()) if mtp else main

        def loss(outputs: object) -> tuple[list[Tensor], list[Tensor | None]]:
            lm, mtp_loss = outputs
            return [lm + config.mtp_loss_scale * mtp_loss], [None]

        return Piece("head", module, inputs, loss, 0)

    first_of_kind: dict[str, int] = {}
    for layer_id in config.layer_ids:
        first_of_kind.setdefault(layer_kind(config, layer_id), layer_id)
    return [embedding, *(layer(i) for i in first_of_kind.values()), head]


class _Streams(nn.Module):
    """The embedding as the first stage uses it: token ids → the four residual streams."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding

    def forward(self, token_ids: Tensor) -> Tensor:
        return to_streams(self.embedding(token_ids))


def _timed(device: torch.device, fn: Callable[[], object]) -> tuple[float, object]:
    """``fn()`` and its time in ms: CUDA events on a GPU, the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out
    start_s = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start_s) * 1e3, out


def _trace(piece: Piece, device: torch.device, trace_dir: Path) -> dict | None:
    """One profiled forward + backward of ``piece``: a Chrome trace and the op table (see the module doc);
    on a GPU, its device time by kernel class (``tuner.train.kernel_shares``)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    inputs = piece.inputs()
    with torch.profiler.profile(activities=activities) as prof:
        with host_syncs(device.type == "cuda") as syncs:
            roots, grads = piece.roots(piece.module(*inputs))
            torch.autograd.backward(roots, grads)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    name = piece.kind.replace("/", "-")
    prof.export_chrome_trace(str(trace_dir / f"{name}.json"))
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    (trace_dir / f"{name}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
    if device.type == "cuda":
        return {"kind": piece.kind, **time_shares(device_activities(prof)), "host_syncs": sum(syncs.values()),
                "host_sync_sites": dict(syncs.most_common(8))}
    return None


def _measure(piece: Piece, device: torch.device, warmup: int, reps: int, fused_optimizer: bool) -> LayerCost:
    module = piece.module
    params = list(module.parameters())
    # its hooks move .grad into main_grad, as in training; fused with the Triton kernels, as training's is
    optimizer = MixedPrecisionAdamW(params, lr=1e-4, fused=fused_optimizer)
    forward = lambda inputs: module(*inputs)  # noqa: E731
    recomputed = lambda inputs: checkpoint(module, *inputs, use_reentrant=False)  # noqa: E731

    def backward(outputs: object) -> None:
        roots, grads = piece.roots(outputs)
        torch.autograd.backward(roots, grads)

    def times(run_forward: Callable[[tuple[Tensor, ...]], object]) -> tuple[list[float], list[float]]:
        fwd, bwd = [], []
        for round_ in range(warmup + reps):
            inputs = piece.inputs()
            fwd_ms, outputs = _timed(device, lambda: run_forward(inputs))
            bwd_ms, _ = _timed(device, lambda: backward(outputs))
            if round_ >= warmup:
                fwd.append(fwd_ms)
                bwd.append(bwd_ms)
        return fwd, bwd

    def saved_bytes(run_forward: Callable[[tuple[Tensor, ...]], object]) -> int:
        meter = SavedActivations(exclude=[*params, *module.buffers()])
        inputs = piece.inputs()
        with meter:
            outputs = run_forward(inputs)
        kept = meter.live_bytes
        del outputs
        return kept

    def selective_bytes() -> dict[str, int] | None:
        if not any(isinstance(m, Block) for m in module.modules()):
            return None
        kept = {}
        for name in SELECTIVE_MODULES:
            set_selective(module, frozenset({name}))
            kept[name] = saved_bytes(forward)
        set_selective(module, frozenset())
        return kept

    fwd, bwd = times(forward)
    _, recompute_bwd = times(recomputed)
    steps = [_timed(device, optimizer.step)[0] for _ in range(warmup + reps)][warmup:]
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return LayerCost(
        layer_kind=piece.kind, forward_ms=statistics.median(fwd), backward_ms=statistics.median(bwd),
        recompute_backward_ms=statistics.median(recompute_bwd), activation_bytes=saved_bytes(forward),
        recompute_kept_bytes=saved_bytes(recomputed), params=sum(p.numel() for p in params),
        expert_params=sum(m.w13.numel() + m.w2.numel() for m in module.modules() if isinstance(m, MoE)),
        optimizer_ms_per_param=statistics.median(steps) / trainable, p2p_bytes=piece.p2p_bytes,
        selective_kept_bytes=selective_bytes())


def profile_layers(config: ModelConfig, seq: int, mbs: int = 1, ep: int = 1, kernels: str = "eager",
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16, warmup: int = 1,
                   reps: int = 3, on_piece: Callable[[str], None] = lambda _: None,
                   trace_dir: Path | None = None) -> list[LayerCost]:
    """Measure each piece of ``config`` alone on ``device`` (see the module doc); one ``LayerCost`` per kind.
    With ``trace_dir`` (created if missing), also write each piece's profiler trace there."""
    if seq < 1 or mbs < 1 or reps < 1 or warmup < 0:
        raise ProfileError(f"need seq, mbs, reps >= 1 and warmup >= 0; got seq={seq}, mbs={mbs}, "
                           f"reps={reps}, warmup={warmup}")
    device = torch.device(device)
    local = expert_parallel_config(config, ep)
    if trace_dir is not None:
        try:
            trace_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # before any measurement, so a bad path costs nothing
            raise ProfileError(f"trace: cannot create the folder {trace_dir}: {exc.strerror}") from None
    costs, shares = [], []
    for build in pieces(config, local, seq, mbs, kernels, device, dtype):
        piece = build()
        on_piece(piece.kind)
        costs.append(_measure(piece, device, warmup, reps, fused_optimizer=kernels == "triton"))
        if trace_dir is not None and (share := _trace(piece, device, trace_dir)) is not None:
            shares.append(with_timed_ms(share, costs[-1].forward_ms + costs[-1].backward_ms))
            # written after each piece: a run cut short keeps the kinds it finished
            (trace_dir / "kernel_shares.json").write_text(json.dumps(shares, indent=1) + "\n")
        del piece
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return costs
