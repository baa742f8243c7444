"""The tables of a plan validation (``tuner plan validate``), as rich tables and as one HTML page.

Both render :meth:`tuner.plan.validate.Validation.to_dict`, so what they show is what
``--json`` prints and what the database stores.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from rich.table import Table

MiB = 1 << 20


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def candidate_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per candidate: name, layout, recompute ids, status, step predicted / measured / error."""
    rows = []
    for c in data["candidates"]:
        status = c["status"] + (f" (stage {c['oom_stage']})" if c["status"] == "oom" else "")
        if c["status"] == "oom" and c["predicted_fits"]:
            status += ", predicted to fit"
        rows.append([c["name"], c["layout"], ",".join(map(str, c["recompute_layer_ids"])) or "-", status,
                     _ms(c["predicted_step_ms"]), _ms(c["measured_step_ms"]), _pct(c["time_error"]),
                     _ms(c["refit_step_ms"]), _pct(c["refit_time_error"])])
    return rows


def memory_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per candidate and pipeline rank: memory predicted / measured (MiB) and the error."""
    rows = []
    for c in data["candidates"]:
        for rank, predicted in enumerate(c["predicted_stage_bytes"]):
            measured = c["measured_stage_bytes"][rank] if c["measured_stage_bytes"] else None
            rows.append([c["name"], str(rank), f"{predicted / MiB:.1f}",
                         "-" if measured is None else f"{measured / MiB:.1f}",
                         _pct(c["memory_error"][rank] if c["memory_error"] else None),
                         f"{c['refit_stage_bytes'][rank] / MiB:.1f}",
                         _pct(c["refit_memory_error"][rank] if c["refit_memory_error"] else None)])
    return rows


CANDIDATE_HEADERS = ["candidate", "layout", "recompute ids", "status", "predicted ms", "measured ms", "error",
                     "refit ms", "refit error"]
MEMORY_HEADERS = ["candidate", "rank", "predicted MiB", "measured MiB", "error", "refit MiB", "refit error"]


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The headline comparisons, one sentence each."""
    lines = [f"plan {data['plan_id']}, validation {data['validation_id']}: {len(data['candidates'])} runs on "
             f"{data['device']} ({data['gpu_kind']})",
             f"median |error|: step {_pct(data['median_abs_time_error'])}, memory "
             f"{_pct(data['median_abs_memory_error'])}; step after the refit "
             f"{_pct(data['median_abs_time_error_refit'])}"
             " (fitted on these runs)"]
    if data["measured_best"] is not None:
        pick = ("failed, no comparison" if data["pick_vs_best"] is None else
                "is the measured best" if data["pick_vs_best"] == 0 else f"{data['pick_vs_best']:+.1%} vs it")
        lines.append(f"measured best: {data['measured_best']}; the planner's pick {pick}")
    if data["pick_speedup_vs_baseline"] is not None:
        lines.append(f"pick vs {data['baseline']}: {data['pick_speedup_vs_baseline']:+.1%} throughput")
    if data["mispredicted_fits"]:
        lines.append(f"out of memory although predicted to fit: {', '.join(data['mispredicted_fits'])}")
    fit, after = data["fit"], data["calibration_after"]
    lines.append(f"refit over {fit['time_points']} runs / {fit['memory_points']} ranks: time factor "
                 f"{fit['time_factor']:.3f} (time_scale {after['time_scale']:.3f}), fragmentation "
                 f"{after['fragmentation']:.3f}, reserved {after['reserved_bytes'] / MiB:.1f} MiB")
    lines.append("re-ranked under the refit: " + (" > ".join(data["refit_ranking"]) or "none fits"))
    return lines


def tables(data: dict[str, Any]) -> list[Table]:
    """The candidate and memory tables for the terminal."""
    steps = Table(*CANDIDATE_HEADERS, title="step time per candidate")
    for row in candidate_rows(data):
        steps.add_row(*row)
    memory = Table(*MEMORY_HEADERS, title="memory per pipeline rank")
    for row in memory_rows(data):
        memory.add_row(*row)
    return [steps, memory]


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def write_validation_report(path: Path, data: dict[str, Any]) -> Path:
    """Write the validation's page to ``path``."""
    r = data["request"]
    title = f"validation of plan {data['plan_id']}: {r['model']} on {r['gpus_per_node']} x {data['gpu_kind']}"
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; margin-bottom: 18px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 7px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
{"".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(data))}
<h2>Step time</h2>
{_html_table(CANDIDATE_HEADERS, candidate_rows(data))}
<h2>Memory per pipeline rank</h2>
{_html_table(MEMORY_HEADERS, memory_rows(data))}
</body></html>
""")
    return path
