"""A short V4 training run over a pipeline layout, measured per iteration: ``train(run) -> RunResult``.

``train`` runs inside an already-initialised process group (gloo on CPU, NCCL on GPU; rank and
world from ``torch.distributed``). Ranks form a ``dp × pp`` grid: pipeline rank ``rank % pp``,
data-parallel replica ``rank // pp``. Each pipeline rank builds the stages the layout gives it
(stage ``i`` on rank ``i % pp``, ``v4.stages``) and runs ``torch.distributed.pipelining``'s
``Schedule1F1B`` (one stage per rank) or ``ScheduleInterleaved1F1B`` (vpp > 1).

Each iteration, in order, and why:
1. every replica draws its ``gbs / dp`` samples (``v4.data``), split into microbatches of ``mbs``;
2. the schedule runs forward and backward of every microbatch; the loss stage returns the
   microbatch losses, the loss function scales them by ``1 / microbatches`` (so gradients are
   means; the schedule's own grad scaling is off because gradients live in ``main_grad``);
3. the embedding copies (``E`` and ``m`` on different stages) sum their gradients, so they stay
   tied as in Megatron's embedding group;
4. data-parallel replicas average their main gradients (one all-reduce per rank);
5. the global gradient norm (summed over the pipeline, each shared weight once) clips the step of
   ``v4.optim.MixedPrecisionAdamW``;
6. the time of the iteration is taken between barriers (after a CUDA synchronise), and the losses
   are averaged over microbatches and replicas and shared with every rank.

Memory per pipeline rank: on CUDA the peak allocated / reserved bytes; on every device the peak of
bytes saved for backward (``v4.memory``), which on CPU is the activation figure. An out-of-memory
error is caught and reported as ``status="oom"`` with the failing rank's first stage; the other
ranks cannot be told mid-schedule and fail when their next exchange with it times out (the process
group's timeout), reporting ``status="error"``: ``merge_results`` keeps the OOM.

Throughput excludes the first ``warmup_iters`` iterations (compilation, allocator growth); the
learning rate is constant. Model FLOPs come from ``v4.flops`` (recompute not counted).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from datetime import timedelta
from typing import Literal, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

from v4.layout import PipelineLayout, even_layout, parse_layout
from v4.config import ModelConfig, load_preset
from v4.data import MarkovTokens
from v4.flops import model_flops
from v4.graphs import graph_layers
from v4.memory import SavedActivations
from v4.ops import Kernels
from v4.optim import MixedPrecisionAdamW, clip_coefficient
from v4.recompute import RecomputePlan
from v4.stages import StageModule, build_stage, stage_io

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class RunConfig(BaseModel):
    """One training run. ``layout`` None means Megatron's even split over ``pp`` stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str
    layout: str | None = None
    pp: PositiveInt = 1
    recompute: str = "none"
    gbs: PositiveInt
    mbs: PositiveInt = 1
    seq: PositiveInt
    iters: PositiveInt
    warmup_iters: int = Field(1, ge=0, description="iterations left out of the throughput figures")
    lr: PositiveFloat = 1e-3
    weight_decay: float = Field(0.1, ge=0)
    clip_grad: PositiveFloat | None = 1.0
    seed: int = 0
    weight_noise: float = Field(0.0, ge=0, le=0.01, description=(
        "relative Gaussian noise multiplied into every weight after init: at bf16 rounding size it measures how "
        "far rounding alone moves the loss curve (the training ladder's parity band)"))
    weight_noise_seed: int = Field(0, ge=0, description=(
        "which draw of that noise: several perturbed runs give the parity band its spread"))
    kernels: Kernels = "eager"
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    cuda_graphs: bool = Field(False, description=(
        "capture each layer's forward and backward as CUDA graphs, replayed per microbatch (v4.graphs): "
        "the host's launches stop limiting the step; needs pp 1, the Triton kernels, no recompute, CUDA"))
    profile_step: bool = Field(False, description=(
        "after the measured iterations, one more under torch.profiler: where that step's time went, by kernel "
        "(RunResult.profiled_step); it is left out of every other figure"))

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.warmup_iters >= self.iters:
            raise ValueError(f"warmup_iters={self.warmup_iters} leaves no measured iteration of iters={self.iters}")
        if self.gbs % self.mbs:
            raise ValueError(f"gbs={self.gbs} is not a multiple of mbs={self.mbs}")
        layout = self.pipeline_layout()  # the preset, layout and recompute text must all fit together
        plan = RecomputePlan.parse(self.recompute)
        plan.check(len(self.model().layer_ids))
        if self.cuda_graphs:
            why = [reason for bad, reason in (
                (self.device != "cuda", f"device cuda (got {self.device})"),
                (self.kernels != "triton", f"kernels triton (got {self.kernels}: the eager ops sync with the host)"),
                (len(layout.stages) != self.pp, "one stage per pipeline rank (a layout without virtual stages)"),
                (self.pp != 1, f"pp 1, one microbatch in flight (got pp {self.pp})"),
                (bool(plan.full_layers) or bool(plan.selective), f"no recompute (got {self.recompute!r})"),
            ) if bad]
            if why:
                raise ValueError("cuda_graphs needs " + "; ".join(why))
        return self

    def model(self) -> ModelConfig:
        return load_preset(self.preset)

    def pipeline_layout(self) -> PipelineLayout:
        config = self.model()
        if self.layout is None:
            return even_layout(config.layers, self.pp, 1, config.mtp_layers)
        return parse_layout(self.layout, config.layers, self.pp, config.mtp_layers)


class StageMemory(BaseModel):
    """Memory of one pipeline rank (all its virtual stages); CUDA figures are None on CPU."""

    rank: int
    stages: list[int]
    params: int
    static_bytes: int = Field(description="weights (frozen ones too), fp32 main grads, masters and moments")
    saved_activation_peak_bytes: int
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None


class ProfiledStep(BaseModel):
    """One iteration under ``torch.profiler``: its wall time, and the summed microseconds of each name
    that ran: on CUDA every device activity (kernels, copies, memsets; a CUDA graph's kernels one by
    one), on the CPU every op's self time. Their sum against the wall time is how busy the device was.
    ``idle_before_us`` (CUDA): the device's idle gaps between its first and last activity, each summed
    under the name of the activity that ended it: what the device was waiting for the host to launch."""

    wall_s: float
    by_name_us: dict[str, float]
    idle_before_us: dict[str, float] = Field(default_factory=dict)


class RunResult(BaseModel):
    """What a run measured; ``status`` ok, oom (``stage`` says where) or error (``message`` says what)."""

    status: Literal["ok", "oom", "error"]
    stage: int | None = None
    message: str = ""
    world: int
    pp: int
    vpp: int
    dp: int
    microbatches: int
    iteration_times_s: list[float] = Field(default_factory=list)
    losses: list[float] = Field(default_factory=list)
    mtp_losses: list[float] = Field(default_factory=list)
    stage_memory: list[StageMemory] = Field(default_factory=list)
    tokens_per_s_per_gpu: float | None = None
    model_tflops_per_gpu: float | None = None
    profiled_step: ProfiledStep | None = None


class _Grid:
    """This rank's place in the dp × pp grid and the process groups it communicates in."""

    def __init__(self, pp: int, layout: PipelineLayout):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world % pp:
            raise ValueError(f"world size {self.world} is not a multiple of pp={pp}")
        self.pp, self.dp = pp, self.world // pp
        self.pp_rank, self.replica = self.rank % pp, self.rank // pp
        # every rank creates every group, in the same order (new_group is collective)
        self.pp_group = self._pick([[d * pp + i for i in range(pp)] for d in range(self.dp)])
        self.dp_group = self._pick([[d * pp + i for d in range(self.dp)] for i in range(pp)])
        holders = sorted({layout.rank_of(s) for s, st in enumerate(layout.stages) if {"E", "m"} & set(st.symbols)})
        self.tie_group = None  # the ranks holding the two embedding copies, when they differ
        if len(holders) > 1:
            self.tie_group = self._pick([[d * pp + i for i in holders] for d in range(self.dp)])

    def _pick(self, rank_lists: list[list[int]]) -> dist.ProcessGroup | None:
        mine = None
        for ranks in rank_lists:
            group = dist.new_group(ranks) if len(ranks) < self.world else dist.group.WORLD
            if self.rank in ranks:
                mine = group
        return mine


def _device(run: RunConfig) -> torch.device:
    if run.device == "cpu":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def check_microbatches(microbatches: int, pp: int, vpp: int) -> None:
    """Raise ``ValueError`` unless the schedule takes ``microbatches`` per replica (torch's rules).

    1F1B needs at least ``pp``; the interleaved schedule a multiple of ``pp`` (recent torch
    relaxes this, older releases do not, so the stricter rule holds everywhere).
    """
    if microbatches < pp:
        raise ValueError(f"{microbatches} microbatches per replica is fewer than pp={pp}; 1F1B needs at least pp")
    if vpp > 1 and microbatches % pp:
        raise ValueError(f"the interleaved schedule (vpp={vpp}) needs microbatches per replica to be a multiple "
                         f"of pp={pp}, got {microbatches}; change gbs, mbs or the data-parallel size")


def _perturb(params: list[torch.Tensor], scale: float, seed: int) -> None:
    """Multiply each weight by ``1 + scale * N(0, 1)``, elementwise, from a generator of its own seed
    (drawn on the CPU, so a run is perturbed the same on every device)."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in params:
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            param.copy_((param.float() * (1 + scale * noise.to(param.device))).to(param.dtype))


class _Run:
    """One rank's stages, schedule, optimizer and data: built once (allocating), then stepped per iteration."""

    def __init__(self, run: RunConfig, config: ModelConfig, layout: PipelineLayout, grid: _Grid, microbatches: int):
        self.run, self.config, self.layout, self.grid, self.microbatches = run, config, layout, grid, microbatches
        self.device = _device(run)
        dtype = _DTYPES[run.dtype]
        plan = RecomputePlan.parse(run.recompute)
        self.stage_ids = [s for s in range(len(layout.stages)) if layout.rank_of(s) == grid.pp_rank]
        self.modules: list[StageModule] = [
            build_stage(config, layout.stages[s], plan, run.kernels, self.device, dtype, run.seed)
            for s in self.stage_ids]
        if run.weight_noise:
            _perturb([p for m in self.modules for p in m.parameters()], run.weight_noise, run.seed + run.weight_noise_seed)
        stages = [PipelineStage(module, s, len(layout.stages), self.device,
                                *stage_io(config, layout, s, run.mbs, run.seq, dtype), group=grid.pp_group)
                  for module, s in zip(self.modules, self.stage_ids)]
        self.records: list[torch.Tensor] = []
        if layout.vpp == 1:
            self.schedule = Schedule1F1B(stages[0], microbatches, loss_fn=self._loss, scale_grads=False)
        else:
            self.schedule = ScheduleInterleaved1F1B(stages, microbatches, loss_fn=self._loss, scale_grads=False)
        self.optimizer = MixedPrecisionAdamW([p for m in self.modules for p in m.parameters()], run.lr,
                                             weight_decay=run.weight_decay, fused=run.kernels == "triton")
        if run.cuda_graphs:  # after the optimizer: the captured expert kernels write into its main_grad
            for module in self.modules:
                graph_layers(list(module.layers), module.mtp, config, run.mbs, run.seq, self.device, dtype)
        tied = sum(1 for st in layout.stages if {"E", "m"} & set(st.symbols)) > 1
        self.embeddings = [m.embedding.weight for m in self.modules if m.embedding is not None] if tied else []
        # the norm counts the shared embedding once: on the E stage, not on the m stage's copy
        self.duplicates = [m.embedding.weight for m in self.modules if m.embedding is not None and not m.first]
        self.has_last = any(m.last for m in self.modules)
        self.data = MarkovTokens(config.vocab, run.seed)
        self.drawn_ahead: tuple[int, torch.Tensor] | None = None  # (iteration, its tokens on the host)
        self.exclude = [t for m in self.modules for t in (*m.parameters(), *m.buffers())]

    def _loss(self, output: tuple[torch.Tensor, torch.Tensor], _target: torch.Tensor) -> torch.Tensor:
        """The schedule calls this with each microbatch's stage output (the losses) and its target.

        The loss stage already computed the losses from its tokens; the schedule only calls a
        loss function when given a target, so the token batch is passed as one too.
        """
        lm, mtp = output
        self.records.append(torch.cat((lm, mtp)).detach().float())
        return (lm + self.config.mtp_loss_scale * mtp).sum() / self.microbatches

    def _tie_embeddings(self) -> None:
        """Give every copy of the embedding the sum of all copies' gradients."""
        if not self.embeddings:
            return
        total = self.embeddings[0].main_grad.clone()
        for weight in self.embeddings[1:]:
            total += weight.main_grad
        if self.grid.tie_group is not None:
            dist.all_reduce(total, group=self.grid.tie_group)
        for weight in self.embeddings:
            weight.main_grad.copy_(total)

    def _draw(self, iteration: int) -> torch.Tensor:
        """Iteration ``iteration``'s token batch of this replica, on the host."""
        return self.data.batch(iteration, self.grid.replica, self.run.gbs // self.grid.dp, self.run.seq)

    def _tokens(self, iteration: int) -> torch.Tensor:
        """Iteration ``iteration``'s token batch on the host: drawn ahead by the previous step, else now."""
        drawn, self.drawn_ahead = self.drawn_ahead, None
        return drawn[1] if drawn is not None and drawn[0] == iteration else self._draw(iteration)

    def step(self, iteration: int, meter: SavedActivations) -> torch.Tensor:
        """One training iteration; returns [lm_loss, mtp_loss] averaged over microbatches and replicas.

        The next iteration's tokens are drawn here, once the step's work is queued and before the host waits
        for it: drawing a batch of the Markov chain takes the host about 60 ms (gbs 8, seq 4,096), which
        the GPU spent idle at the start of every step when each step drew its own (``docs/findings.md``).
        """
        tokens = self._tokens(iteration).to(self.device)
        self.optimizer.zero_grad()
        self.records.clear()
        with meter:  # every stage gets its microbatch of tokens; the loss stage's target, see _loss
            self.schedule.step(target=tokens if self.has_last else None, tokens=tokens)
        self.drawn_ahead = (iteration + 1, self._draw(iteration + 1))
        self._tie_embeddings()
        if self.grid.dp > 1:
            dist.all_reduce(self.optimizer.main_grads, group=self.grid.dp_group)
            self.optimizer.main_grads.div_(self.grid.dp)
        grad_sq = self.optimizer.grad_sq(skip=self.duplicates).reshape(1)
        dist.all_reduce(grad_sq, group=self.grid.pp_group)
        self.optimizer.step(grad_scale=clip_coefficient(float(grad_sq), self.run.clip_grad))
        losses = torch.zeros(2, device=self.device)
        if self.records:
            losses += torch.stack(self.records).sum(0) / (self.microbatches * self.grid.dp)
        dist.all_reduce(losses)
        return losses

    def memory(self, meter: SavedActivations) -> StageMemory:
        cuda = self.device.type == "cuda"
        params = [p for m in self.modules for p in m.parameters()]
        return StageMemory(
            rank=self.grid.rank, stages=self.stage_ids, params=sum(p.numel() for p in params),
            static_bytes=sum(p.numel() * p.element_size() for p in params) + self.optimizer.state_bytes(),
            saved_activation_peak_bytes=meter.peak_bytes,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device) if cuda else None,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device) if cuda else None)


def train(run: RunConfig) -> RunResult:
    """Run ``run`` on this rank of the initialised process group; every rank returns the shared figures.

    Configuration errors (world not a multiple of pp, batch sizes that do not split, too few
    microbatches for the schedule) raise ``ValueError`` before anything is allocated. From then
    on nothing raises: an out-of-memory error (building the stages or stepping) is a result with
    ``status="oom"``, any other failure one with ``status="error"`` and its traceback.
    """
    if not dist.is_initialized():
        raise RuntimeError("train() needs an initialised torch.distributed process group")
    config, layout = run.model(), run.pipeline_layout()
    grid = _Grid(run.pp, layout)
    if run.gbs % (run.mbs * grid.dp):
        raise ValueError(f"gbs={run.gbs} is not a multiple of mbs × dp = {run.mbs} × {grid.dp}")
    microbatches = run.gbs // (run.mbs * grid.dp)
    check_microbatches(microbatches, run.pp, layout.vpp)
    shape = dict(world=grid.world, pp=grid.pp, vpp=layout.vpp, dp=grid.dp, microbatches=microbatches)
    times, losses = [], []
    try:
        state = _Run(run, config, layout, grid, microbatches)
        meter = SavedActivations(exclude=state.exclude)
        if state.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(state.device)
        for iteration in range(run.iters):
            _synchronize(state.device)
            start = time.perf_counter()
            losses.append(state.step(iteration, meter))
            _synchronize(state.device)
            times.append(time.perf_counter() - start)
        profiled = _profiled_step(state, run.iters, meter) if run.profile_step else None
    except Exception as exc:  # a peer's failure reaches this rank as a communication error
        oom = _out_of_memory(exc)
        if oom is not None:  # stage i runs on rank i % pp: this rank's first stage is its pipeline rank
            return RunResult(status="oom", stage=grid.pp_rank, message=str(oom).splitlines()[0], **shape)
        return RunResult(status="error", message=traceback.format_exc(limit=-3), **shape)
    memory: list[StageMemory | None] = [None] * grid.world
    dist.all_gather_object(memory, state.memory(meter))
    measured = times[run.warmup_iters:]
    tokens_per_s = run.gbs * run.seq / (sum(measured) / len(measured)) / grid.world
    flops = model_flops(config, run.seq).training
    return RunResult(
        status="ok", **shape, iteration_times_s=times,
        losses=[float(x[0]) for x in losses], mtp_losses=[float(x[1]) for x in losses],
        stage_memory=[m for m in memory if m.rank < grid.pp],
        tokens_per_s_per_gpu=tokens_per_s, model_tflops_per_gpu=tokens_per_s * flops / 1e12, profiled_step=profiled)


def _profiled_step(state: _Run, iteration: int, meter: SavedActivations) -> ProfiledStep:
    """Iteration ``iteration`` under the profiler (see ``ProfiledStep``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = state.device.type == "cuda"
    _synchronize(state.device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        state.step(iteration, meter)
        _synchronize(state.device)
        wall_s = time.perf_counter() - start
    by_name: dict[str, float] = {}
    spans: list[tuple[float, float, str]] = []
    for event in prof.events():
        if cuda and event.device_type == DeviceType.CUDA:
            us = event.time_range.elapsed_us()
            spans.append((event.time_range.start, event.time_range.end, event.name))
        elif not cuda and event.device_type == DeviceType.CPU:
            us = event.self_cpu_time_total
        else:
            continue
        by_name[event.name] = by_name.get(event.name, 0.0) + us
    return ProfiledStep(wall_s=wall_s, by_name_us=by_name, idle_before_us=idle_gaps(spans))


def idle_gaps(spans: list[tuple[float, float, str]]) -> dict[str, float]:
    """Microseconds the device sat idle before each name's activities, from ``(start, end, name)`` spans
    that may overlap (several streams): a gap is time no span covers, after the first span starts."""
    gaps: dict[str, float] = {}
    covered_until = None
    for start, end, name in sorted(spans):
        if covered_until is not None and start > covered_until:
            gaps[name] = gaps.get(name, 0.0) + start - covered_until
        covered_until = end if covered_until is None else max(covered_until, end)
    return gaps


def _out_of_memory(exc: BaseException) -> torch.OutOfMemoryError | None:
    """The OOM behind ``exc``, if any: the pipelining stage re-raises a forward's error as a RuntimeError."""
    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def merge_results(results: list[RunResult]) -> RunResult:
    """One result for a run from every rank's: an OOM anywhere wins, then any error, else rank 0's."""
    for status in ("oom", "error"):
        for result in results:
            if result.status == status:
                return result
    return results[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, runs: list[RunConfig], threads: int, timeout_s: float, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        for index, run in enumerate(runs):
            try:
                queue.put((index, rank, train(run).model_dump(), None))
            except Exception:
                queue.put((index, rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def launch_local(runs: Sequence[RunConfig], world: int, timeout_s: float = 300.0,
                 threads: int = 1) -> list[list[RunResult]]:
    """Run each of ``runs`` in turn on ``world`` local CPU processes over gloo (for tests).

    Returns, per run, every rank's result by rank. The processes are started once for all runs
    (starting them and importing torch costs more than a tiny run). Each uses ``threads``
    intra-op threads: one by default, since a small model gains little from more and several
    processes sharing few cores lose a lot to oversubscription. A rank that raises (a
    configuration error) makes this raise ``RuntimeError`` with its traceback.
    """
    if any(run.device != "cpu" for run in runs):
        raise ValueError("launch_local runs gloo on CPU; use torchrun for GPUs")
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_worker, args=(r, world, port, list(runs), threads, timeout_s, queue))
                 for r in range(world)]
    for p in processes:
        p.start()
    answers = {}
    try:
        for _ in range(world * len(runs)):
            index, rank, result, error = queue.get(timeout=timeout_s + 60)
            answers[index, rank] = (result, error)
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [f"run {i}, rank {r}:\n{e}" for (i, r), (_, e) in sorted(answers.items()) if e]
    if errors:
        raise RuntimeError("a training process failed\n" + "\n".join(errors))
    return [[RunResult.model_validate(answers[i, r][0]) for r in range(world)] for i in range(len(runs))]
