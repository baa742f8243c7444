"""Training ladder: what each tuning step gives a V4 training step on one device (eager -> Triton defaults -> tuned table -> CUDA graphs -> tuned table + the planner's recompute plan).

Each rung trains the same preset, batch and data (``v4.pipeline.train``, one rank) in its own
process, so one rung's compiled kernels, cached table lookups and allocator state never reach
the next:

* ``eager``: the PyTorch reference ops;
* ``triton-defaults``: the Triton kernels with every launch at its heuristic default
  (``TUNER_TABLES=off``);
* ``triton-tuned``: the Triton kernels reading the tuned tables (user table over shipped);
* ``triton-defaults-graphs``, ``triton-tuned-graphs``: the two above with every layer's forward and
  backward replayed as CUDA graphs (``v4.graphs``), so the host's launches stop limiting the step
  and the kernels' own speed shows; each graph rung's losses and speed are also compared with its twin
  without graphs (the same kernels: the losses should agree);
* ``triton-tuned-recompute``: the same with ``--recompute`` (the planner's recompute plan for
  this device; the GPU script takes it from ``tuner plan``). Left out when no plan is given.

On a GPU, with a tuned rung, the record also says how many of the step's launches find no table entry
and run their defaults in the tuned rungs too (``table_coverage``, from ``tuner sweep shapes``).

Per rung: the median step time over the measured iterations (``--warmup-iters`` left out),
tokens/s and model TFLOP/s per GPU (``v4.flops``), peak allocated memory (CUDA) and the loss
curve. Loss parity: each rung's losses against eager's, step by step, as a relative difference;
a rung is within bf16 noise when every step differs by at most two bf16 ulps (2^-7 relative).
Eager does not fit proxy-8l at gbs 8, seq 4,096 on an H100, so parity is also measured at a size it
fits (``--parity-seq``, ``--parity-gbs``; see ``parity_run``), against how far one-rounding-step
perturbations of eager's weights (``--parity-noise-runs`` draws) move eager's own curve.
``--profile-step`` adds one iteration per rung under ``torch.profiler`` (left out of its figures): the step's
device time by class (GEMMs, attention, the rest, the rest's largest kernels by name) and how busy the
device was over that step's wall time.
``--repeat RUNG`` trains a rung a second time: its own run-to-run loss gap, against which a graph rung's
gap to its twin can be read. ``--plot FILE.svg`` draws throughput per rung and the loss curves from a record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.record import plot_records

RUNGS = ("eager", "triton-defaults", "triton-tuned", "triton-defaults-graphs", "triton-tuned-graphs",
         "triton-tuned-recompute")
GRAPHS = "-graphs"  # the suffix of the rungs replayed as CUDA graphs
# the pairs whose ratio is what the tuned table gives: eager launches, and graphs
TUNED_PAIRS = (("triton-defaults", "triton-tuned"), ("triton-defaults-graphs", "triton-tuned-graphs"))
BF16_NOISE = 2.0 ** -7  # two bf16 ulps, relative
WEIGHT_NOISE = 2.0 ** -8  # the parity reference's perturbation: one bf16 rounding step, relative


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="proxy-8l", help="model preset (v4/presets)")
    parser.add_argument("--gbs", type=int, default=8, help="global batch (sequences a step)")
    parser.add_argument("--mbs", type=int, default=1, help="microbatch size")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length")
    parser.add_argument("--iters", type=int, default=20, help="iterations per rung")
    parser.add_argument("--warmup-iters", type=int, default=3, help="iterations left out of the step time")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--recompute", default=None,
                        help="the planner's recompute plan for the last rung (v4.recompute syntax); none: rung left out")
    parser.add_argument("--rungs", default=",".join(RUNGS), help="comma-separated subset of " + ", ".join(RUNGS))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a rung may take")
    parser.add_argument("--parity-seq", type=int, default=1024,
                        help="sequence length of the loss-parity runs (eager, eager with its weights perturbed by "
                             "one bf16 step, each Triton rung); 0: none")
    parser.add_argument("--parity-gbs", type=int, default=2, help="global batch of the loss-parity runs")
    parser.add_argument("--parity-noise-runs", type=int, default=3,
                        help="perturbed eager runs (draws of the perturbation) whose largest gap to eager is the band")
    parser.add_argument("--repeat", default="",
                        help="comma-separated rungs to train a second time after the ladder: how far the same "
                             "rung's losses and speed move from one run to the next")
    parser.add_argument("--profile-step", action="store_true",
                        help="profile one more step per rung: where its device time went (step_profile)")


def rung_config(rung: str, args: argparse.Namespace, device: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``RunConfig`` fields and the extra environment of one rung."""
    if rung not in RUNGS:
        raise ValueError(f"rungs: unknown rung {rung!r}; choose from {', '.join(RUNGS)}")
    run = dict(preset=args.preset, gbs=args.gbs, mbs=args.mbs, seq=args.seq, iters=args.iters,
               warmup_iters=args.warmup_iters, device=device, seed=0,
               kernels="eager" if rung == "eager" else "triton",
               recompute=args.recompute if rung == "triton-tuned-recompute" else "none",
               cuda_graphs=rung.endswith(GRAPHS), profile_step=args.profile_step)
    env = {"TUNER_TABLES": "off"} if rung.startswith("triton-defaults") else {}
    return run, env


def _train_one(run_fields: dict[str, Any]) -> dict[str, Any]:
    """Child side: one rank of a one-rank process group trains ``run_fields``; returns the result and tables."""
    import torch
    import torch.distributed as dist

    from kernels.provenance import kernel_tables
    from v4.pipeline import RunConfig, train

    run = RunConfig(**run_fields)
    with tempfile.TemporaryDirectory() as rendezvous:
        backend = "nccl" if run.device == "cuda" else "gloo"
        if run.device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
        try:
            result = train(run)
        finally:
            dist.destroy_process_group()
    return {"result": result.model_dump(), "tables": kernel_tables(run.kernels)}


def parity(losses: list[float], reference: list[float]) -> dict[str, Any]:
    """Step-by-step relative loss difference against the eager rung's losses."""
    if len(losses) != len(reference) or not losses:
        return {"max_rel_diff": None, "within_bf16_noise": False}
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))
    return {"max_rel_diff": worst, "within_bf16_noise": worst <= BF16_NOISE}


def summarize(answer: dict[str, Any], warmup_iters: int) -> dict[str, Any]:
    """The figures of one rung from its ``RunResult`` (as a dict)."""
    result = answer["result"]
    figures: dict[str, Any] = {"status": result["status"], "tables": answer["tables"]}
    if result["status"] != "ok":
        figures["message"] = result["message"]
        return figures
    measured = result["iteration_times_s"][warmup_iters:]
    peaks = [m["peak_allocated_bytes"] for m in result["stage_memory"] if m["peak_allocated_bytes"] is not None]
    figures.update(
        step_ms_median=statistics.median(measured) * 1e3,
        step_ms_mean=statistics.mean(measured) * 1e3,  # what tokens/s and TFLOP/s are computed from
        tokens_per_s_per_gpu=result["tokens_per_s_per_gpu"],
        model_tflops_per_gpu=result["model_tflops_per_gpu"],
        peak_allocated_gib=max(peaks) / 2**30 if peaks else None,
        losses=result["losses"])
    if result.get("profiled_step"):
        figures["step_profile"] = step_profile(result["profiled_step"])
    return figures


STEP_PROFILE_TOP = 12  # the remainder's largest kernels named in a rung's step profile


def step_profile(profiled: dict[str, Any]) -> dict[str, Any]:
    """A profiled step's time by class (``tuner.train.kernel_shares``), the share of its wall time the
    device was busy (on a CPU run: the ops' self time, so busy is the share spent in ops), and where the
    device sat idle: its gaps summed under the activity that ended each (``idle_before_top``)."""
    from tuner.train.kernel_shares import time_shares, with_timed_ms

    shares = time_shares(profiled["by_name_us"].items(), top=STEP_PROFILE_TOP)
    idle = sorted(profiled.get("idle_before_us", {}).items(), key=lambda item: -item[1])
    return {**with_timed_ms(shares, profiled["wall_s"] * 1e3),
            "idle_ms": round(sum(us for _, us in idle) / 1e3, 4),
            "idle_before_top": [{"name": name, "ms": round(us / 1e3, 4)} for name, us in idle[:STEP_PROFILE_TOP]]}


def _train_rung(rung: str, args: argparse.Namespace, device: str, weight_noise: float = 0.0,
                noise_seed: int = 0) -> dict[str, Any]:
    """One rung in its own process: its figures, or its status and why it failed (error, timeout);
    ``weight_noise``: its weights perturbed after init, by draw ``noise_seed`` (``RunConfig.weight_noise``)."""
    run_fields, env = rung_config(rung, args, device)
    run_fields.update(weight_noise=weight_noise, weight_noise_seed=noise_seed)
    print(f"train_ladder: {rung} (gbs {args.gbs}, seq {args.seq}) ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.train_ladder", "--child", json.dumps(run_fields)],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"no result within --timeout {args.timeout:g} s"}
    if proc.returncode != 0:
        return {"status": "error", "message": proc.stderr.strip().splitlines()[-5:]}
    return summarize(json.loads(proc.stdout.strip().splitlines()[-1]), args.warmup_iters)


def perturbed_names(runs: int) -> list[str]:
    """The perturbed eager runs' names: ``eager-perturbed``, then ``eager-perturbed-2`` and on."""
    return ["eager-perturbed" + (f"-{i + 1}" if i else "") for i in range(runs)]


def parity_run(args: argparse.Namespace, device: str, triton_rungs: list[str]) -> dict[str, Any]:
    """Loss parity at a size eager fits (``--parity-seq``, ``--parity-gbs``): eager, eager with its
    weights perturbed by one bf16 rounding step (``WEIGHT_NOISE``) in ``--parity-noise-runs`` draws,
    then each of ``triton_rungs``.

    Eager repeats itself bit for bit on one device, so its run-to-run gap says nothing; a Triton
    kernel rounds differently at every op, and a short training run amplifies any difference. A
    perturbed eager run's step-by-step gap to eager is how far bf16 rounding alone moves the curve
    here; one draw is one sample of that, so the band is the largest gap of several. A Triton rung is
    within noise when its gap to eager stays within the band, or within two bf16 ulps (2^-7) where the
    perturbations move it less.
    """
    small = argparse.Namespace(**{**vars(args), "seq": args.parity_seq, "gbs": args.parity_gbs, "profile_step": False})
    perturbed = perturbed_names(args.parity_noise_runs)
    runs = {name: _train_rung(rung, small, device, noise, seed) for name, rung, noise, seed in
            (("eager", "eager", 0.0, 0), *((name, "eager", WEIGHT_NOISE, i) for i, name in enumerate(perturbed)),
             *((rung, rung, 0.0, 0) for rung in triton_rungs))}
    figures: dict[str, Any] = {"seq": small.seq, "gbs": small.gbs, "iters": small.iters,
                               "losses": {name: r.get("losses") for name, r in runs.items()},
                               "status": {name: r["status"] for name, r in runs.items()}}
    if any(runs[name]["status"] != "ok" for name in ("eager", *perturbed)):
        return figures
    reference = runs["eager"]["losses"]
    noise_runs = [parity(runs[name]["losses"], reference)["max_rel_diff"] for name in perturbed]
    noise = max(noise_runs)
    band = max(noise, BF16_NOISE)
    figures.update(eager_noise=noise, eager_noise_runs=noise_runs, band=band, rungs={})
    for name in triton_rungs:
        if runs[name]["status"] == "ok":
            gap = parity(runs[name]["losses"], reference)["max_rel_diff"]
            figures["rungs"][name] = {"max_rel_diff": gap, "within_noise": gap is not None and gap <= band}
    return figures


def repeat(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """A rung's second run against its first: the largest step-by-step loss gap and the speed ratio. The
    floor under any other comparison of loss curves: what the same kernels move from one run to the next
    (nondeterministic reductions, cuBLAS's choices), amplified over the run's steps."""
    figures: dict[str, Any] = {"status": again["status"]}
    if first.get("status") == again["status"] == "ok":
        figures.update(losses=again["losses"], loss_vs_first_run=parity(again["losses"], first["losses"])["max_rel_diff"],
                       speed_vs_first_run=again["tokens_per_s_per_gpu"] / first["tokens_per_s_per_gpu"])
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train every rung in its own process and compare them; see the module doc."""
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    if args.recompute is None:
        rungs = [r for r in rungs if r != "triton-tuned-recompute"]
    left_out = [r for r in rungs if r.endswith(GRAPHS) and device != "cuda"]  # graphs are CUDA's
    rungs = [r for r in rungs if r not in left_out]
    if args.parity_noise_runs < 1:
        raise ValueError(f"--parity-noise-runs: at least 1, got {args.parity_noise_runs}")
    repeats = [r.strip() for r in args.repeat.split(",") if r.strip()]
    for rung in repeats:  # before any training: a bad name costs no GPU time
        if rung not in rungs:
            raise ValueError(f"--repeat: {rung!r} is not a rung of this ladder ({', '.join(rungs)})")
    figures: dict[str, Any] = {"preset": args.preset, "gbs": args.gbs, "mbs": args.mbs, "seq": args.seq,
                               "iters": args.iters, "device": device, "recompute": args.recompute, "rungs": {},
                               "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                               **({"left_out": {r: "CUDA graphs need a GPU" for r in left_out}} if left_out else {})}
    if device == "cuda" and any("tuned" in rung for rung in rungs):
        from kernels.arch import current_arch

        figures["table_coverage"] = table_coverage(args.preset, args.seq, args.mbs, current_arch())
    save_partial = getattr(args, "save_partial", lambda _figures: None)  # the runner's; absent in a direct call
    for rung in rungs:
        figures["rungs"][rung] = _train_rung(rung, args, device)
        save_partial(figures)
    if args.parity_seq:
        figures["parity"] = parity_run(args, device, [r for r in rungs if r.startswith("triton") and
                                                      r != "triton-tuned-recompute"])
        save_partial(figures)
    for rung in repeats:
        figures.setdefault("repeats", {})[rung] = repeat(figures["rungs"][rung], _train_rung(rung, args, device))
        save_partial(figures)
    _compare(figures["rungs"])
    figures["targets"] = targets(figures)
    return figures


def table_coverage(preset: str, seq: int, mbs: int, arch: str) -> dict[str, Any]:
    """How much of the step the tuned rungs' tables reach: of the launches one step of ``preset`` makes
    (``tuner sweep shapes``), how many find no entry on ``arch`` and run their heuristic default."""
    from tuner.train.model_shapes import model_launches
    from v4.config import load_preset

    launches = model_launches(load_preset(preset), seq, mbs, 1, arch)
    missing = [launch for launch in launches if launch.source == "default"]
    return {"arch": arch, "launches": len(launches), "at_default": len(missing),
            "kernels_at_default": sorted({launch.kernel for launch in missing})}


# issue 36's targets; the H100 baseline is its run of 2026-12-05 (tuned table, 92.6 model TFLOP/s/GPU)
H100_BASELINE_TFLOPS = 92.6
TUNED_OVER_DEFAULTS = 1.25


def targets(figures: dict[str, Any]) -> list[dict[str, str]]:
    """The ladder's targets against its measured rungs (``{"target", "measured", "status"}`` rows): the
    fastest Triton rung's throughput, the tuned table over the defaults (with and without graphs, as
    measured), and loss parity."""
    rungs = figures["rungs"]
    eager = rungs.get("eager", {})
    triton = {name: r for name, r in rungs.items() if name != "eager" and r.get("status") == "ok"}
    rows = []
    if triton:
        name, best = max(triton.items(), key=lambda item: item[1]["model_tflops_per_gpu"])
        goal = 2 * H100_BASELINE_TFLOPS
        rows.append({"target": f"proxy-8l step >= {goal:.0f} model TFLOP/s/GPU on an H100 "
                               f"(2x the {H100_BASELINE_TFLOPS} measured before)",
                     "measured": f"{best['model_tflops_per_gpu']:.1f} TFLOP/s/GPU ({name}), "
                                 f"{best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, {best['step_ms_mean']:,.0f} ms a step",
                     "status": ("met" if best["model_tflops_per_gpu"] >= goal else "missed")
                     if "H100" in (figures.get("gpu") or "H100") else f"not judged: an H100's target, run on {figures['gpu']}"})
    for defaults_name, tuned_name in TUNED_PAIRS:
        defaults, tuned = rungs.get(defaults_name, {}), rungs.get(tuned_name, {})
        if "speedup_over_defaults" in tuned:
            coverage = figures.get("table_coverage")
            reach = (f"; {coverage['at_default']} of the step's {coverage['launches']} launches found no table entry"
                     if coverage else "")
            rows.append({"target": f"{tuned_name} >= {TUNED_OVER_DEFAULTS}x {defaults_name}",
                         "measured": f"{tuned['speedup_over_defaults']:.3f}x "
                                     f"({defaults['model_tflops_per_gpu']:.1f} -> {tuned['model_tflops_per_gpu']:.1f})"
                                     + reach,
                         "status": "met" if tuned["speedup_over_defaults"] >= TUNED_OVER_DEFAULTS else "missed"})
    if eager.get("status") == "ok":
        drift = {name: r["loss_parity_vs_eager"]["max_rel_diff"] for name, r in triton.items()}
        measured = ", ".join(f"{name} {value:.2%}" for name, value in drift.items())
        met = all(r["loss_parity_vs_eager"]["within_bf16_noise"] for r in triton.values())
    elif figures.get("parity", {}).get("rungs"):
        small = figures["parity"]
        measured = (f"at gbs {small['gbs']}, seq {small['seq']} (eager {eager.get('status', 'not run')} at full size): "
                    + ", ".join(f"{name} {r['max_rel_diff']:.2%}" for name, r in small["rungs"].items())
                    + f"; eager perturbed by one bf16 step {small['eager_noise']:.2%}"
                    + (f" (the largest of {len(small['eager_noise_runs'])} draws)" if len(small.get("eager_noise_runs", [])) > 1
                       else ""))
        met = all(r["within_noise"] for r in small["rungs"].values())
    else:
        measured, met = f"eager rung {eager.get('status', 'not run')}: no reference", None
    rows.append({"target": "Triton rungs' losses within bf16 noise of eager at every step",
                 "measured": measured, "status": "not measured" if met is None else "met" if met else "missed"})
    return rows


def _compare(rungs: dict[str, dict[str, Any]]) -> None:
    """Add loss parity against eager and speed-ups over the rung below, in place."""
    eager = rungs.get("eager", {})
    previous = None
    for name, rung in rungs.items():
        if rung.get("status") != "ok":
            continue
        if name != "eager" and eager.get("status") == "ok":
            rung["loss_parity_vs_eager"] = parity(rung["losses"], eager["losses"])
        if previous is not None:
            rung["speedup_over_previous_rung"] = rung["tokens_per_s_per_gpu"] / previous["tokens_per_s_per_gpu"]
        previous = rung
    for defaults_name, tuned_name in TUNED_PAIRS:
        defaults, tuned = rungs.get(defaults_name, {}), rungs.get(tuned_name, {})
        if defaults.get("status") == tuned.get("status") == "ok":
            tuned["speedup_over_defaults"] = tuned["tokens_per_s_per_gpu"] / defaults["tokens_per_s_per_gpu"]
    for name, rung in rungs.items():  # a replayed graph runs the same kernels: its losses are its twin's
        twin = rungs.get(name.removesuffix(GRAPHS), {}) if name.endswith(GRAPHS) else {}
        if rung.get("status") == twin.get("status") == "ok":
            rung["loss_vs_eager_launches"] = parity(rung["losses"], twin["losses"])["max_rel_diff"]
            rung["speedup_over_eager_launches"] = rung["tokens_per_s_per_gpu"] / twin["tokens_per_s_per_gpu"]


STEP_CLASSES = (("gemm_ms", "GEMMs", "#1f77b4"), ("attention_ms", "attention", "#2ca02c"),
                ("other_ms", "the rest", "#ff7f0e"))
IDLE = ("device idle", "#ddd")  # the rest of the step's wall time


CURVE_COLORS = ["#888", "#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]  # one a rung, or a parity run


def _step_panel(rungs: dict[str, dict[str, Any]], top: int, width: int) -> list[str]:
    """Below the two panels: each profiled rung's step as one bar, split into its classes' device time
    and the time the device sat idle, to one scale."""
    profiles = {name: r["step_profile"] for name, r in rungs.items() if r.get("step_profile")}
    longest = max(p["timed_ms"] for p in profiles.values())
    parts = [f'<text x="8" y="{top}">one profiled step (ms): ' + ", ".join(
        f'<tspan fill="{color}">{label}</tspan>' for label, color in (*(c[1:] for c in STEP_CLASSES), IDLE))
        + "</text>"]
    for row, (name, p) in enumerate(profiles.items()):
        y, x = top + 10 + row * 18, 170.0
        parts.append(f'<text x="8" y="{y + 11}" font-size="9">{name}</text>')
        segments = [(p[key], color) for key, _, color in STEP_CLASSES]
        for ms, color in (*segments, (max(p["timed_ms"] - p["total_ms"], 0.0), IDLE[1])):
            w = (width - 240) * ms / longest
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="13" fill="{color}"/>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 11}" font-size="9">{p["timed_ms"]:.0f}</text>')
    return parts


PARITY_PANEL_HEIGHT = 170


def _parity_panel(small: dict[str, Any], top: int, width: int) -> list[str]:
    """Below the two panels: each loss-parity run's relative gap to eager's loss, step by step; eager with
    its weights perturbed (dashed) is the noise a Triton rung's curve should stay under."""
    reference = small["losses"]["eager"]
    gaps = {name: [abs(v - r) / abs(r) for v, r in zip(losses, reference)]
            for name, losses in small["losses"].items() if name != "eager" and losses}
    high = max((max(g) for g in gaps.values() if g), default=0.0) or 1.0
    steps = max(len(g) for g in gaps.values())
    plot_h = PARITY_PANEL_HEIGHT - 50
    parts = [f'<text x="8" y="{top}">loss parity (gbs {small["gbs"]}, seq {small["seq"]}): |loss - eager\'s| / eager\'s '
             f'per step, 0 .. {high:.1%}: ' + ", ".join(
                 f'<tspan fill="{CURVE_COLORS[i % len(CURVE_COLORS)]}">{name}</tspan>' for i, name in enumerate(gaps))
             + "</text>"]
    for i, (name, gap) in enumerate(gaps.items()):
        points = " ".join(f"{20 + (width - 60) * step / max(steps - 1, 1):.1f},{top + 12 + plot_h * (1 - g / high):.1f}"
                          for step, g in enumerate(gap))
        dash = ' stroke-dasharray="4 3"' if name.startswith("eager-perturbed") else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke="{CURVE_COLORS[i % len(CURVE_COLORS)]}" '
                     f'stroke-width="1.2"{dash}/>')
    return parts


def plot_svg(figures: dict[str, Any], width: int = 720, height: int = 300) -> str:
    """Two panels: model TFLOP/s per GPU per rung (bars), and every rung's loss curve; below them, where
    rungs were profiled (``--profile-step``), each one's step split by kernel class, and where the loss
    parity runs ran, each one's gap to eager per step."""
    rungs = {name: r for name, r in figures["rungs"].items() if r.get("status") == "ok"}
    profiled = sum(1 for r in rungs.values() if r.get("step_profile"))
    small = figures.get("parity", {})
    with_parity = bool((small.get("losses") or {}).get("eager")) and len(small["losses"]) > 1
    panels_height, height = height, height + (30 + 18 * profiled if profiled else 0)
    parity_top = height + 10
    height += PARITY_PANEL_HEIGHT if with_parity else 0
    half = width // 2
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
             f'<text x="8" y="14">model TFLOP/s per GPU ({figures["preset"]}, gbs {figures["gbs"]}, '
             f'seq {figures["seq"]}, {figures["device"]})</text>',
             f'<text x="{half + 8}" y="14">loss per step</text>']
    top = max((r["model_tflops_per_gpu"] for r in rungs.values()), default=1.0) or 1.0
    bar = (half - 40) / max(len(rungs), 1)
    for i, (name, r) in enumerate(rungs.items()):
        h = (panels_height - 80) * r["model_tflops_per_gpu"] / top
        x, y = 20 + i * bar, panels_height - 50 - h
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar * 0.7:.1f}" height="{h:.1f}" fill="{CURVE_COLORS[i % len(CURVE_COLORS)]}"/>')
        parts.append(f'<text x="{x:.1f}" y="{y - 4:.1f}">{r["model_tflops_per_gpu"]:.1f}</text>')
        parts.append(f'<text x="{x:.1f}" y="{panels_height - 36}" font-size="9">{name}</text>')
    curves = [r["losses"] for r in rungs.values()]
    if curves and curves[0]:
        low, high = min(min(c) for c in curves), max(max(c) for c in curves)
        span, steps = (high - low) or 1.0, max(len(c) for c in curves)
        for i, losses in enumerate(curves):
            points = " ".join(f"{half + 20 + (half - 40) * s / max(steps - 1, 1):.1f},"
                              f"{30 + (panels_height - 80) * (high - v) / span:.1f}" for s, v in enumerate(losses))
            parts.append(f'<polyline points="{points}" fill="none" stroke="{CURVE_COLORS[i % len(CURVE_COLORS)]}" stroke-width="1.2"/>')
        parts.append(f'<text x="{half + 20}" y="{panels_height - 36}">{low:.3f} .. {high:.3f} over {steps} steps</text>')
    if profiled:
        parts += _step_panel(rungs, panels_height - 10, width)
    if with_parity:
        parts += _parity_panel(small, parity_top, width)
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """``--child RUN_JSON``: train one rung here (the parent's subprocess); ``--plot RECORD SVG``: draw a record."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(_train_one(json.loads(argv[1]))))
        return 0
    return plot_records(argv, lambda figures: plot_svg(figures[0]),
                        "usage: python -m bench train_ladder [options] | python -m bench.train_ladder --plot RECORD OUT.svg",
                        single=True)


if __name__ == "__main__":
    sys.exit(main())
