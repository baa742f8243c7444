"""``tuner sweep shapes``: the kernel launches a model's step makes, where each takes its config from,
and sweep specs for the ones the tables miss (``tuner.train.model_shapes``). It builds the model on the
meta device, so it answers in seconds on any machine, GPU or not."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from tuner.cli import display
from tuner.cli.errors import command_engine, reporting

ERRORS = ("v4.config:PresetError", "v4.config:ModelArgumentError", "search_spaces.arch_facts:UnknownArchError",
          "tuner.sweep.spec:SpecError", "db:DatabaseError", "builtins:OSError")


@reporting(ERRORS)
def sweep_shapes(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="preset name (v4/presets) or a YAML file of ModelConfig fields")],
    seq: Annotated[int, typer.Option(min=1, help="sequence length")],
    mbs: Annotated[int, typer.Option(min=1, help="microbatch size")] = 1,
    ep: Annotated[int, typer.Option(min=1, help="expert-parallel ranks: each layer holds experts/ep experts")] = 1,
    arch: Annotated[str, typer.Option(help="the arch whose tables are asked, e.g. sm_90")] = "sm_90",
    specs: Annotated[Optional[Path], typer.Option(
        help="write a TPE sweep spec per kernel for the launches at their default here (queue them with "
             "`tuner sweep queue DIR/*.yaml`)")] = None,
    trials: Annotated[int, typer.Option(min=1, help="configs a shape in the written specs")] = 12,
    every: Annotated[bool, typer.Option("--all", help="specs for every launch, tuned ones too")] = False,
    queue_them: Annotated[bool, typer.Option("--queue", help="queue the sweeps in the database (`tuner serve` runs "
                                             "them, `tuner export` writes the table)")] = False,
) -> None:
    """The kernel launches of MODEL's training step, their shapes, and which ones ARCH's tables miss."""
    import yaml

    from search_spaces.arch_facts import arch_facts
    from tuner.train.model_shapes import model_launches, sweep_specs
    from v4.config import load_preset

    arch_facts(arch)  # an unknown arch is refused before the model is built
    config = load_preset(model)
    with display.console.status(f"building {config.name} on the meta device"):
        launches = model_launches(config, seq, mbs, ep, arch)
    table = Table("launch", "shape", "config from")
    for launch in launches:
        table.add_row(launch.kernel, " ".join(f"{k}={v}" for k, v in launch.shape.items()), launch.source)
    display.console.print(display.fitted(table))
    missing = [launch for launch in launches if launch.source == "default"]
    display.console.print(f"{len(missing)} of {len(launches)} launches of {config.name} (seq {seq}, mbs {mbs}, ep {ep}) "
                          f"run at their heuristic default on {arch}")
    bodies = sweep_specs(launches if every else missing, arch, trials)
    if queue_them:
        from tuner.sweep import queue
        from tuner.sweep.spec import parse_spec

        parsed = [parse_spec(body) for body in bodies]  # all checked before any is queued
        engine = command_engine(ctx)
        ids = [queue.enqueue(engine, spec) for spec in parsed]
        display.console.print(f"queued {len(ids)} sweeps ({ids[0]}-{ids[-1]}): tuner serve --drain, then "
                              f"tuner export --arch {arch}" if ids else "nothing to queue")
    if specs is None:
        return
    specs.mkdir(parents=True, exist_ok=True)
    for n, body in enumerate(bodies, 1):
        path = specs / f"{n:02d}-{body['kernel']}.yaml"
        partial = path.with_name(path.name + ".partial")
        partial.write_text(yaml.safe_dump(body, sort_keys=False))
        partial.replace(path)
    display.console.print(f"wrote {len(bodies)} specs to {specs}: tuner sweep queue {specs}/*.yaml")

