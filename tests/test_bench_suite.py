"""The benchmark suite's runner, records and generated pages (``bench/__main__.py``, ``record.py``, ``report.py``)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from bench import __main__ as runner
from bench import report
from bench.record import FIELDS, read_record, record_paths, write_record

ROOT = Path(__file__).resolve().parents[1]


def _record(benchmark: str, device: str, figures: dict) -> dict:
    return {"benchmark": benchmark, "claim": f"{benchmark} claim", "device": device,
            "toolchain": {"python": "3.12.0", "torch": "2.11.0", "triton": "3.6.0", "cuda": "12.8"},
            "commit": "abc123", "table_digest": "sm_90:ff", "command": ["python", "-m", "bench", benchmark],
            "started_at": "2026-12-05T10:00:00+00:00", "figures": figures}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A benchmark ``toy`` the runner finds, whose ``run`` echoes ``--n`` or refuses a negative one."""
    module = types.ModuleType("bench.toy", "Toy claim: n doubles.\n\nLonger text.")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=1)

    def run(args: argparse.Namespace) -> dict:
        if args.n < 0:
            raise ValueError(f"--n: must be at least 0, got {args.n}")
        return {"doubled": 2 * args.n}

    module.add_arguments, module.run = add_arguments, run
    monkeypatch.setitem(sys.modules, "bench.toy", module)
    monkeypatch.setattr(runner, "benchmarks", lambda: {"toy": "Toy claim: n doubles."})
    return module


def test_runner_writes_a_complete_record(toy: types.ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "toy.json"
    assert runner.main(["toy", "--n", "3", "--record", str(path)]) == 0
    record = read_record(path)
    assert record["figures"] == {"doubled": 6}
    assert record["benchmark"] == "toy" and record["claim"] == "Toy claim: n doubles."
    assert record["command"] == ["python", "-m", "bench", "toy", "--n", "3", "--record", str(path)]
    assert set(record["toolchain"]) == {"python", "torch", "triton", "cuda"}
    assert record["device"] and record["started_at"].endswith("+00:00")


def test_runner_refuses_bad_input_with_exit_2_and_writes_nothing(toy: types.ModuleType, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    assert runner.main(["toy", "--n", "-1", "--record", str(tmp_path / "toy.json")]) == 2
    assert "--n: must be at least 0" in capsys.readouterr().err
    assert runner.main(["no_such_benchmark"]) == 2
    assert list(tmp_path.iterdir()) == []


def _stepwise(monkeypatch: pytest.MonkeyPatch, fail_at: int | None) -> None:
    """A benchmark ``steps`` that saves its progress after each of three steps, and dies at ``fail_at``."""
    module = types.ModuleType("bench.steps", "Steps claim.")
    module.add_arguments = lambda parser: None

    def run(args: argparse.Namespace) -> dict:
        done: dict = {"steps": []}
        for step in range(3):
            if step == fail_at:
                raise KeyboardInterrupt  # the run killed midway
            done["steps"].append(step)
            args.save_partial(done)
        return done

    module.run = run
    monkeypatch.setitem(sys.modules, "bench.steps", module)
    monkeypatch.setattr(runner, "benchmarks", lambda: {"steps": "Steps claim."})


def test_a_run_killed_midway_keeps_its_finished_steps_in_a_partial_record(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    _stepwise(monkeypatch, fail_at=2)
    path = tmp_path / "steps.json"
    with pytest.raises(KeyboardInterrupt):
        runner.main(["steps", "--record", str(path)])
    assert not path.exists()
    partial = read_record(tmp_path / "steps.json.partial")
    assert partial["figures"] == {"steps": [0, 1], "complete": False}


def test_a_finished_run_leaves_only_its_complete_record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _stepwise(monkeypatch, fail_at=None)
    path = tmp_path / "steps.json"
    assert runner.main(["steps", "--record", str(path)]) == 0
    assert read_record(path)["figures"] == {"steps": [0, 1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.json"]


def test_no_record_prints_only(toy: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(runner, "default_path", lambda record: tmp_path / "toy.json")
    assert runner.main(["toy", "--no-record"]) == 0
    assert json.loads(capsys.readouterr().out) == {"doubled": 2}
    assert not (tmp_path / "toy.json").exists()


def test_every_benchmark_module_keeps_the_contract() -> None:
    found = runner.benchmarks()
    assert found, "no benchmark module in bench/"
    for name, claim in found.items():
        assert claim, f"bench/{name}.py: the docstring's first line must state the claim"
        module = importlib.import_module(f"bench.{name}")
        assert "--record" in runner._parser(name, module).format_help()  # its arguments register without a clash


def test_records_round_trip_plain_and_gzipped(tmp_path: Path) -> None:
    record = _record("a", "NVIDIA H200", {"x": 1.5})
    for name in ("a.json", "a.json.gz"):
        write_record(record, tmp_path / name)
        assert read_record(tmp_path / name) == record
    assert [p.name for p in record_paths(tmp_path)] == ["a.json", "a.json.gz"]  # no temp file left behind


def test_a_file_without_the_fields_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"benchmark": "x"}))
    with pytest.raises(ValueError, match="missing claim, device"):
        read_record(tmp_path / "bad.json")
    assert set(FIELDS) >= {"benchmark", "device", "toolchain", "commit", "table_digest", "command", "figures"}


def test_report_regenerates_from_records(tmp_path: Path) -> None:
    records = tmp_path / "records"
    write_record(_record("b_bench", "NVIDIA H200", {
        "targets": [{"target": "fast >= 2x", "measured": "2.5x", "status": "met"}],
        "speedup": 2.5, "per_kernel": {"k1": {"ms": 1.0, "tflops": 300.0}, "k2": {"ms": 2.0}},
        "nested": {"inner": {"deep": {"v": 1}}, "n": 3}}), records / "b_bench.nvidia-h200.json.gz")
    write_record(_record("a_bench", "cpu: Xeon", {"rows": [{"x": 1, "y": "p|q"}, {"x": 2, "z": None}]}),
                 records / "a_bench.cpu-xeon.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nstale\n{report.END}\nrest\n")
    out = tmp_path / "performance.md"
    assert report.generate(records, out, readme) == [out, readme]
    page = out.read_text()
    assert page.index("## a_bench on cpu: Xeon") < page.index("## b_bench on NVIDIA H200")
    assert "|  | ms | tflops |\n|---|---|---|\n| k1 | 1 | 300 |\n| k2 | 2 | - |" in page
    assert "| x | y | z |\n|---|---|---|\n| 1 | p\\|q | - |\n| 2 | - | - |" in page
    assert "#### inner" in page and "| speedup | 2.5 |" in page
    text = readme.read_text()
    assert "stale" not in text and text.startswith("intro\n") and text.endswith(f"{report.END}\nrest\n")
    assert "| fast >= 2x | 2.5x | met | [NVIDIA H200](docs/performance.md#b_bench-on-nvidia-h200) |" in text
    assert "| a_bench claim | see record |  | [cpu: Xeon](docs/performance.md#a_bench-on-cpu-xeon) |" in text
    assert report.generate(records, out, readme) == []  # deterministic: nothing changes the second time


def test_report_without_readme_markers_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "records").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert report.main(["--records", str(tmp_path / "records"), "--out", str(tmp_path / "p.md"),
                        "--readme", str(readme)]) == 2
    assert not (tmp_path / "p.md").exists() and readme.read_text() == "no markers\n"


def test_committed_pages_are_what_the_committed_records_generate() -> None:
    records = report.load_records()
    assert (ROOT / "docs" / "performance.md").read_text() == report.render_performance(records)
    readme = (ROOT / "README.md").read_text()
    assert readme == report.splice_readme(readme, report.render_standing(records))


def test_every_record_has_a_section_and_a_link_of_its_own() -> None:
    """Records of one benchmark on one device (``service_load.one-server.<device>.json``) are told apart
    by their file name's middle, so each README link lands on its own section."""
    headings = [report._heading(record) for record in report.load_records()]
    assert len(headings) == len(set(headings)), sorted(h for h in headings if headings.count(h) > 1)


def test_commit_of_an_exported_tree_is_never_borrowed_from_a_checkout_around_it(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.record import ROOT, git_commit

    exported = ROOT / "bench" / "records"  # a folder inside the checkout stands for a tree git archive wrote
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert git_commit(exported) is None
    assert git_commit(tmp_path) is None
    assert git_commit(ROOT) is not None
    monkeypatch.setenv("BENCH_COMMIT", "3b87541a37da46d1fac0be1c1f2428975190616c")
    assert git_commit(exported) == "3b87541a37da46d1fac0be1c1f2428975190616c"
