"""Malformed input, command by command: every case exits with code 2, names the field or file and the
reason, prints no traceback, and writes nothing (no sweep queued, no file changed or created).

Each case is (name, the command's arguments, text the message must hold); ``{spec}``, ``{dir}`` and
``{db}`` in an argument are the malformed spec file, a scratch folder and the case's database URL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from typer.testing import CliRunner

from db import Sweep, open_database, session_scope
from tuner.cli.main import app

GOOD = "kernel: rmsnorm_fwd\nshapes: [{tokens: 64, hidden: 128}]\n"

# (case, spec file content or None, arguments, what the error names)
SPEC_CASES = [
    ("binary", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8 text"),
    ("latin-1", "kernel: rmsnorm_fwd  # caf\xe9\n".encode("latin-1"), "not UTF-8 text"),
    ("empty", b"", "<spec>: must be a mapping"),
    ("a list", b"- kernel\n", "<spec>: must be a mapping"),
    ("deep yaml", b"[" * 20000 + b"]" * 20000, ""),
    ("bad yaml", b"kernel: [unclosed\n", "not valid YAML"),
    ("unknown kernel", b"kernel: nope\nshapes: v4-flash\n", "unknown kernel 'nope'"),
    ("empty shapes", b"kernel: rmsnorm_fwd\nshapes: []\n", "shapes"),
    ("zero dim", b"kernel: rmsnorm_fwd\nshapes: [{tokens: 0, hidden: 128}]\n", "shapes[0].tokens: every dimension must be >= 1"),
    ("negative dim", b"kernel: rmsnorm_fwd\nshapes: [{tokens: -4, hidden: 128}]\n", "shapes[0].tokens"),
    ("dim past int64", b"kernel: rmsnorm_fwd\nshapes: [{tokens: 9223372036854775808, hidden: 128}]\n",
     "shapes[0].tokens"),
    ("string dim", b"kernel: rmsnorm_fwd\nshapes: [{tokens: '64', hidden: 128}]\n", "shapes"),
    ("bool dim", b"kernel: rmsnorm_fwd\nshapes: [{tokens: true, hidden: 128}]\n", "shapes"),
    ("missing field", b"kernel: rmsnorm_fwd\nshapes: [{tokens: 64}]\n", "missing ['hidden']"),
    ("unknown preset", b"kernel: rmsnorm_fwd\nshapes: huge\n", "unknown preset 'huge'"),
    ("null space value", GOOD.encode() + b"space: {num_warps: [null]}\n", "num_warps: None is null"),
    ("zero space value", GOOD.encode() + b"space: {num_warps: [0]}\n", "num_warps: 0 must be positive"),
    ("negative space value", GOOD.encode() + b"space: {num_warps: [-4]}\n", "num_warps: -4 must be positive"),
    ("nested list value", GOOD.encode() + b"space: {num_warps: [[4, 8]]}\n", "not a number or string"),
    ("dict value", GOOD.encode() + b"space: {num_warps: [{a: 1}]}\n", "not a number or string"),
    ("string value", GOOD.encode() + b"space: {num_warps: [four]}\n", "num_warps: 'four' is a string"),
    ("empty choices", GOOD.encode() + b"space: {num_warps: []}\n", "non-empty list"),
    ("not a list", GOOD.encode() + b"space: {num_warps: 4}\n", "space"),
    ("unknown param", GOOD.encode() + b"space: {WARPS: [4]}\n", "'WARPS' is not a parameter"),
    ("seed past 32 bits", GOOD.encode() + b"strategy: {name: random, seed: 99999999999}\nbudget: {max_trials: 2}\n",
     "strategy.seed"),
    ("zero budget", GOOD.encode() + b"budget: {max_trials: 0}\n", "budget.max_trials"),
    ("unknown field", GOOD.encode() + b"colour: red\n", "colour"),
    ("unknown arch", GOOD.encode() + b"arch: sm_1000\n", "unknown arch 'sm_1000'"),
]

BIG = str(2**63)
HUGE = "9" * 30
ARGUMENT_CASES = [
    ("sweep status past int64", ["sweep", "status", BIG], "sweep_id"),
    ("sweep status huge", ["sweep", "status", HUGE], "sweep_id"),
    ("sweep status negative", ["sweep", "status", "-1"], ""),
    ("sweep status text", ["sweep", "status", "abc"], "sweep_id"),
    ("sweep cancel past int64", ["sweep", "cancel", BIG], "sweep_id"),
    ("sweep status missing", ["sweep", "status", "42"], "no sweep with id 42"),
    ("train show past int64", ["train", "show", BIG], "run_id"),
    ("train cancel huge", ["train", "cancel", HUGE], "run_id"),
    ("train show missing", ["train", "show", "42"], "no training run with id 42"),
    ("replay past int64", ["replay", "--sweep", BIG], "--sweep"),
    ("replay missing", ["replay", "--sweep", "7"], "no sweep with id 7"),
    ("sweep queue fifo", ["sweep", "queue", "{dir}/fifo.yaml"], "not a regular file"),
    ("sweep queue folder", ["sweep", "queue", "{dir}"], "not a regular file"),
    ("sweep queue missing file", ["sweep", "queue", "{dir}/none.yaml"], "no such file"),
    ("sweep run bad spec", ["sweep", "run", "{dir}/bad.yaml"], "shapes"),
    ("export out a file", ["export", "--arch", "sm_90", "--out", "{dir}/file.txt"], "is not a folder"),
    ("export out /dev/null", ["export", "--arch", "sm_90", "--out", "/dev/null"], "/dev/null is not a folder"),
    ("export nothing", ["export", "--arch", "sm_90", "--out", "{dir}/tables"], "no ok trials"),
    ("export bad rank", ["export", "--arch", "sm_90", "--out", "{dir}/tables", "--rank", "fast"], "--rank"),
    ("quickstart out a file", ["quickstart", "--out", "{dir}/file.txt"], "is not a folder"),
    ("tables show nothing", ["tables", "show", "--dir", "{dir}/tables"], "no tuned table"),
    ("train queue bad layout", ["train", "queue", "--model", "proxy-8l", "--gbs", "2", "--seq", "64", "--iters", "2",
                                "--layout", "(" * 5000 + "t" + ")" * 5000], "too-large"),
    ("train queue graphs with eager ops", ["train", "queue", "--model", "proxy-8l", "--gbs", "2", "--seq", "64",
                                           "--iters", "2", "--cuda-graphs"], "cuda_graphs needs kernels triton"),
    ("train run huge repeat", ["train", "run", "--model", "proxy-8l", "--gbs", "2", "--seq", "64", "--iters", "2",
                               "--layout", "Et*1000000000L"], "too-large"),
    ("tables reset path in arch", ["tables", "reset", "--arch", "../file"], "--arch: '../file' is not an arch name"),
    ("tables show path in arch", ["tables", "show", "--arch", "../../x"], "--arch: '../../x' is not an arch name"),
    ("serve zero lease", ["serve", "--lease-seconds", "0"], "lease-seconds"),
    ("sweep shapes unknown model", ["sweep", "shapes", "--model", "nope", "--seq", "64"], "unknown preset 'nope'"),
    ("sweep shapes zero seq", ["sweep", "shapes", "--model", "tiny", "--seq", "0"], "--seq"),
    ("sweep shapes specs a file", ["sweep", "shapes", "--model", "tiny", "--seq", "64", "--specs", "{dir}/file.txt"],
     "file.txt"),
]

TABLE_CASES = [
    ("truncated", b'{"schema_version": 1, "arch": "sm_90", "entr', "not valid JSON"),
    ("binary", b"\x00\x01\x02\xff\xfe", "not UTF-8 text"),
    ("wrong shape", b'{"schema_version": 1, "arch": "sm_90", "entries": [1, 2]}', "'entries' must be an object"),
    ("a list", b"[1, 2, 3]", "not a tuned table"),
    ("deep", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("other schema", b'{"schema_version": 7, "entries": {}}', "schema_version must be 1"),
]


def _invoke(db: str, args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--db", db, *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    return result.exit_code, result.output


def _sweeps(db: str) -> int:
    with session_scope(open_database(db)) as session:
        return session.scalar(select(func.count()).select_from(Sweep))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_clean_error(code: int, output: str, reason: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    assert reason in output, output


@pytest.mark.parametrize("content, reason", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_a_malformed_spec_is_refused_by_queue_and_run(tmp_path, content, reason):
    db = f"sqlite:///{tmp_path / 't.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    for command in ("queue", "run"):
        code, output = _invoke(db, ["sweep", command, str(spec)])
        _assert_clean_error(code, output, reason)
        assert str(spec) in output or reason.split(":")[0] in output
    assert _sweeps(db) == 0


@pytest.mark.parametrize("args, reason", [c[1:] for c in ARGUMENT_CASES], ids=[c[0] for c in ARGUMENT_CASES])
def test_a_malformed_argument_exits_2_and_writes_nothing(tmp_path, args, reason):
    db = f"sqlite:///{tmp_path / 't.db'}"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.mkfifo(scratch / "fifo.yaml")
    (scratch / "file.txt").write_text("not a folder\n")
    (scratch / "bad.yaml").write_text("kernel: rmsnorm_fwd\nshapes: []\n")
    before = _files(scratch)
    code, output = _invoke(db, [a.replace("{dir}", str(scratch)) for a in args])
    _assert_clean_error(code, output, reason)
    assert _files(scratch) == before and not (scratch / "tables").exists()
    assert _sweeps(db) == 0


@pytest.mark.parametrize("content, reason", [c[1:] for c in TABLE_CASES], ids=[c[0] for c in TABLE_CASES])
def test_a_malformed_table_is_named_by_tables_show_and_kept_by_export(tmp_path, content, reason):
    db = f"sqlite:///{tmp_path / 't.db'}"
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "sm_90.json").write_bytes(content)
    code, output = _invoke(db, ["tables", "show", "--dir", str(folder)])
    _assert_clean_error(code, output, reason)
    assert "sm_90.json" in output
    code, output = _invoke(db, ["tables", "show", "--arch", "sm_90", "--dir", str(folder)])
    _assert_clean_error(code, output, reason)
    code, output = _invoke(db, ["export", "--arch", "sm_90", "--out", str(folder)])  # merging into it
    _assert_clean_error(code, output, "--no-merge replaces it")
    assert (folder / "sm_90.json").read_bytes() == content and len(list(folder.iterdir())) == 1


def test_a_malformed_user_table_is_named_by_tables_show(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_TABLES_DIR", str(tmp_path / "user"))
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "sm_90.json").write_bytes(b"{")
    code, output = _invoke(f"sqlite:///{tmp_path / 't.db'}", ["tables", "show", "--arch", "sm_90"])
    _assert_clean_error(code, output, "not valid JSON")
    assert str(tmp_path / "user" / "sm_90.json") in output


def _corrupt_file(tmp_path: Path) -> str:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not an SQLite database" * 100)
    return f"sqlite:///{path}"


def _unknown_revision(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'future.db'}"
    engine = open_database(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE tuner_alembic_version SET version_num = '9999_from_the_future'"))
    engine.dispose()  # the last connection closed: the write-ahead log is folded into the file, which stays so
    return url


DATABASE_CASES = [
    ("corrupt sqlite file", _corrupt_file, "file is not a database"),
    ("unknown alembic revision", _unknown_revision, "9999_from_the_future"),
    ("bad url", lambda tmp_path: "nonsense://x", "cannot open database"),
    ("sqlite in a missing folder", lambda tmp_path: f"sqlite:///{tmp_path}/missing/dir/t.db", "unable to open"),
    ("refused postgresql port", lambda tmp_path: "postgresql+psycopg://u:p@127.0.0.1:1/x",
     "cannot reach the database postgresql+psycopg://u:***@127.0.0.1:1/x"),
]
DATABASE_COMMANDS = [["sweep", "list"], ["sweep", "status", "1"], ["sweep", "cancel", "1"], ["train", "list"],
                     ["train", "show", "1"], ["export", "--arch", "sm_90"], ["replay", "--sweep", "1"],
                     ["sweep", "queue", "{good}"], ["serve", "--drain"]]


@pytest.mark.parametrize("make_url, reason", [c[1:] for c in DATABASE_CASES], ids=[c[0] for c in DATABASE_CASES])
def test_an_unusable_database_exits_2_for_every_command(tmp_path, monkeypatch, make_url, reason):
    monkeypatch.setenv("TUNER_DB_RETRY_S", "0")  # a refused server is reported, not waited for
    url = make_url(tmp_path)
    files = {p: p.read_bytes() for p in tmp_path.glob("*.db")}
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    for args in DATABASE_COMMANDS:
        code, output = _invoke(url, [a.replace("{good}", str(good)) for a in args])
        _assert_clean_error(code, output, reason)
    assert {p: p.read_bytes() for p in tmp_path.glob("*.db")} == files


def test_a_corrupt_spec_column_leaves_list_working_and_status_names_the_sweep(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    with session_scope(open_database(db)) as session:
        session.add(Sweep(kernel="rmsnorm_fwd", arch="auto", spec={}, status="queued"))
    with open_database(db).begin() as connection:
        connection.execute(text("UPDATE tuner_sweeps SET spec = '{not json'"))
    code, output = _invoke(db, ["sweep", "list"])
    assert code == 0 and "rmsnorm_fwd" in output
    code, output = _invoke(db, ["sweep", "status", "1"])
    _assert_clean_error(code, output, "sweep 1")
    with open_database(db).begin() as connection:
        connection.execute(text("""UPDATE tuner_sweeps SET spec = '{"kernel": 5, "shapes": []}'"""))
    code, output = _invoke(db, ["sweep", "status", "1"])
    _assert_clean_error(code, output, "sweep 1: its stored spec is corrupt")


def test_the_fuzz_covers_every_command():
    """Each command of the CLI appears in at least one case above (a new command needs its cases)."""
    import typer.main

    def commands(group, prefix=()):
        for name, command in typer.main.get_command(group).commands.items():
            if hasattr(command, "commands"):
                yield from ((prefix + (name, sub)) for sub in command.commands)
            else:
                yield prefix + (name,)

    covered = {tuple(args[:2]) for _, args, _ in ARGUMENT_CASES} | {tuple(args[:1]) for _, args, _ in ARGUMENT_CASES}
    covered |= {tuple(args[:2]) for args in DATABASE_COMMANDS} | {("sweep", "queue"), ("sweep", "run"),
                                                                  ("tables", "show")}
    planner = {("plan",), ("plan", "validate"), ("profile", "layers"), ("profile", "alltoall"),
               ("profile", "export")}  # tests/test_plan_cli.py and the planner's own tests cover these
    missing = sorted(set(commands(app)) - covered - planner)
    assert missing == [], f"commands without a malformed-input case: {missing}"
