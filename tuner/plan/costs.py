"""What one layer, one pipeline rank and the machine cost: the inputs of the iteration model.

* :class:`LayerCost` - one layer's measured times, activation bytes and parameters.
* :class:`StageExtras` - the embedding (first stage) and head + loss (last stage).
* :class:`ProfiledCosts` - the layer list of a model as read from the profile table, with the
  communication figures measured next to it (the EP all-to-all, apart from the layer times).
* :class:`Calibration` - every constant the model states rather than measures (bandwidths,
  overlaps, fragmentation, reserves), in one object stored with each plan and refittable
  against real runs.
* :class:`MemoryModel` - peak bytes of one pipeline rank under Megatron mixed precision:

  - static bytes: params x (2 bf16 weight + 4 fp32 main grad) + params x 12 (fp32 master
    weight and two Adam moments) / shards, where the distributed optimizer shards dense
    parameters over the ``dp`` data-parallel ranks and expert parameters over the
    ``dp / ep`` expert-data-parallel ranks (``v4/optim.py`` holds the same 18 bytes);
  - activations: ``max over the schedule's in-flight vectors L of sum_v L[v] * bytes[v]``,
    ``bytes[v]`` being what virtual stage ``v`` keeps per microbatch (``recompute_kept_bytes``
    for a recomputed layer, plus the embedding / head activations on the first / last stage),
    scaled by ``1 + fragmentation``; under 1F1B the one vector is ``(min(pp - rank, m),)``;
  - the recompute workspace: the backward of a recomputed layer first re-runs its forward,
    which materialises the layer's full activations again on top of what the rank holds
    (``activation_bytes - recompute_kept_bytes`` beyond the checkpoint it kept); one such
    backward runs at a time, so a rank that recomputes adds the largest of these over the
    layers it recomputes (0 when it recomputes none), scaled like the activations. The PP = 2
    H200 runs measured this transient: 4.5-6.1 GiB of the peak outside weights and saved
    activations on every rank that recomputes against 1.6-2.6 GiB on the 1F1B ranks that do
    not, where a proxy layer re-materialises 2.9-3.5 GiB
    (docs/findings.md, Training proxy and planner);
  - a fixed p2p buffer and a fixed reserve (CUDA context, NCCL, workspaces).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerCost:
    """One layer's cost per microbatch on one GPU; the planner treats the last layer of a model as its MTP layer.

    ``backward_ms`` excludes recompute. Recomputing the layer adds ``recompute_ms`` (default:
    ``forward_ms``) to the stage's backward and keeps only ``recompute_kept_bytes`` per
    in-flight microbatch instead of ``activation_bytes``. ``param_count`` is what one GPU holds
    (experts already divided by EP), of which ``expert_param_count`` are expert weights.
    """

    kind: str
    forward_ms: float
    backward_ms: float
    activation_bytes: int
    recompute_kept_bytes: int
    param_count: int
    expert_param_count: int = 0
    recompute_ms: float | None = None

    def __post_init__(self) -> None:
        if min(self.forward_ms, self.backward_ms, self.recompute_cost_ms) < 0 or min(
                self.activation_bytes, self.recompute_kept_bytes, self.param_count, self.expert_param_count) < 0:
            raise ValueError(f"layer costs must be >= 0, got {self}")
        if self.recompute_kept_bytes > self.activation_bytes:
            raise ValueError(f"recompute must not keep more than the layer's activations, got {self}")
        if self.expert_param_count > self.param_count:
            raise ValueError(f"expert params are part of the layer's params, got {self}")

    @property
    def freed_bytes(self) -> int:
        """What recomputing this layer frees per in-flight microbatch, and re-materialises while its
        backward runs: ``activation_bytes - recompute_kept_bytes``."""
        return self.activation_bytes - self.recompute_kept_bytes

    @property
    def recompute_cost_ms(self) -> float:
        """Time recomputing this layer adds to its stage's backward."""
        return self.forward_ms if self.recompute_ms is None else self.recompute_ms


@dataclass(frozen=True)
class StageExtras:
    """Costs that are not decoder layers: embedding on the first stage, head + MTP head + loss on the last.

    They are never recomputed, so their activations always count in full per in-flight microbatch.
    Their parameters are dense (replicated over the data-parallel group).
    """

    embedding_forward_ms: float = 0.0
    embedding_backward_ms: float = 0.0
    embedding_activation_bytes: int = 0
    embedding_params: int = 0
    head_forward_ms: float = 0.0
    head_backward_ms: float = 0.0
    head_activation_bytes: int = 0
    head_params: int = 0

    def scaled(self, factor: float) -> StageExtras:
        """The same extras with every time multiplied by ``factor``."""
        return dataclasses.replace(
            self, embedding_forward_ms=self.embedding_forward_ms * factor,
            embedding_backward_ms=self.embedding_backward_ms * factor,
            head_forward_ms=self.head_forward_ms * factor, head_backward_ms=self.head_backward_ms * factor)


@dataclass(frozen=True)
class ProfiledCosts:
    """A model's per-layer costs as profiled at one (GPU kind, seq, mbs, ep), before any parallelism is applied.

    ``alltoall_ms[i]`` is layer ``i``'s EP all-to-all in one forward (dispatch + combine),
    measured apart (``tuner profile alltoall``, the EP group inside one node) and *not* part of
    its ``forward_ms``: the iteration model adds it to the forward, the backward and the
    recompute when ``ep > 1``. ``None`` when not measured.
    ``p2p_bytes`` is what one stage sends the next per microbatch (V4: the 4 mHC streams).
    ``optimizer_ms_per_param`` prices the optimizer step per parameter the GPU updates (None:
    not profiled, the step is left out and the output says so).
    """

    layers: tuple[LayerCost, ...]
    extras: StageExtras
    alltoall_ms: tuple[float | None, ...]
    p2p_bytes: int
    optimizer_ms_per_param: float | None

    def __post_init__(self) -> None:
        if len(self.alltoall_ms) != len(self.layers):
            raise ValueError("alltoall_ms needs one entry per layer")

    def scaled(self, factor: float) -> ProfiledCosts:
        """Every time multiplied by ``factor`` (planning one GPU kind from another kind's profiles)."""
        if not factor > 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        layers = tuple(dataclasses.replace(
            l, forward_ms=l.forward_ms * factor, backward_ms=l.backward_ms * factor,
            recompute_ms=None if l.recompute_ms is None else l.recompute_ms * factor) for l in self.layers)
        return ProfiledCosts(
            layers, self.extras.scaled(factor), tuple(None if a is None else a * factor for a in self.alltoall_ms),
            self.p2p_bytes, None if self.optimizer_ms_per_param is None else self.optimizer_ms_per_param * factor)


GiB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The constants the iteration model states instead of measuring; refit them against real runs.

    Defaults describe an H200 node (NVLink 4, 900 GB/s bidirectional per GPU) with one
    400 Gb/s NIC per GPU, and Megatron's overlapped distributed optimizer.
    """

    intra_node_gbps: float = 360.0
    """Achieved GB/s of one GPU's transfers inside a node (NVLink 450 GB/s per direction, ~80%)."""
    inter_node_gbps: float = 45.0
    """Achieved GB/s of one GPU's transfers across nodes (400 Gb/s NIC = 50 GB/s, ~90%)."""
    p2p_busy_fraction: float = 0.25
    """Share of a pipeline transfer that blocks the sending and the receiving rank (the rest overlaps compute)."""
    dp_overlap: float = 0.5
    """Share of the data-parallel gradient reduce-scatter + parameter all-gather hidden under compute."""
    grad_bytes_per_param: float = 4.0
    """Bytes per parameter the gradient reduce-scatter moves (fp32 main grads)."""
    param_bytes_per_param: float = 2.0
    """Bytes per parameter the parameter all-gather moves (bf16 weights)."""
    fragmentation: float = 0.05
    """Extra share of activation bytes lost to allocator fragmentation."""
    reserved_bytes: float = 5 * GiB
    """Bytes per GPU outside the model: CUDA context, NCCL buffers, library workspaces."""
    p2p_buffers: float = 2.0
    """Pipeline send/receive buffers of ``p2p_bytes`` each that a rank holds."""
    time_scale: float = 1.0
    """Multiplies every profiled time (a run-vs-profile factor, as Primus's projection calibrates 0.87-0.93)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value < 0:
                raise ValueError(f"calibration.{f.name} must be a number >= 0, got {value!r}")
        for name in ("p2p_busy_fraction", "dp_overlap"):
            if getattr(self, name) > 1:
                raise ValueError(f"calibration.{name} is a fraction in [0, 1], got {getattr(self, name)}")
        if min(self.intra_node_gbps, self.inter_node_gbps, self.time_scale) <= 0:
            raise ValueError("calibration bandwidths and time_scale must be > 0")

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        """Rebuild a stored calibration; unknown keys are an error, missing keys take the defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown calibration fields {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes of one pipeline rank by part (what the report stacks against capacity)."""

    weights_and_grads: float
    optimizer: float
    activations: float
    """Peak activation bytes, the recompute workspace included (scaled by the fragmentation factor)."""
    buffers: float
    workspace: float = 0.0
    """Of ``activations``: the recompute workspace (see :meth:`MemoryModel.workspace_bytes`), scaled."""

    @property
    def total(self) -> float:
        return self.weights_and_grads + self.optimizer + self.activations + self.buffers


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """Peak bytes of one pipeline rank under Megatron mixed precision (see the module doc).

    ``dense_shards`` / ``expert_shards`` are the ranks the distributed optimizer shards dense /
    expert parameters over (``dp`` and ``dp / ep``); ``activation_factor`` is ``1 +
    fragmentation``; ``recompute_workspace`` False leaves the recompute workspace out (the
    model before 2026-12-01, for comparisons).
    """

    p2p_buffer_bytes: float
    overhead_bytes: float
    weight_grad_bytes_per_param: float = 2 + 4
    optimizer_bytes_per_param: float = 12
    dense_shards: int = 1
    expert_shards: int = 1
    activation_factor: float = 1.0
    recompute_workspace: bool = True

    def __post_init__(self) -> None:
        if self.dense_shards < 1 or self.expert_shards < 1 or min(
                self.weight_grad_bytes_per_param, self.optimizer_bytes_per_param, self.p2p_buffer_bytes,
                self.overhead_bytes) < 0 or self.activation_factor < 1:
            raise ValueError(f"need shards >= 1, byte counts >= 0 and activation_factor >= 1, got {self}")

    def sharded_params(self, params: float, expert_params: float) -> float:
        """Parameters whose optimizer state (and optimizer step) this rank owns."""
        return (params - expert_params) / self.dense_shards + expert_params / self.expert_shards

    def static_bytes(self, params: float, expert_params: float = 0) -> float:
        """Weights, grads and optimizer state: what the rank holds regardless of microbatches."""
        return params * self.weight_grad_bytes_per_param + self.sharded_params(
            params, expert_params) * self.optimizer_bytes_per_param

    @property
    def fixed_bytes(self) -> float:
        return self.p2p_buffer_bytes + self.overhead_bytes

    @staticmethod
    def in_flight(rank: int, pp: int, microbatches: int, vpp: int = 1) -> int:
        """Megatron's count of (virtual-stage, microbatch) activations rank ``rank`` holds at its peak.

        1F1B: ``min(pp - rank, m)``. Interleaved: its warm-up forwards plus the first steady one,
        ``min(2 (pp - rank - 1) + (vpp - 1) pp + 1, m vpp)``; each counts one virtual stage's bytes.
        """
        if vpp == 1:
            return min(pp - rank, microbatches)
        return min(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, microbatches * vpp)

    def workspace_bytes(self, recomputed: Iterable[LayerCost]) -> float:
        """Unscaled recompute workspace of a rank that recomputes ``recomputed``: the most bytes one of
        them re-materialises beyond its checkpoint, ``max(activation_bytes - recompute_kept_bytes)``,
        0 for none (or with ``recompute_workspace`` off). See the module doc for why."""
        if not self.recompute_workspace:
            return 0.0
        return float(max((l.freed_bytes for l in recomputed), default=0))

    def activation_bytes(self, peaks: Sequence[Sequence[int]], per_stage: Sequence[float],
                         workspace: float = 0.0) -> float:
        """Peak activation bytes of a rank: the worst in-flight vector against each virtual stage's bytes,
        plus the unscaled recompute ``workspace``, all times ``activation_factor``."""
        return self.activation_factor * (max(sum(n * b for n, b in zip(vec, per_stage)) for vec in peaks)
                                         + workspace)

    def breakdown(self, params: float, expert_params: float, peaks: Sequence[Sequence[int]],
                  per_stage: Sequence[float], workspace: float = 0.0) -> MemoryBreakdown:
        """The rank's peak bytes by part; ``workspace`` is its unscaled recompute workspace."""
        return MemoryBreakdown(params * self.weight_grad_bytes_per_param,
                               self.sharded_params(params, expert_params) * self.optimizer_bytes_per_param,
                               self.activation_bytes(peaks, per_stage, workspace), self.fixed_bytes,
                               self.activation_factor * workspace)
