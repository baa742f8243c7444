"""The CLI's entry imports no heavy module: torch, triton, Ray, Optuna, the kernels and the V4 model are
imported by the commands that need them, so ``tuner --help`` and the listing commands answer at once.
This checks the import graph, not a time (bench/cli_latency.py measures the time)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("torch", "triton", "ray", "optuna", "numpy", "kernels.registry", "kernels.launch", "kernels.rmsnorm",
         "kernels.sparse_attention", "v4.model", "v4.pipeline", "torch.distributed.pipelining", "workers.pool",
         "tuner.sweep.runner", "tuner.train.queue")

PROBE = """
import json, sys
import tuner.cli.main
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(code: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_importing_the_cli_imports_no_heavy_module():
    loaded = _modules_after(PROBE)
    assert "tuner.cli.main" in loaded
    assert sorted(loaded & set(HEAVY)) == []


@pytest.mark.parametrize("args", [
    ["--help"], ["sweep", "--help"], ["sweep", "list"], ["sweep", "status", "1"], ["tables", "show"],
    ["tables", "--help"], ["train", "list"], ["train", "--help"], ["export", "--help"], ["plan", "--help"],
    ["profile", "--help"], ["replay", "--help"], ["quickstart", "--help"], ["serve", "--help"],
])
def test_light_commands_import_no_heavy_module(args, tmp_path):
    """Each command the issue wants instant runs in a fresh interpreter; what it imported is read back."""
    code = f"""
import json, sys
from typer.testing import CliRunner
from tuner.cli.main import app
result = CliRunner().invoke(app, ["--db", "sqlite:///{tmp_path / 't.db'}", *{args!r}])
assert result.exit_code in (0, 2), result.output
print(json.dumps(sorted(sys.modules)))
"""
    assert sorted(_modules_after(code) & set(HEAVY)) == []


def test_every_named_user_error_exists():
    """The ``module:Class`` names the commands report in words are real exception classes (a renamed
    class would otherwise leave its errors as tracebacks)."""
    from tuner.cli import main, train

    for name in (*main.USER_ERRORS, *train.ERRORS):
        module, _, cls = name.partition(":")
        assert issubclass(getattr(importlib.import_module(module), cls), Exception), name


def test_the_sweep_run_driver_imports_neither_torch_nor_the_kernels():
    """`tuner sweep run` checks its spec and reads its kernel's facts in a child process
    (tuner.sweep.kernel_facts): the driver's own modules, the runner, the pool and Ray's included,
    import no torch, Triton or kernel module, whose import would hold its interpreter lock."""
    code = """
import json, sys
import tuner.cli.main, tuner.sweep.serve, tuner.sweep.kernel_facts, workers.pool, workers.compile_task
print(json.dumps(sorted(sys.modules)))
"""
    assert sorted(_modules_after(code) & {"torch", "triton", "kernels.registry", "kernels.launch"}) == []


def test_the_spec_checked_in_a_child_matches_the_one_checked_here(tmp_path):
    from tuner.sweep.kernel_facts import KernelFacts, check_in_a_process
    from tuner.sweep.spec import SpecError, load_spec

    spec = tmp_path / "rms.yaml"
    spec.write_text("kernel: rmsnorm_fwd\nshapes: [{hidden: 128, tokens: 64}]\n"
                    "strategy: {name: grid}\nbudget: {max_trials: 4}\n")
    parsed, facts = check_in_a_process(spec)
    here = load_spec(spec)
    assert parsed.model_dump() == here.model_dump() and facts == KernelFacts.of(here)
    assert facts.shapes[0].key == "tokens=64,hidden=128"  # the kernel's field order, as a queued spec stores it
    spec.write_text("kernel: rmsnorm_fwd\nshapes: [{tokens: 64}]\n")
    with pytest.raises(SpecError, match=r"rms\.yaml: .*shapes\[0\]: .*missing \['hidden'\]"):  # the kernel's check
        check_in_a_process(spec)
