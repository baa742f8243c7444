"""A self-contained HTML page for a planned request: the plans, the chosen plan's schedule as a Gantt
chart (one row per pipeline rank, from the simulator's op records) and its memory per rank as
stacked bars against the GPU's capacity. Inline SVG and CSS only, so the file opens anywhere.
"""

from __future__ import annotations

import html
from pathlib import Path

from tuner.plan.iteration import Plan
from tuner.plan.request import Outcome

GiB = 1 << 30
COLOURS = {"forward": "#4c78a8", "backward": "#59a14f", "recompute": "#f28e2b",
           "weights+grads": "#4c78a8", "optimizer": "#b279a2", "activations": "#f28e2b", "buffers": "#9d9da0"}


def compact_layout(text: str) -> str:
    """``text`` with runs of three or more equal stages written as the layout grammar's groups, e.g.
    ``Et*2|(t*2|)*15,t|t|mL``: the same layout, short enough for a table cell."""
    stages = text.split("|")
    parts, i = [], 0
    while i < len(stages):
        j = i
        while j < len(stages) and stages[j] == stages[i]:
            j += 1
        run = j - i if j < len(stages) else j - i - 1  # the last stage stays outside a group: it ends the text
        if run >= 3:
            parts.append(f"({stages[i]}|)*{run},")
            i += run
        else:
            parts.append(stages[i] + ("|" if i < len(stages) - 1 else ""))
            i += 1
    return "".join(parts)


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _legend(names: list[str]) -> str:
    return "".join(f'<span class="key"><i style="background:{COLOURS[n]}"></i>{_esc(n)}</span>' for n in names)


def gantt_svg(plan: Plan, width: int = 1100, row: int = 26) -> str:
    """The schedule of ``plan``: per rank a row of forward, backward and (at a backward's start) recompute bars."""
    ev, model = plan.evaluation, plan.model
    recompute = set(plan.recompute_layer_ids)
    extra = [sum(model.layers[i].recompute_cost_ms for i in stage.layer_ids if i in recompute)
             for stage in plan.layout.stages]
    left, top = 70, 22
    span = max(ev.step_ms, ev.makespan_ms) or 1.0
    scale = (width - left - 10) / span
    height = top + model.pp * row + 24
    parts = [f'<svg class="gantt" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">']
    for rank in range(model.pp):
        y = top + rank * row
        parts.append(f'<g class="gantt-row" data-rank="{rank}">'
                     f'<text x="4" y="{y + row * 0.65:.1f}">rank {rank}</text>')
        for op in ev.schedule.ops:
            if op.rank != rank:
                continue
            x, w = left + op.start * scale, max((op.end - op.start) * scale, 0.3)
            tip = f"{'forward' if op.kind == 'F' else 'backward'} mb {op.microbatch} stage {op.stage}: {op.end - op.start:.2f} ms"
            colour = COLOURS["forward" if op.kind == "F" else "backward"]
            parts.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 6}" fill="{colour}" '
                         f'stroke="#fff" stroke-width="0.4"><title>{_esc(tip)}</title></rect>')
            if op.kind == "B" and extra[op.stage] > 0:
                parts.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{extra[op.stage] * scale:.2f}" height="{row - 6}" '
                             f'fill="{COLOURS["recompute"]}"><title>recompute stage {op.stage}: '
                             f'{extra[op.stage]:.2f} ms</title></rect>')
        tail = ev.tail_ms[rank]
        end = max((op.end for op in ev.schedule.ops if op.rank == rank), default=0.0)
        if tail > 0:
            parts.append(f'<rect x="{left + end * scale:.2f}" y="{y + 2}" width="{tail * scale:.2f}" height="{row - 6}" '
                         f'fill="none" stroke="#555" stroke-dasharray="3 2"><title>data-parallel traffic + optimizer: '
                         f'{tail:.2f} ms</title></rect>')
        parts.append("</g>")
    axis = top + model.pp * row + 12
    for i in range(6):
        t = span * i / 5
        parts.append(f'<text x="{left + t * scale:.1f}" y="{axis}" text-anchor="middle">{t:.0f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)


def memory_svg(plan: Plan, capacity: float, width: int = 520, height: int = 260) -> str:
    """Peak memory per rank, stacked by part, with the capacity as a dashed line."""
    memory = plan.evaluation.memory
    top_value = max(capacity, max(m.total for m in memory)) * 1.05
    left, bottom = 50, height - 26
    bar = min(60, (width - left - 10) / len(memory) * 0.7)
    step = (width - left - 10) / len(memory)
    scale = (bottom - 10) / top_value
    parts = [f'<svg class="memory" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">']
    for rank, m in enumerate(memory):
        x, y = left + rank * step + (step - bar) / 2, bottom
        parts.append(f'<g class="memory-bar" data-rank="{rank}">')
        for name, value in (("weights+grads", m.weights_and_grads), ("optimizer", m.optimizer),
                            ("activations", m.activations), ("buffers", m.buffers)):
            h = value * scale
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{COLOURS[name]}">'
                         f'<title>rank {rank} {name}: {value / GiB:.1f} GiB</title></rect>')
        parts.append(f'<text x="{x + bar / 2:.1f}" y="{bottom + 14}" text-anchor="middle">rank {rank}</text>'
                     f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{m.total / GiB:.0f}</text></g>')
    cap_y = bottom - capacity * scale
    parts.append(f'<line x1="{left}" x2="{width - 5}" y1="{cap_y:.1f}" y2="{cap_y:.1f}" stroke="#c00" '
                 f'stroke-dasharray="5 3"/><text x="{left - 4}" y="{cap_y + 4:.1f}" text-anchor="end" fill="#c00">'
                 f'{capacity / GiB:.0f}</text><text x="4" y="12">GiB</text></svg>')
    return "".join(parts)


def render(outcome: Outcome) -> str:
    """The whole page for ``outcome``."""
    r, best = outcome.request, outcome.plans[0]
    title = f"{r.model}: {r.nodes}x{r.gpus_per_node} {outcome.gpu.name}, gbs {r.gbs}, mbs {r.mbs}, seq {r.seq}, ep {r.ep}"
    rows = []
    for i, plan in enumerate(outcome.plans):
        d = outcome.plan_dict(plan)
        flags = d["megatron_recompute"]
        megatron = ("none" if flags == {} else "-" if flags is None
                    else f"{flags['recompute_method']} {flags['recompute_num_layers']}")
        rows.append("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in (
            "chosen" if i == 0 else i, d["pp"], d["vpp"], d["layout"],
            ",".join(map(str, d["recompute_layer_ids"])) or "-", megatron, f"{d['step_ms']:.1f}",
            f"{d['tokens_per_s_per_gpu']:.0f}", f"{d['tflops_per_gpu']:.0f}",
            f"{max(s['total_bytes'] for s in d['stages']) / GiB:.1f} / {outcome.capacity_bytes / GiB:.1f}")) + "</tr>")
    notes = [n for n in (outcome.label,) if n] + list(outcome.stale) + [f"warning: {w}" for w in outcome.warnings]
    gap = outcome.result.gap
    proof = "proven optimal" if gap == 0 else f"at most {gap:.2%} slower than the optimum (proven bound)"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title><style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }} td, th {{ border: 1px solid #ccc; padding: 3px 7px; }}
.note {{ color: #a40; }} .key {{ margin-right: 14px; font-size: 12px; }}
.key i {{ display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: middle; }}
</style></head><body>
<h1>{_esc(title)}</h1>
{"".join(f'<p class="note">{_esc(n)}</p>' for n in notes)}
<p>Plan {outcome.plan_id}: predicted step {best.step_ms:.1f} ms, {proof}. Costs from profiles
{_esc(outcome.loaded.kernel_tables)}; capacity {outcome.capacity_bytes / GiB:.1f} GiB
({"measured" if outcome.capacity_measured else "nominal"}).</p>
<table><tr><th></th><th>pp</th><th>vpp</th><th>layout</th><th>recompute ids</th><th>Megatron</th>
<th>step ms</th><th>tokens/s/GPU</th><th>TFLOP/s/GPU</th><th>peak GiB / capacity</th></tr>{"".join(rows)}</table>
<h2>Schedule of the chosen plan</h2>
<p>{_legend(["forward", "backward", "recompute"])} dashed: data-parallel traffic and optimizer step</p>
{gantt_svg(best)}
<h2>Memory per pipeline rank</h2>
<p>{_legend(["weights+grads", "optimizer", "activations", "buffers"])}</p>
{memory_svg(best, outcome.capacity_bytes)}
</body></html>
"""


def write_report(path: Path, outcome: Outcome) -> Path:
    """Write the page for ``outcome`` to ``path``."""
    path.write_text(render(outcome))
    return path
