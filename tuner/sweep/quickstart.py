"""The sweeps the quickstart runs: every project kernel, full V4-Flash shapes on a GPU,
small ragged shapes with a few random configs on the CPU interpreter."""

from __future__ import annotations

from tuner.sweep.spec import SweepSpec, parse_spec

KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "sinkhorn_fwd", "sinkhorn_bwd")


def quickstart_specs(on_gpu: bool) -> list[SweepSpec]:
    if on_gpu:
        return [parse_spec({"kernel": k, "shapes": "v4-flash", "strategy": {"name": "grid"}}) for k in KERNELS]
    timing = {"warmup_ms": 1, "rep_ms": 20, "retime_rounds": 2, "retime_top": 2, "trial_timeout_s": 300,
              "retime_warmup_ms": 1, "retime_rep_ms": 20}
    return [parse_spec({"kernel": k, "shapes": "small", "strategy": {"name": "random", "seed": 0},
                        "budget": {"max_trials": 3}, "timing": timing}) for k in KERNELS]
