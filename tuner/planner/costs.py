"""Per-layer costs and the per-stage memory model the layout/recompute planner searches over.

The planner needs, for any contiguous run of layers on any pipeline stage, its forward and
backward time and its peak memory with a chosen set of layers recomputed. Times add up per
layer; memory follows Megatron mixed-precision training with 1F1B (vpp = 1):

* static bytes = params x (2 bf16 weight + 4 fp32 main grad)
  + params x 12 (fp32 master weight + two Adam moments), divided by ``dp`` when the
  distributed optimizer shards it;
* activation bytes = in_flight(stage) x sum over the stage's layers of ``activation_bytes``
  (``recompute_kept_bytes`` for a recomputed layer), plus the embedding / head+MTP+loss
  activations on the first / last stage; in_flight(stage i of p) = min(p - i, microbatches);
* plus a fixed p2p buffer and a fixed overhead (allocator, workspaces) per stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerCost:
    """One layer's measured cost; the planner treats the last layer of a model as its MTP layer.

    ``backward_ms`` excludes recompute: recomputing the layer adds ``forward_ms`` to the stage's
    backward and keeps only ``recompute_kept_bytes`` per in-flight microbatch instead of
    ``activation_bytes``.
    """

    kind: str
    forward_ms: float
    backward_ms: float
    activation_bytes: int
    recompute_kept_bytes: int
    param_count: int

    def __post_init__(self) -> None:
        if min(self.forward_ms, self.backward_ms) < 0 or min(self.activation_bytes, self.recompute_kept_bytes,
                                                              self.param_count) < 0:
            raise ValueError(f"layer costs must be >= 0, got {self}")
        if self.recompute_kept_bytes > self.activation_bytes:
            raise ValueError(f"recompute must not keep more than the layer's activations, got {self}")


@dataclass(frozen=True)
class StageExtras:
    """Costs that are not decoder layers: embedding on the first stage, head+MTP head+loss on the last.

    They are never recomputed, so their activations always count in full per in-flight microbatch.
    """

    embedding_forward_ms: float = 0.0
    embedding_backward_ms: float = 0.0
    embedding_activation_bytes: int = 0
    embedding_params: int = 0
    head_forward_ms: float = 0.0
    head_backward_ms: float = 0.0
    head_activation_bytes: int = 0
    head_params: int = 0


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """Peak bytes of one pipeline stage under Megatron mixed precision and 1F1B (see module doc).

    ``bytes_per_param_static`` is everything kept per parameter (2 + 4 + 12 by default), of which
    ``optimizer_bytes_per_param`` (fp32 master + Adam moments) is sharded over ``dp`` when
    ``distributed_optimizer`` is on.
    """

    p2p_buffer_bytes: int
    overhead_bytes: int
    bytes_per_param_static: float = 2 + 4 + 12
    optimizer_bytes_per_param: float = 12
    dp: int = 1
    distributed_optimizer: bool = True

    def __post_init__(self) -> None:
        if self.dp < 1 or not 0 <= self.optimizer_bytes_per_param <= self.bytes_per_param_static:
            raise ValueError(f"need dp >= 1 and 0 <= optimizer bytes <= static bytes per param, got {self}")

    def static_bytes(self, params: int) -> float:
        """Weights, grads and optimizer state: what the stage holds regardless of microbatches."""
        sharded = self.optimizer_bytes_per_param if self.distributed_optimizer else 0.0
        return params * (self.bytes_per_param_static - sharded) + params * sharded / self.dp

    @staticmethod
    def in_flight(stage: int, pp: int, microbatches: int) -> int:
        """Microbatches whose activations stage ``stage`` holds at its 1F1B peak."""
        return min(pp - stage, microbatches)

    def stage_bytes(self, params: int, in_flight: int, activation_bytes_per_microbatch: float) -> float:
        """Peak bytes of a stage holding ``params`` and ``in_flight`` microbatches of activations."""
        return (self.static_bytes(params) + in_flight * activation_bytes_per_microbatch
                + self.p2p_buffer_bytes + self.overhead_bytes)
