"""Where the planner's memory error at PP = 2 comes from, from the committed H200 results.

Per pipeline rank of every PP = 2 run: static bytes, peak bytes saved for backward, and the rest
of the peak allocated ("other": workspace, p2p buffers, transients) as measured, beside the
planner's prediction. Also the sum of the per-layer profiles' activation bytes against the
saved bytes of the whole model trained on one GPU: a check of the activation accounting alone.

Usage: python bench/plan_validate_memory.py   (reads bench/results/2026-11-30-h200-*; prints markdown)
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.planner.profiles import model_layer_kinds
from v4.config import load_preset

GiB = 1 << 30
RESULTS = Path(__file__).parent / "results"
VALIDATE = RESULTS / "2026-11-30-h200-plan-validate"


def main() -> None:
    runs = json.loads((VALIDATE / "train-runs.json").read_text())
    predicted = {r["run_id"]: r for r in json.loads((VALIDATE / "summary-pp2-gpus2.json").read_text())["runs"]}
    print("| run | layout | recompute | rank | static GiB | saved GiB | other GiB | peak GiB | predicted GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in (r for r in runs if r["status"] == "ok"):
        for memory, guess in zip(run["stage_memory"], predicted[run["id"]]["predicted_bytes"]):
            other = memory["peak_allocated_bytes"] - memory["static_bytes"] - memory["saved_activation_peak_bytes"]
            layout = run["layout"].replace("|", "\\|")
            print(f"| {run['id']} | `{layout}` | {run['recompute']} | {memory['rank']} | "
                  f"{memory['static_bytes'] / GiB:.1f} | {memory['saved_activation_peak_bytes'] / GiB:.1f} | "
                  f"{other / GiB:.1f} | {memory['peak_allocated_bytes'] / GiB:.1f} | {guess / GiB:.1f} |")
    profiles = {p["layer_kind"]: p for p in json.loads((VALIDATE / "proxy-8l-layer-profiles.json").read_text())}
    kinds = model_layer_kinds(load_preset("proxy-8l")) + ["embedding", "head"]
    summed = sum(profiles[k]["activation_bytes"] for k in kinds)
    whole = next(r for r in json.loads((RESULTS / "2026-11-30-h200-training" / "train-runs.json").read_text())
                 if r["status"] == "ok" and r["kernels"] == "triton" and r["recompute"] == "none")
    saved = whole["stage_memory"][0]["saved_activation_peak_bytes"]
    print(f"\nproxy-8l, one microbatch: the layer profiles sum to {summed / GiB:.2f} GiB saved for backward; "
          f"the whole model on one GPU saved {saved / GiB:.2f} GiB at its peak ({summed / saved - 1:+.1%}).")


if __name__ == "__main__":
    main()
