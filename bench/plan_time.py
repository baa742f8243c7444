"""Planning time: tuner plan plans one node count in under 2 s of CPU, and a sweep of 4 node counts in under 8 s.

What is timed is what ``tuner plan --nodes 2,4,8,16`` does after its imports (``cli_latency``
times those): resolving the request once (the preset, the profiles, the FLOPs figure) and
searching every (pp, vpp) of each node count, in CPU seconds of this process
(``time.process_time``: the CPU machine is shared, and CPU time is what a loaded machine
changes least). The database is a new empty SQLite file, so the profiles are the packaged ones,
as on a fresh install; ``--profiles-from`` plans another GPU kind from them (borrowed). The
first count also pays the process's one-time costs (torch's first ops in the FLOPs figure);
``--repeat`` runs it all again in the same process and the figures are the worst over repeats.
Each count is timed alone, as ``tuner plan --nodes N`` (resolving included), then the sweep.
Per node count the record also keeps the plan's step, the proven gap, and the lower bound.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

ONE_COUNT_S, SWEEP_S = 2.0, 8.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="v4-flash", help="model preset")
    parser.add_argument("--gpu", default="h100", help="GPU kind planned for")
    parser.add_argument("--profiles-from", default=None, help="plan from this GPU kind's packaged profiles")
    parser.add_argument("--nodes", default="2,4,8,16", help="node counts, as tuner plan --nodes takes them")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gbs", type=int, default=256)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=2, help="sweeps in one process (the worst is kept)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from db import open_database
    from tuner.cli.plan import node_counts
    from tuner.plan.profiles import ProfilesMissing
    from tuner.plan.request import PlanRequest, RequestError, plan_node_counts

    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    try:
        counts = node_counts(args.nodes)
        request = PlanRequest.parse(model=args.model, nodes=counts[0], gpus_per_node=args.gpus_per_node, gpu=args.gpu,
                                    gbs=args.gbs, seq=args.seq, profiles_from=args.profiles_from)
    except RequestError as exc:
        raise ValueError(str(exc)) from None
    sweeps, singles = [], {n: [] for n in counts}
    with tempfile.TemporaryDirectory(prefix="plan-time-") as folder:
        engine = open_database(f"sqlite:///{Path(folder) / 'empty.db'}")
        try:
            for _ in range(args.repeat):
                for n in counts:  # one count as `tuner plan --nodes N` plans it: resolving included
                    singles[n].append(plan_node_counts(engine, request, [n]))
                sweeps.append(plan_node_counts(engine, request, counts))
        except (RequestError, ProfilesMissing) as exc:
            raise ValueError(str(exc)) from None
    per_count = {}
    for n in counts:
        row = singles[n][-1]["rows"][0]
        per_count[str(n)] = {
            "cpu_s": max(single["cpu_s"] for single in singles[n]), "fits": row["fits"],
            **({"step_ms": row["plan"]["step_ms"], "gap": row["gap"], "lower_bound_ms": row["lower_bound_ms"],
                "pp": row["plan"]["pp"], "vpp": row["plan"]["vpp"], "layout": row["plan"]["layout"]}
               if row["fits"] else {"why": row["why"]})}
    worst_one = max(c["cpu_s"] for c in per_count.values())
    worst_sweep = max(sweep["cpu_s"] for sweep in sweeps)
    resolved = sweeps[-1]["resolved"]
    return {
        "request": {**request.model_dump(exclude={"nodes", "top"}), "nodes": counts},
        "profiles_source": resolved.loaded.source, "borrowed": resolved.borrowed,
        "per_node_count": per_count, "sweep_cpu_s": [sweep["cpu_s"] for sweep in sweeps],
        "smallest_fitting_nodes": sweeps[-1]["smallest_fitting"], "load_average": list(os.getloadavg()),
        "targets": [
            {"target": f"one node count < {ONE_COUNT_S:g} s CPU", "measured": f"{worst_one:.2f} s (worst count)",
             "status": "met" if worst_one < ONE_COUNT_S else "missed"},
            {"target": f"{len(counts)} node counts < {SWEEP_S:g} s CPU", "measured": f"{worst_sweep:.2f} s",
             "status": "met" if worst_sweep < SWEEP_S else "missed"},
        ],
    }
