"""The predicted time and memory of one training iteration for a given layout and recompute set.

An :class:`IterationModel` fixes everything but the plan: per-layer costs, the stage extras,
``pp``/``vpp``/microbatches, the pipeline transfer time, the per-rank tail after the last
backward, the memory model and the GPU's capacity. :meth:`IterationModel.evaluate` prices one
plan; the search (``search.py``) finds the best plans of a model. A model built from profiles
(:meth:`IterationModel.from_profiles`) keeps its inputs, so :func:`predict` can re-price a plan
under a refitted :class:`Calibration`.

Time of a step = ``max over ranks (rank's last op end + rank's tail)`` where

* the op ends come from the schedule simulator (``schedule.py``) with, per virtual stage,
  forward = its layers' forwards (+ embedding / head + MTP head + loss on the first / last
  stage) and backward = its layers' backwards + the recompute of the recomputed layers;
* every pipeline transfer of ``p2p_bytes`` is a delay of ``p2p_bytes / bandwidth`` on its data
  edge (inter-node bandwidth if the pipeline spans nodes), of which ``p2p_busy_fraction`` also
  blocks the two ranks: added to each op of a stage once per neighbour on another rank;
* with ``ep > 1``, every MoE layer (all decoder layers and the MTP layer) adds its EP
  all-to-all, ``alltoall_ms`` = dispatch + combine measured across ``ep`` GPUs of one node
  (``tuner profile alltoall``; apart from, not inside, the one-GPU ``forward_ms``): once to its
  forward, once to its backward (the gradients go the same two ways, the same volume) and once
  to its recompute when it is recomputed, not overlapped with compute. While the EP group fits
  in a node that is the measured time; beyond, the share ``x = (ep - gpus_per_node) / (ep - 1)``
  of the volume crosses nodes at inter-node bandwidth, so each of the three becomes
  ``alltoall_ms * (1 + x * (intra / inter - 1))`` (the two links not overlapped with each other:
  an upper end). Unmeasured, it is priced 0 inside a node (``tuner plan`` says so) and refused
  across nodes;
* a rank's tail is its exposed data-parallel traffic, ``(1 - dp_overlap)`` x (ring
  reduce-scatter of fp32 grads + all-gather of bf16 params, ``(s - 1) / s`` of its bytes for a
  group of ``s``: dense params over ``dp``, expert params over ``dp / ep``), plus the optimizer
  step over the parameters it owns, ``optimizer_ms_per_param`` each.

Not modelled: the tied embedding/head gradient all-reduce, gradient clipping's norm reduction,
and compute slowed by overlapped communication (the calibration's ``time_scale`` absorbs them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.plan.costs import Calibration, LayerCost, MemoryBreakdown, MemoryModel, ProfiledCosts, StageExtras
from v4.layout import PipelineLayout, format_layout
from tuner.plan.parallel import Parallelism
from tuner.plan.schedule import ScheduleResult, in_flight_peaks, schedule_name, simulate

BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s moves 1e6 bytes per millisecond


@dataclass(frozen=True)
class PlanInputs:
    """What a model was built from: the profiled costs (already scaled to the target GPU), the parallelism, the GPU."""

    costs: ProfiledCosts
    parallelism: Parallelism
    capacity_bytes: float


@dataclass(frozen=True)
class Evaluation:
    """The predicted step of one plan: time, its parts, and memory per pipeline rank."""

    step_ms: float
    makespan_ms: float
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    tail_ms: tuple[float, ...]
    memory: tuple[MemoryBreakdown, ...]
    schedule: ScheduleResult


@dataclass(frozen=True)
class IterationModel:
    """Prices plans of one (pp, vpp, microbatches); see the module doc for the terms.

    ``layers`` are the decoder layers in order, then the MTP layer. ``tail_ms_per_param`` is
    (per dense, per expert) parameter held by a rank.
    """

    layers: tuple[LayerCost, ...]
    extras: StageExtras
    memory: MemoryModel
    capacity_bytes: float
    pp: int
    vpp: int = 1
    microbatches: int = 1
    p2p_ms: float = 0.0
    p2p_busy_ms: float = 0.0
    tail_ms_per_param: tuple[float, float] = (0.0, 0.0)
    inputs: PlanInputs | None = field(default=None, compare=False)
    calibration: Calibration | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.layers) < 2:
            raise ValueError("need at least one decoder layer and the MTP layer")
        if self.pp < 1 or self.vpp < 1 or self.microbatches < 1:
            raise ValueError(f"need pp, vpp, microbatches >= 1, got {self.pp}, {self.vpp}, {self.microbatches}")
        if self.pp * self.vpp > len(self.layers) + 1:
            raise ValueError(f"{len(self.layers)} layers cannot fill {self.pp * self.vpp} stages")
        if min(self.p2p_ms, self.p2p_busy_ms, *self.tail_ms_per_param) < 0:
            raise ValueError("transfer times and tails must be >= 0")

    @classmethod
    def from_profiles(cls, inputs: PlanInputs, calibration: Calibration) -> IterationModel:
        """Apply the parallelism and the calibration's constants to profiled costs."""
        par, cal = inputs.parallelism, calibration
        costs = inputs.costs.scaled(cal.time_scale) if cal.time_scale != 1 else inputs.costs
        x = par.ep_off_node_fraction
        layers = []
        for layer, alltoall in zip(costs.layers, costs.alltoall_ms):
            if x and alltoall is None:
                raise ValueError(f"the {layer.kind} layer has no measured EP all-to-all (alltoall_ms), needed to "
                                 f"price ep={par.ep} across nodes of {par.cluster.gpus_per_node} GPUs: measure it "
                                 f"with `tuner profile alltoall --ep {par.ep}` and the profiles' --model, --seq, "
                                 f"--mbs, on a node with {par.ep} GPUs")
            measured = (alltoall or 0.0) if par.ep > 1 else 0.0
            extra = measured * (1 + x * (cal.intra_node_gbps / cal.inter_node_gbps - 1))
            layers.append(LayerCost(layer.kind, layer.forward_ms + extra, layer.backward_ms + extra,
                                    layer.activation_bytes, layer.recompute_kept_bytes, layer.param_count,
                                    layer.expert_param_count, layer.recompute_cost_ms + extra))
        p2p_gbps = cal.inter_node_gbps if par.p2p_crosses_nodes else cal.intra_node_gbps
        p2p_ms = costs.p2p_bytes / (p2p_gbps * BYTES_PER_MS_PER_GBPS) if par.pp > 1 else 0.0
        dp_gbps = cal.inter_node_gbps if par.dp_crosses_nodes else cal.intra_node_gbps
        exposed_ms_per_byte = (1 - cal.dp_overlap) / (dp_gbps * BYTES_PER_MS_PER_GBPS)
        step_ms = costs.optimizer_ms_per_param or 0.0

        def tail(shards: int) -> float:
            traffic = (cal.grad_bytes_per_param + cal.param_bytes_per_param) * (shards - 1) / shards
            return traffic * exposed_ms_per_byte + step_ms / shards

        memory = MemoryModel(p2p_buffer_bytes=cal.p2p_buffers * costs.p2p_bytes if par.pp > 1 else 0.0,
                             overhead_bytes=cal.reserved_bytes, dense_shards=par.dp, expert_shards=par.expert_dp,
                             activation_factor=1 + cal.fragmentation)
        return cls(tuple(layers), costs.extras, memory, inputs.capacity_bytes, par.pp, par.vpp, par.microbatches,
                   p2p_ms, cal.p2p_busy_fraction * p2p_ms, (tail(par.dp), tail(par.expert_dp)), inputs, cal)

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

    def busy_ms(self, stage: int) -> float:
        """Transfer time that blocks each op of ``stage``: once per neighbour stage on another rank."""
        if self.pp == 1:
            return 0.0
        return self.p2p_busy_ms * ((stage > 0) + (stage < self.stages - 1))

    def tail_ms(self, params: float, expert_params: float) -> float:
        """Time a rank spends after its last backward on its data-parallel traffic and optimizer step."""
        dense_ms, expert_ms = self.tail_ms_per_param
        return (params - expert_params) * dense_ms + expert_params * expert_ms

    def evaluate(self, layout: PipelineLayout, recompute_layer_ids: Sequence[int] = ()) -> Evaluation:
        """Price one plan: the step by simulation, memory per rank from its in-flight peaks."""
        n = len(self.layers)
        if layout.pp != self.pp or layout.vpp != self.vpp:
            raise ValueError(f"layout {format_layout(layout)} has pp={layout.pp} vpp={layout.vpp}, "
                             f"the model pp={self.pp} vpp={self.vpp}")
        if layout.num_layers + layout.mtp_layers != n or layout.mtp_layers != 1:
            raise ValueError(f"layout {format_layout(layout)} does not hold the model's {n - 1} layers + MTP")
        recompute = set(recompute_layer_ids)
        if not recompute <= set(range(n)):
            raise ValueError(f"recompute ids {sorted(recompute - set(range(n)))} are not layers of the model")
        e = self.extras
        fwd, bwd, kept, params, experts = [], [], [], [0.0] * self.pp, [0.0] * self.pp
        for s, stage in enumerate(layout.stages):
            first, last = s == 0, s == self.stages - 1
            layers = [self.layers[i] for i in stage.layer_ids]
            busy = self.busy_ms(s)
            fwd.append(sum(l.forward_ms for l in layers) + first * e.embedding_forward_ms
                       + last * e.head_forward_ms + busy)
            bwd.append(sum(l.backward_ms for l in layers) + first * e.embedding_backward_ms
                       + last * e.head_backward_ms + busy
                       + sum(self.layers[i].recompute_cost_ms for i in stage.layer_ids if i in recompute))
            kept.append(sum(self.layers[i].recompute_kept_bytes if i in recompute else self.layers[i].activation_bytes
                            for i in stage.layer_ids)
                        + first * e.embedding_activation_bytes + last * e.head_activation_bytes)
            rank = s % self.pp
            params[rank] += sum(l.param_count for l in layers) + first * e.embedding_params + last * e.head_params
            experts[rank] += sum(l.expert_param_count for l in layers)
        result = simulate(self.pp, self.vpp, self.microbatches, fwd, bwd, self.p2p_ms, schedule_name(self.vpp))
        ends = [0.0] * self.pp
        for op in result.ops:
            ends[op.rank] = max(ends[op.rank], op.end)
        tails = tuple(self.tail_ms(params[r], experts[r]) for r in range(self.pp))
        peaks = in_flight_peaks(self.pp, self.vpp, self.microbatches)
        workspace = [self.memory.workspace_bytes(self.layers[i] for stage in layout.stages[r::self.pp]
                                                 for i in stage.layer_ids if i in recompute) for r in range(self.pp)]
        memory = tuple(self.memory.breakdown(params[r], experts[r], peaks[r], kept[r::self.pp], workspace[r])
                       for r in range(self.pp))
        return Evaluation(max(end + tail for end, tail in zip(ends, tails)), result.makespan, tuple(fwd),
                          tuple(bwd), tails, memory, result)


@dataclass(frozen=True)
class Plan:
    """A layout, the global layer ids it recomputes, and what the model predicts for it."""

    layout: PipelineLayout
    recompute_layer_ids: tuple[int, ...]
    model: IterationModel = field(repr=False)
    evaluation: Evaluation = field(repr=False)

    @property
    def layout_text(self) -> str:
        """The ``--pipeline-model-parallel-layout`` string."""
        return format_layout(self.layout)

    @property
    def step_ms(self) -> float:
        return self.evaluation.step_ms

    @property
    def rank_bytes(self) -> tuple[float, ...]:
        """Peak bytes per pipeline rank (all of its virtual stages)."""
        return tuple(m.total for m in self.evaluation.memory)

    @property
    def headroom_bytes(self) -> tuple[float, ...]:
        return tuple(self.model.capacity_bytes - b for b in self.rank_bytes)


def predict(plan: Plan, calibration: Calibration | None = None) -> tuple[float, tuple[float, ...]]:
    """``(step_ms, peak bytes per pipeline rank)`` of ``plan``, optionally under another calibration.

    The seam for validating plans against real runs: compare with the measured step and
    per-rank peaks, refit the calibration, predict again.
    """
    model = plan.model
    if calibration is not None:
        if model.inputs is None:
            raise ValueError("this plan's model was not built from profiles; it cannot be re-calibrated")
        model = IterationModel.from_profiles(model.inputs, calibration)
    evaluation = model.evaluate(plan.layout, plan.recompute_layer_ids)
    return evaluation.step_ms, tuple(m.total for m in evaluation.memory)
