"""``bench/train_ladder.py``: each rung trains in its own process with its own kernels and tables, the
figures come from the run's result, and loss parity flags a rung that leaves bf16 noise."""

from __future__ import annotations

import argparse
import re

import pytest

from bench import train_ladder


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_ladder.add_arguments(parser)
    return parser.parse_args(list(argv))


def _answer(times: list[float], losses: list[float], tokens_per_s: float) -> dict:
    memory = {"rank": 0, "stages": [0], "params": 1, "static_bytes": 1, "saved_activation_peak_bytes": 1,
              "peak_allocated_bytes": 3 * 2**30, "peak_reserved_bytes": None}
    result = {"status": "ok", "message": "", "iteration_times_s": times, "losses": losses,
              "stage_memory": [memory], "tokens_per_s_per_gpu": tokens_per_s, "model_tflops_per_gpu": tokens_per_s / 10}
    return {"result": result, "tables": {"kernels": "triton", "arch": "sm_90", "sha256": None}}


def test_rungs_differ_only_in_kernels_tables_recompute_and_graphs():
    args = _args("--recompute", "full")
    configs = {rung: train_ladder.rung_config(rung, args, "cuda") for rung in train_ladder.RUNGS}
    assert configs["eager"][0]["kernels"] == "eager" and configs["eager"][1] == {}
    assert configs["triton-defaults"][1] == configs["triton-defaults-graphs"][1] == {"TUNER_TABLES": "off"}
    assert configs["triton-tuned"][0]["kernels"] == "triton" and configs["triton-tuned"][1] == {}
    assert configs["triton-tuned-recompute"][0]["recompute"] == "full"
    assert {c[0]["recompute"] for r, c in configs.items() if r != "triton-tuned-recompute"} == {"none"}
    assert {r for r, c in configs.items() if c[0]["cuda_graphs"]} == {"triton-defaults-graphs", "triton-tuned-graphs"}
    shared = [{k: v for k, v in c[0].items() if k not in ("kernels", "recompute", "cuda_graphs")}
              for c in configs.values()]
    assert all(s == shared[0] for s in shared)
    with pytest.raises(ValueError, match="rungs: unknown rung 'fast'"):
        train_ladder.rung_config("fast", args, "cuda")


def test_summary_leaves_warmup_out_and_parity_flags_a_drifting_rung():
    eager = train_ladder.summarize(_answer([9.0, 1.0, 3.0, 2.0], [5.0, 4.0, 3.0, 2.0], 100.0), 1)
    assert eager["step_ms_median"] == pytest.approx(2000.0) and eager["peak_allocated_gib"] == pytest.approx(3.0)
    assert eager["step_ms_mean"] == pytest.approx(2000.0)  # (1 + 3 + 2) / 3 s: the warm-up's 9 s left out
    rungs = {"eager": eager,
             "triton-defaults": train_ladder.summarize(_answer([1.0] * 4, [5.0, 4.0, 3.0, 2.001], 150.0), 1),
             "triton-tuned": train_ladder.summarize(_answer([1.0] * 4, [5.0, 4.0, 3.2, 2.0], 300.0), 1)}
    train_ladder._compare(rungs)
    assert rungs["triton-defaults"]["loss_parity_vs_eager"]["within_bf16_noise"] is True
    assert rungs["triton-tuned"]["loss_parity_vs_eager"] == {"max_rel_diff": pytest.approx(0.2 / 3.0),
                                                              "within_bf16_noise": False}
    assert rungs["triton-tuned"]["speedup_over_defaults"] == pytest.approx(2.0)
    assert rungs["triton-defaults"]["speedup_over_previous_rung"] == pytest.approx(1.5)
    svg = train_ladder.plot_svg({"preset": "tiny", "gbs": 2, "seq": 64, "device": "cpu", "rungs": rungs})
    assert svg.startswith("<svg") and svg.count("<polyline") == 3 and "triton-tuned" in svg
    parity = {"gbs": 2, "seq": 64, "losses": {"eager": [4.0, 2.0], "eager-perturbed": [4.0, 2.02],
                                              "triton-tuned": [4.0, 2.04]}}
    with_parity = train_ladder.plot_svg({"preset": "tiny", "gbs": 2, "seq": 64, "device": "cpu", "rungs": rungs,
                                         "parity": parity})
    gaps = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="[^"]+" stroke-width="1.2"( stroke-dasharray)?',
                      with_parity)[3:]
    # one curve a parity run beside eager, the perturbed one dashed; the tuned rung's 2% gap at the top
    assert [bool(dash) for _, dash in gaps] == [True, False] and "0 .. 2.0%" in with_parity
    top = float(gaps[1][0].split()[-1].split(",")[1])
    assert top == min(float(point.split(",")[1]) for points, _dash in gaps for point in points.split())


def test_a_failed_rung_is_reported_not_compared():
    failed = train_ladder.summarize({"result": {"status": "oom", "message": "CUDA out of memory"},
                                         "tables": {}}, 1)
    rungs = {"eager": train_ladder.summarize(_answer([1.0, 1.0], [2.0, 1.0], 10.0), 1), "triton-tuned": failed}
    train_ladder._compare(rungs)
    assert failed == {"status": "oom", "tables": {}, "message": "CUDA out of memory"}


def test_an_eager_rung_trains_in_its_own_process_and_profiles_one_more_step():
    figures = train_ladder.run(_args("--preset", "tiny", "--gbs", "1", "--seq", "64", "--iters", "2",
                                     "--warmup-iters", "1", "--device", "cpu", "--rungs", "eager", "--parity-seq", "0",
                                     "--profile-step"))
    eager = figures["rungs"]["eager"]
    assert eager["status"] == "ok", eager
    assert len(eager["losses"]) == 2 and all(loss > 0 for loss in eager["losses"])  # the profiled step is extra
    assert eager["tokens_per_s_per_gpu"] > 0 and eager["tables"]["kernels"] == "eager"
    profile = eager["step_profile"]  # on the CPU, the ops' self time
    assert profile["total_ms"] > 0 and profile["timed_ms"] > 0 and profile["device_busy"] > 0
    assert any(row["name"].startswith("aten::") for row in profile["other_top"])


def test_table_coverage_counts_the_launches_at_their_default_and_the_tuned_target_says_it():
    coverage = train_ladder.table_coverage("tiny", 64, 1, "sm_90")
    assert 0 < coverage["at_default"] <= coverage["launches"] and coverage["arch"] == "sm_90"
    assert "expert_up_fwd" in coverage["kernels_at_default"]  # tiny's widths are in no table
    rungs = {"triton-defaults": train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0], 1000.0), 1),
             "triton-tuned": train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0], 1100.0), 1)}
    train_ladder._compare(rungs)
    [row] = [r for r in train_ladder.targets({"rungs": rungs, "table_coverage": coverage})
             if r["target"].startswith("triton-tuned")]
    assert row["measured"].endswith(f"{coverage['at_default']} of the step's {coverage['launches']} launches "
                                    "found no table entry")


def test_idle_gaps_are_the_time_no_stream_covers_named_by_what_ended_them():
    from v4.pipeline import idle_gaps

    spans = [(0, 10, "a"), (5, 20, "b"), (25, 30, "c"), (40, 45, "d"), (42, 50, "e"), (60, 61, "c")]
    assert idle_gaps(spans) == {"c": 5 + 10, "d": 10}  # 20-25 and 50-60 before c, 30-40 before d
    assert idle_gaps(list(reversed(spans))) == idle_gaps(spans) and idle_gaps([]) == {}


def test_a_step_profile_splits_device_time_by_class_and_says_how_busy_the_device_was():
    profile = train_ladder.step_profile({"wall_s": 1.25e-3, "by_name_us": {
        "nvjet_tst_128x256_gemm": 600.0, "_sparse_attn_fwd_kernel": 200.0, "_adamw_kernel": 150.0, "vectorized_add": 50.0},
        "idle_before_us": {"_adamw_kernel": 120.0, "nvjet_tst_128x256_gemm": 30.0}})
    assert profile["idle_ms"] == 0.15 and [row["name"] for row in profile["idle_before_top"]] == [
        "_adamw_kernel", "nvjet_tst_128x256_gemm"]
    assert (profile["gemm_ms"], profile["attention_ms"], profile["other_ms"]) == (0.6, 0.2, 0.2)
    assert profile["device_busy"] == 0.8 and profile["total_over_gemm_and_attention"] == 1.25
    assert [row["name"] for row in profile["other_top"]] == ["_adamw_kernel", "vectorized_add"]
    rungs = {"triton-tuned": {**train_ladder.summarize(_answer([1.0] * 4, [5.0, 4.0], 300.0), 1), "step_profile": profile},
             "eager": train_ladder.summarize(_answer([1.0] * 4, [5.0, 4.0], 100.0), 1)}
    svg = train_ladder.plot_svg({"preset": "tiny", "gbs": 2, "seq": 64, "device": "cuda", "rungs": rungs})
    # the profiled rung's bar: GEMMs 0.6, attention 0.2, the rest 0.2, idle 0.25 of a 1.25 ms step, to scale
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="(?:3\d\d)" width="([\d.]+)" height="13"', svg)]
    assert widths == pytest.approx([480 * f / 1.25 for f in (0.6, 0.2, 0.2, 0.25)], abs=0.1)


def test_targets_judge_the_measured_rungs_and_say_when_eager_is_missing():
    rungs = {"eager": {"status": "oom", "message": "CUDA out of memory"},
             "triton-defaults": train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0], 1000.0), 1),
             "triton-tuned": train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0], 2000.0), 1)}
    train_ladder._compare(rungs)
    rows = {row["target"].split(" ")[0]: row for row in train_ladder.targets({"rungs": rungs})}
    assert rows["proxy-8l"]["status"] == "met" and "(triton-tuned)" in rows["proxy-8l"]["measured"]  # 200 >= 185
    assert rows["triton-tuned"]["status"] == "met" and rows["triton-tuned"]["measured"].startswith("2.000x")
    assert rows["Triton"]["status"] == "not measured" and "oom" in rows["Triton"]["measured"]
    on_h200 = {row["target"].split(" ")[0]: row for row in train_ladder.targets({"rungs": rungs, "gpu": "NVIDIA H200"})}
    assert on_h200["proxy-8l"]["status"] == "not judged: an H100's target, run on NVIDIA H200"
    rungs["triton-tuned"]["model_tflops_per_gpu"] = 90.0
    assert {row["status"] for row in train_ladder.targets({"rungs": rungs})} >= {"missed"}


def test_parity_at_a_smaller_size_is_judged_against_eagers_own_noise(monkeypatch):
    curves = {"eager": [4.0, 3.0, 2.0], "eager-perturbed": [4.0, 3.0, 2.006], "eager-perturbed-2": [4.0, 3.0, 2.002],
              "triton-defaults": [4.0, 3.0, 2.01], "triton-tuned": [4.0, 3.3, 2.0]}
    order = iter(curves)
    calls = []

    def fake(rung, args, device, weight_noise=0.0, noise_seed=0):
        calls.append((rung, args.seq, args.gbs, weight_noise, noise_seed))
        return train_ladder.summarize(_answer([1.0] * 3, curves[next(order)], 10.0), 1)

    monkeypatch.setattr(train_ladder, "_train_rung", fake)
    triton_rungs = ["triton-defaults", "triton-tuned"]
    small = train_ladder.parity_run(_args("--parity-seq", "256", "--parity-gbs", "2", "--parity-noise-runs", "2"),
                                    "cpu", triton_rungs)
    noise = train_ladder.WEIGHT_NOISE
    assert calls == [("eager", 256, 2, 0.0, 0), ("eager", 256, 2, noise, 0), ("eager", 256, 2, noise, 1),
                     ("triton-defaults", 256, 2, 0.0, 0), ("triton-tuned", 256, 2, 0.0, 0)]
    assert small["eager_noise_runs"] == [pytest.approx(0.003), pytest.approx(0.001)]
    assert small["eager_noise"] == pytest.approx(0.003)  # the largest draw
    assert small["band"] == pytest.approx(train_ladder.BF16_NOISE)  # 0.3% is under two bf16 ulps
    assert small["rungs"]["triton-defaults"] == {"max_rel_diff": pytest.approx(0.005), "within_noise": True}
    assert small["rungs"]["triton-tuned"]["within_noise"] is False
    curves["eager-perturbed-2"] = [4.0, 3.0, 2.4]  # rounding alone moves the curve 20%: both rungs are within it
    order = iter(curves)
    wide = train_ladder.parity_run(_args("--parity-seq", "256", "--parity-gbs", "2", "--parity-noise-runs", "2"),
                                   "cpu", triton_rungs)
    assert wide["band"] == pytest.approx(0.2) and all(r["within_noise"] for r in wide["rungs"].values())
    figures = {"rungs": {"eager": {"status": "oom"}}, "parity": small}
    row = train_ladder.targets(figures)[-1]
    assert row["status"] == "missed" and "at gbs 2, seq 256" in row["measured"]


def test_graph_rungs_pair_with_their_defaults_and_are_left_out_without_a_gpu(monkeypatch):
    rungs = {name: train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0], tokens), 1) for name, tokens in
             (("triton-defaults", 900.0), ("triton-tuned", 950.0), ("triton-defaults-graphs", 1500.0),
              ("triton-tuned-graphs", 2000.0))}
    train_ladder._compare(rungs)
    assert rungs["triton-tuned-graphs"]["speedup_over_defaults"] == pytest.approx(2000 / 1500)
    assert rungs["triton-tuned-graphs"]["speedup_over_eager_launches"] == pytest.approx(2000 / 950)
    assert rungs["triton-tuned-graphs"]["loss_vs_eager_launches"] == 0.0  # the same kernels, replayed
    rows = train_ladder.targets({"rungs": rungs})
    assert "(triton-tuned-graphs)" in rows[0]["measured"]  # the fastest rung is judged
    assert [row["status"] for row in rows[1:3]] == ["missed", "met"]  # 1.056x without graphs, 1.333x with

    ran = []
    monkeypatch.setattr(train_ladder, "_train_rung", lambda rung, *_a, **_k: ran.append(rung) or {"status": "oom"})
    figures = train_ladder.run(_args("--device", "cpu", "--rungs", "triton-tuned,triton-tuned-graphs",
                                     "--parity-seq", "0"))
    assert ran == ["triton-tuned"] and figures["left_out"] == {"triton-tuned-graphs": "CUDA graphs need a GPU"}


def test_a_repeated_rung_measures_its_own_run_to_run_gap(monkeypatch):
    first = train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.0, 1.5], 1000.0), 1)
    again = train_ladder.summarize(_answer([1.0] * 4, [3.0, 2.02, 1.47], 1100.0), 1)
    gap = train_ladder.repeat(first, again)
    assert gap["loss_vs_first_run"] == pytest.approx(0.02) and gap["speed_vs_first_run"] == pytest.approx(1.1)
    assert train_ladder.repeat(first, {"status": "oom"}) == {"status": "oom"}

    answers = iter([first, again])
    monkeypatch.setattr(train_ladder, "_train_rung", lambda *_a, **_k: next(answers))
    figures = train_ladder.run(_args("--device", "cpu", "--rungs", "triton-tuned", "--parity-seq", "0",
                                     "--repeat", "triton-tuned"))
    assert figures["repeats"]["triton-tuned"]["loss_vs_first_run"] == pytest.approx(0.02)
    with pytest.raises(ValueError, match="--repeat: 'eager' is not a rung"):
        train_ladder.run(_args("--device", "cpu", "--rungs", "triton-tuned", "--parity-seq", "0",
                               "--repeat", "eager"))
