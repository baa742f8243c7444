"""V4 training runs over pipeline layouts: run-config errors, 1F1B over two gloo processes against one
process, the interleaved schedule, data parallelism, and (in this process, world 1) out-of-memory
reporting and recompute's effect on the measured activation bytes."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from v4.layout import parse_layout
from v4 import pipeline
from v4.data import MarkovTokens
from v4.pipeline import RunConfig, RunResult, check_microbatches, launch_local, merge_results, train
from v4.recompute import RecomputePlan
from v4.stages import StageModule, build_stage

BASE = dict(preset="tiny", gbs=4, mbs=1, seq=64, lr=5e-3, warmup_iters=1)


@pytest.fixture
def world_of_one():
    """A gloo process group of this process alone, for runs that need no second rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def _step0_loss(run: RunConfig, dp: int = 1) -> float:
    """The mean LM loss of the first iteration's microbatches on one stage, without any pipeline."""
    config = run.model()
    stage = parse_layout("E" + "t" * config.layers + "mL", config.layers, 1, config.mtp_layers).stages[0]
    model = build_stage(config, stage, RecomputePlan(), dtype=getattr(torch, run.dtype), seed=run.seed)
    data = MarkovTokens(config.vocab, run.seed)
    losses = []
    with torch.no_grad():
        for replica in range(dp):
            tokens = data.batch(0, replica, run.gbs // dp, run.seq)
            losses += [float(model(tokens=tokens[i:i + run.mbs])[0]) for i in range(0, len(tokens), run.mbs)]
    return sum(losses) / len(losses)


def _ok(results: list[RunResult]) -> RunResult:
    for result in results:
        assert result.status == "ok", result.message
    assert all(r.losses == results[0].losses for r in results)  # shared with every rank
    return results[0]


def test_run_config_rejects_bad_layouts_and_plans() -> None:
    for fields, message in (
        (dict(layout="Et*3|t*2mL", pp=2), "layer-count: 5 .t. symbols, the model has 4"),
        (dict(layout="Et*2|t*2mL", pp=3), "stage-count"),
        (dict(layout="Et*2|t*2Lm", pp=2), "loss"),
        (dict(layout="Etmt*3|L", pp=2), "mtp-order"),
        (dict(recompute="0-9"), r"layer id\(s\) \[5, 6, 7, 8, 9\] out of range"),
        (dict(recompute="selective:attention"), "unknown module"),
        (dict(iters=2, warmup_iters=2), "leaves no measured iteration"),
        (dict(gbs=5, mbs=2), "not a multiple of mbs"),
        (dict(preset="v9"), "unknown preset 'v9'"),
        (dict(kernels="cuda"), "kernels"),
        (dict(cuda_graphs=True), r"cuda_graphs needs device cuda \(got cpu\); kernels triton"),
        (dict(cuda_graphs=True, device="cuda", kernels="triton", layout="Et*2|t*2mL", pp=2), "pp 1"),
        (dict(cuda_graphs=True, device="cuda", kernels="triton", layout="Et*2|t*2mL", pp=1), "virtual stages"),
        (dict(cuda_graphs=True, device="cuda", kernels="triton", recompute="selective:moe_act"), "no recompute"),
    ):
        with pytest.raises(ValidationError, match=message):
            RunConfig(**{**BASE, "iters": 3, **fields})


def test_microbatch_rules_of_the_schedules() -> None:
    check_microbatches(4, 2, 2)
    check_microbatches(3, 2, 1)
    with pytest.raises(ValueError, match="fewer than pp=4"):
        check_microbatches(3, 4, 1)
    with pytest.raises(ValueError, match="interleaved schedule .* multiple of pp=2, got 3"):
        check_microbatches(3, 2, 2)


def test_two_processes_pipeline_interleave_and_replicate_like_one_process(world_of_one) -> None:
    """One launch for three runs (starting processes costs more than a tiny run): 1F1B with pp=2,
    interleaved 1F1B with pp=2 and vpp=2, and pp=1 with two data-parallel replicas."""
    pipelined = RunConfig(**BASE, layout="Et*2|t*2mL", pp=2, iters=10, dtype="float32")
    interleaved = RunConfig(**BASE, layout="Et|t|t|tmL", pp=2, iters=2)
    replicated = RunConfig(**BASE, pp=1, iters=2)
    results = [_ok(r) for r in launch_local([pipelined, interleaved, replicated], world=2)]

    result = results[0]
    assert (result.pp, result.vpp, result.dp, result.microbatches) == (2, 1, 1, 4)
    assert result.losses[0] == pytest.approx(_step0_loss(pipelined), abs=1e-5)
    assert result.losses[-1] < result.losses[0] - 0.3, result.losses
    # the same run on one stage: in fp32 the two agree until routing's discrete choices drift
    alone = train(pipelined.model_copy(update={"layout": None, "pp": 1, "iters": 4}))
    assert alone.status == "ok" and alone.losses == pytest.approx(result.losses[:4], abs=1e-4)
    assert len(result.iteration_times_s) == 10 and result.tokens_per_s_per_gpu > 0 and result.model_tflops_per_gpu > 0
    first, last = result.stage_memory
    assert first.stages == [0] and last.stages == [1]
    layout = pipelined.pipeline_layout()
    for reported, stage in zip((first, last), layout.stages):
        module = build_stage(pipelined.model(), stage, RecomputePlan(), dtype=torch.float32)
        params = list(module.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        assert reported.params == sum(p.numel() for p in params)
        assert reported.static_bytes == 4 * reported.params + 16 * trainable  # fp32 weights, grads, master, moments
    # under 1F1B stage 0 holds two microbatches in flight at its peak, the last stage one
    assert first.saved_activation_peak_bytes > last.saved_activation_peak_bytes > 0

    result = results[1]
    assert (result.vpp, result.microbatches) == (2, 4)
    assert [m.stages for m in result.stage_memory] == [[0, 2], [1, 3]]
    assert result.losses[0] == pytest.approx(_step0_loss(interleaved), abs=1e-5)

    result = results[2]
    assert (result.pp, result.dp, result.microbatches) == (1, 2, 2)
    assert result.losses[0] == pytest.approx(_step0_loss(replicated, dp=2), abs=1e-5)


def test_recompute_lowers_the_measured_activations(world_of_one) -> None:
    peaks = {}
    for plan in ("none", "selective:attn_core", "0-4"):
        result = train(RunConfig(**{**BASE, "gbs": 2}, recompute=plan, iters=2))
        assert result.status == "ok", result.message
        peaks[plan] = result.stage_memory[0].saved_activation_peak_bytes
    assert peaks["0-4"] < peaks["selective:attn_core"] < peaks["none"]


def test_weight_noise_moves_the_first_loss_by_rounding_size_and_repeats(world_of_one) -> None:
    plain, noisy, again, other = (
        train(RunConfig(**{**BASE, "warmup_iters": 0}, iters=1, weight_noise=noise, weight_noise_seed=draw))
        for noise, draw in ((0.0, 0), (2 ** -8, 0), (2 ** -8, 0), (2 ** -8, 1)))
    assert all(r.status == "ok" for r in (plain, noisy, again, other))
    assert noisy.losses == again.losses  # seeded: the same perturbation each time
    assert noisy.losses[0] != plain.losses[0] and noisy.losses[0] == pytest.approx(plain.losses[0], rel=1e-2)
    assert other.losses[0] not in (noisy.losses[0], plain.losses[0])  # another draw: another perturbation
    assert other.losses[0] == pytest.approx(plain.losses[0], rel=1e-2)


def test_out_of_memory_is_reported_not_raised(world_of_one, monkeypatch) -> None:
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with monkeypatch.context() as patch:  # while stepping: the pipelining stage wraps it in a RuntimeError
        patch.setattr(StageModule, "forward", out_of_memory)
        stepping = train(RunConfig(**BASE, iters=2))
    assert (stepping.status, stepping.stage) == ("oom", 0) and "out of memory" in stepping.message
    monkeypatch.setattr(pipeline, "build_stage", out_of_memory)  # while building the stages
    building = train(RunConfig(**BASE, iters=2))
    assert (building.status, building.stage) == ("oom", 0)
    peer = RunResult(status="error", message="peer gone", world=2, pp=2, vpp=1, dp=1, microbatches=4)
    assert merge_results([peer, stepping]) is stepping
    assert merge_results([RunResult(status="ok", world=1, pp=1, vpp=1, dp=1, microbatches=4), peer]) is peer


def test_graph_capture_inputs_are_what_each_layer_takes() -> None:
    """``v4.graphs`` captures each layer on inputs shaped as a microbatch's: every layer runs forward and
    backward on them here (the capture itself needs CUDA, and a CPU device is refused by name)."""
    from v4.graphs import _sample_args, graph_layers

    config = RunConfig(**{**BASE, "iters": 2}).model()  # the eager ops take what the Triton ones take, faster here
    stage = build_stage(config, parse_layout("Et*4mL", 4, 1, 1).stages[0], RecomputePlan(), "eager")
    for layer, is_mtp in [*((layer, False) for layer in stage.layers), (stage.mtp, True)]:
        args = _sample_args(is_mtp, config, 1, 16, torch.device("cpu"), torch.bfloat16)
        out = layer(*args)
        assert out.shape == ((1, 16, config.hidden) if is_mtp else args[0].shape)
        out.float().square().mean().backward()
        assert all(a.grad is not None for a in args if a.requires_grad)
    with pytest.raises(ValueError, match="CUDA graphs need the layers on a CUDA device, got cpu"):
        graph_layers(list(stage.layers), stage.mtp, config, 1, 16, torch.device("cpu"), torch.bfloat16)


def test_each_step_draws_the_next_iterations_tokens_once_and_uses_them(world_of_one, monkeypatch) -> None:
    drawn: list[int] = []
    original = MarkovTokens.batch

    def counted(self, iteration, replica, samples, seq):
        drawn.append(iteration)
        return original(self, iteration, replica, samples, seq)

    monkeypatch.setattr(MarkovTokens, "batch", counted)
    ahead = train(RunConfig(**BASE, iters=3))
    monkeypatch.setattr(pipeline._Run, "_tokens", lambda self, iteration: self._draw(iteration))
    drawn_now = len(drawn)
    each_step = train(RunConfig(**BASE, iters=3))
    assert drawn[:drawn_now] == [0, 1, 2, 3]  # the first step draws its own, each step the next one's
    assert ahead.status == each_step.status == "ok" and ahead.losses == each_step.losses
