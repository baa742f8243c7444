"""``tuner plan`` end to end on a temporary database holding synthetic V4-Flash profiles stored through
``store_profiles``: the chosen-plan block and the ranking at 80 columns, JSON, the HTML report, no-fit
and bad-argument exits, staleness, the packaged profiles on an empty database, borrowed profiles,
and node sweeps. (How long planning takes is bench/plan_time.py's claim, not a test's.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from db import open_database, session_scope
from db.planning import StoredPlan
from tuner.cli import display
from tuner.cli.main import app
from tuner.plan import packaged
from tuner.plan.hardware import GPUS
from tuner.plan.packaged import packaged_kinds
from tuner.plan.report import compact_layout
from v4.layout import parse_layout
from tuner.plan.profiles import load_costs, store_alltoall, store_profiles
from tuner.plan.request import current_tables_key
from workers.alltoall_cost import AlltoallCost, AlltoallShape
from tuner.train.profile_layers import LayerCost

MiB, GB = 1 << 20, 10**9
FLASH = ["--model", "v4-flash", "--gpus-per-node", "8", "--gpu", "h200", "--gbs", "256", "--seq", "4096"]


def flash_profiles(scale: float = 1.0) -> list[LayerCost]:
    """V4-Flash-like costs per microbatch on one H200 at seq 4096, mbs 1, ep 8 (32 local experts)."""
    experts = 32 * 3 * 4096 * 2048

    def piece(kind: str, forward: float, act: int, kept: int, params: int, moe: bool, p2p: int) -> LayerCost:
        f = forward * scale
        return LayerCost(layer_kind=kind, forward_ms=f, backward_ms=2 * f, recompute_backward_ms=3 * f,
                         activation_bytes=act, recompute_kept_bytes=kept, params=params + moe * experts,
                         expert_params=moe * experts, optimizer_ms_per_param=8e-9, p2p_bytes=p2p)

    def layer(kind: str, forward: float, act_gb: float) -> LayerCost:
        return piece(kind, forward, int(act_gb * GB), 128 * MiB, 130_000_000, True, 128 * MiB)

    return [layer("window/hash", 4.5, 2.6), layer("csa/hash", 6.0, 3.2), layer("hca/learned", 5.0, 2.8),
            layer("csa/learned", 6.0, 3.2), layer("mtp", 6.5, 3.5),
            piece("embedding", 0.3, 128 * MiB, 128 * MiB, 530_000_000, False, 128 * MiB),
            piece("head", 8.0, int(4.2 * GB), 256 * MiB, 530_000_000, False, 0)]


def store(url: str, kinds: list[str] | None = None, tables: str = "eager", scale: float = 1.0, ep: int = 8) -> None:
    costs = [c for c in flash_profiles(scale) if kinds is None or c.layer_kind in kinds]
    store_profiles(open_database(url), costs, gpu_kind="NVIDIA H200", gpu_memory_bytes=None, model="v4-flash",
                   seq=4096, mbs=1, ep=ep, kernel_tables=tables)


def store_a2a(url: str, dispatch: float, combine: float, ep: int = 8) -> None:
    """What ``tuner profile alltoall`` stores for V4-Flash at seq 4096, mbs 1."""
    shape = AlltoallShape(4096 * 6, 4096, ep)
    store_alltoall(open_database(url), AlltoallCost(shape, dispatch, combine, 100), gpu_kind="NVIDIA H200",
                   model="v4-flash", seq=4096, mbs=1, ep=ep, rows_per_rank=shape.rows, hidden=shape.hidden,
                   bytes_per_rank=shape.bytes_per_rank)


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    store(url)
    return url


def plan(db: str, *args: str, code: int = 0):
    result = CliRunner().invoke(app, ["--db", db, "plan", *args])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def test_plan_table_and_stored_row(db: str) -> None:
    out = plan(db, *FLASH, "--nodes", "8", "--pp", "8", "--vpp", "1").stdout
    assert "chosen plan" in out and "memory per stage" in out and "proven optimal" in out
    layout = re.search(r"--pipeline-model-parallel-layout '([^']+)'", out).group(1)
    parse_layout(layout, 43, 8, 1)
    assert "stored as plan 1" in out
    with session_scope(open_database(db)) as session:
        row = session.scalars(select(StoredPlan)).one()
        assert layout == compact_layout(row.plans[0]["layout"]) and row.step_ms > 0
        assert {r["layer_kind"] for r in row.profile_rows} == {"window/hash", "csa/hash", "hca/learned", "csa/learned",
                                                               "mtp", "embedding", "head"}


def test_json_and_report(db: str, tmp_path: Path) -> None:
    report = tmp_path / "plan.html"
    data = json.loads(plan(db, *FLASH, "--nodes", "8", "--json", "--report", str(report), "--top", "3").stdout)
    assert len(data["plans"]) == 3 and data["label"] is None and data["gpu"] == "h200"
    steps = [p["step_ms"] for p in data["plans"]]
    assert steps == sorted(steps) and data["lower_bound_ms"] <= steps[0] and data["splits_simulated"] >= 3
    for p in data["plans"]:
        layout = parse_layout(p["layout"], 43, p["pp"], 1)
        assert layout.vpp == p["vpp"] and len(p["stages"]) == p["pp"]
        assert p["stages"][0]["in_flight"] >= p["stages"][-1]["in_flight"] >= 1
        assert all(s["headroom_bytes"] >= 0 for s in p["stages"])
        assert set(p["recompute_layer_ids"]) <= set(range(44))
        assert p["tokens_per_s_per_gpu"] == pytest.approx(256 * 4096 / (p["step_ms"] / 1e3) / 64)
        assert p["tflops_per_gpu"] == pytest.approx(p["tokens_per_s_per_gpu"] * data["flops_per_token"] / 1e12)
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    assert html.count('class="gantt-row"') == data["plans"][0]["pp"]
    assert html.count('class="memory-bar"') == data["plans"][0]["pp"]
    assert data["plans"][0]["layout"] in html


def test_no_fit_exits_2_with_the_overflow_and_advice(db: str) -> None:
    err = plan(db, *FLASH, "--nodes", "4", code=2).stderr
    assert "no plan fits" in err and re.search(r"stage \d+ still overflows by [\d.]+ GiB", err)
    assert "more nodes" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "0"], "--nodes: counts must be >= 1"),
    (["--nodes", "8", "--gpu", "tpu"], "--gpu: unknown GPU kind 'tpu'"),
    (["--nodes", "8", "--pp", "3"], "--pp: 3 does not divide the 64 GPUs"),
    (["--nodes", "8", "--vpp", "x"], "--vpp: must be auto or an integer >= 1"),
    (["--nodes", "8", "--pp", "4", "--vpp", "30"], "--vpp: pp*vpp = 120 stages exceed"),
    (["--nodes", "8", "--gbs", "100"], "--gbs: no pipeline size works"),
    (["--nodes", "8", "--ep", "3"], "--ep: no pipeline size works"),
    (["--nodes", "8", "--scale-time", "0.5"], "--scale-time: only applies with profiles_from"),
    (["--nodes", "8", "--model", "v9"], "--model: unknown preset 'v9'"),
    (["--gbs", "256"], "--nodes: is required"),
])
def test_bad_arguments_exit_2_naming_the_field(db: str, args: list[str], message: str) -> None:
    base = [a for a in FLASH]
    for flag, value in zip(args[::2], args[1::2]):
        if flag in base:
            base[base.index(flag) + 1] = value
        else:
            base += [flag, value]
    err = plan(db, *base, code=2).stderr
    assert message in " ".join(err.split()), err


def test_stale_plan_after_new_profiles_or_tables(db_url: str) -> None:
    """On SQLite, and on PostgreSQL with ``--postgres-url``: plans are stored and compared there."""
    db = db_url
    store(db)
    args = [*FLASH, "--nodes", "8", "--pp", "8", "--vpp", "1"]
    assert "stale" not in plan(db, *args).stdout
    assert "stale" not in plan(db, *args).stdout  # same profiles: the stored plan is current
    store(db, ["csa/learned"], scale=1.1)  # re-measured: the row is replaced and newer
    out = plan(db, *args).stdout
    assert re.search(r"stored plan 2 \(.*\) is stale: newer profiles of csa/learned", " ".join(out.split()))
    # profiles measured with an older tuned table than the one the kernels read now
    old = "triton:sm_90:000000000000"
    store(db, tables=old)
    out = " ".join(plan(db, *args).stdout.split())
    assert f"it used kernel tables eager, the profiles now use {old}" in out
    assert f"profiles were measured with kernel tables {old}, the tuned table is now {current_tables_key(old)}" in out


def test_other_gpu_kind_refused_or_planned_from_profiles_with_a_label(db: str) -> None:
    err = plan(db, *FLASH, "--nodes", "4", "--gpu", "mi355x", code=2).stderr
    err = " ".join(err.split())
    assert "no measured profiles of v4-flash on 'AMD Instinct MI355X'" in err and "--profiles-from KIND" in err
    assert "(shipped for h100" in err and "the output is then marked borrowed" in err
    args = [*FLASH, "--nodes", "4", "--gpu", "mi355x", "--profiles-from", "h200", "--scale-time", "0.8", "--pp", "4",
            "--vpp", "1"]
    out = " ".join(plan(db, *args).stdout.split())
    label = "BORROWED: planned for mi355x from h200 profiles with times scaled by 0.8 and the mi355x datasheet memory"
    assert label in out and "chosen plan (BORROWED profiles)" in out
    data = json.loads(plan(db, *args, "--json").stdout)
    assert data["label"] == label and data["borrowed"] and data["capacity_bytes"] == 288 * GB
    h200 = load_costs(open_database(db), "NVIDIA H200", "v4-flash", 4096, 1, 8).costs
    scaled_step = data["plans"][0]["step_ms"]
    assert scaled_step < 1.0 * sum(l.forward_ms + l.backward_ms for l in h200.layers) * 32  # faster than unscaled


def test_an_unmeasured_alltoall_is_named_then_priced_once_measured(db: str) -> None:
    args = [*FLASH, "--nodes", "8", "--pp", "8", "--vpp", "1"]
    out = " ".join(plan(db, *args).stdout.split())
    assert ("warning: the EP all-to-all (ep=8) is not priced: it was not measured for v4-flash on 'NVIDIA H200' at "
            "seq 4096, mbs 1, ep 8") in out
    assert "`tuner profile alltoall --model v4-flash --seq 4096 --mbs 1 --ep 8`" in out
    unpriced = json.loads(plan(db, *args, "--json").stdout)
    assert len(unpriced["warnings"]) == 1 and "is not priced" in unpriced["warnings"][0]
    store_a2a(db, 0.6, 0.5)
    priced = json.loads(plan(db, *args, "--json").stdout)
    assert priced["warnings"] == [] and "alltoall" in {r["layer_kind"] for r in priced["profile_rows"]}
    assert any(re.search(r"stored plan 2 \(.*\) is stale: newer profiles of alltoall", n) for n in priced["stale"])
    assert priced["kernel_tables"] == "eager"
    # 44 MoE layers per microbatch, each 1.1 ms in forward and backward: the pipeline gets longer
    assert priced["plans"][0]["step_ms"] > unpriced["plans"][0]["step_ms"] + 44 * 2 * 1.1


def test_ep_across_nodes_without_the_alltoall_is_refused_naming_the_command(db: str) -> None:
    store(db, ep=16)
    err = " ".join(plan(db, *FLASH, "--nodes", "8", "--ep", "16", "--pp", "4", "--vpp", "1", code=2).stderr.split())
    assert err.startswith("error: --ep: the window/hash layer has no measured EP all-to-all"), err
    assert "price ep=16 across nodes of 8 GPUs: measure it with `tuner profile alltoall --ep 16`" in err


def test_an_empty_database_plans_from_the_packaged_profiles_and_says_so(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    shipped = packaged_kinds()
    assert "h100" in shipped
    for kind in shipped:
        data = json.loads(plan(empty, *FLASH, "--gpu", kind, "--nodes", "16", "--json", "--top", "1").stdout)
        assert data["profiles_source"].startswith(f"packaged {kind} profiles (profiles_data/{kind}.json): measured ")
        assert "by `tuner profile layers --model v4-flash --seq 4096 --mbs 1 --ep 8 --kernels triton`" in \
            data["profiles_source"]
        assert not data["borrowed"] and data["capacity_measured"] and data["plans"]
        assert "not priced" in data["warnings"][0]  # no all-to-all was measured on one GPU
    for kind in sorted(set(GPUS) - set(shipped) - {"cpu"}):
        err = " ".join(plan(empty, *FLASH, "--gpu", kind, "--nodes", "16", code=2).stderr.split())
        assert f"no measured profiles of v4-flash on '{GPUS[kind].device_name}'" in err and "--profiles-from" in err
    out = " ".join(plan(empty, *FLASH, "--gpu", "mi355x", "--profiles-from", "h100", "--nodes", "4").stdout.split())
    assert "BORROWED: planned for mi355x from h100 profiles" in out and "profiles: packaged h100 profiles" in out


def test_export_writes_what_the_database_holds_reproducibly_and_the_planner_reads_it(
        db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "shipped"
    printed = CliRunner().invoke(app, ["--db", db, "profile", "export", "--gpu", "h200", "--out", str(out)])
    assert printed.exit_code == 0, printed.stdout
    assert "v4-flash seq 4096 mbs 1 ep 8: 7 layer kinds, eager" in printed.stdout and "not measured" in printed.stdout
    first = (out / "h200.json").read_bytes()
    assert CliRunner().invoke(app, ["--db", db, "profile", "export", "--gpu", "h200", "--out", str(out)]).exit_code == 0
    assert (out / "h200.json").read_bytes() == first  # the same database, the same bytes
    entry = json.loads(first)["profiles"][0]
    assert {"device", "toolchain", "kernel_tables", "measured_at", "command", "gpu_memory_bytes"} <= set(
        entry["provenance"])
    monkeypatch.setattr(packaged, "PACKAGED_PROFILES", out)
    empty = open_database(f"sqlite:///{tmp_path / 'empty.db'}")
    shipped = load_costs(empty, "NVIDIA H200", "v4-flash", 4096, 1, 8, packaged="h200")
    stored = load_costs(open_database(db), "NVIDIA H200", "v4-flash", 4096, 1, 8, packaged="h200")
    assert shipped.costs == stored.costs and stored.source == "database"
    assert shipped.source.startswith("packaged h200 profiles")
    missing = CliRunner().invoke(app, ["--db", str(empty.url), "profile", "export", "--gpu", "h100", "--out",
                                       str(out)])
    assert missing.exit_code == 2 and "no layer profiles of 'NVIDIA H100 80GB HBM3'" in missing.stderr


def test_node_sweep_one_row_per_count_and_the_smallest_that_fits(db: str) -> None:
    args = [*FLASH, "--pp", "auto", "--top", "1"]
    data = json.loads(plan(db, *args, "--nodes", "2,4,8", "--json").stdout)
    rows = {row["nodes"]: row for row in data["rows"]}
    assert sorted(rows) == [2, 4, 8] and data["smallest_fitting_nodes"] == 8
    assert not rows[4]["fits"] and rows[4]["why"].startswith("nothing fits: at best pp")
    assert rows[8]["fits"] and rows[8]["plan"]["step_ms"] > 0 and rows[8]["peak_bytes"] <= 141 * GB
    out = " ".join(plan(db, *args, "--nodes", "4-8").stdout.split())
    assert "smallest node count that fits: 6" in out and "planned 5 node counts in" in out
    fixed = json.loads(plan(db, *FLASH, "--pp", "8", "--vpp", "1", "--top", "1", "--nodes", "3,8", "--json").stdout)
    assert fixed["rows"][0]["why"] == "--ep: pp=8 leaves dp=3 data-parallel ranks, which ep=8 does not divide"
    assert "--nodes:" in plan(db, *args, "--nodes", "8-4", code=2).stderr
    assert "--report:" in plan(db, *args, "--nodes", "4,8", "--report", "x.html", code=2).stderr


def test_output_fits_80_columns_and_the_block_holds_the_whole_layout(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display.console, "width", 80)
    for nodes in ("8", "4,8,16"):
        out = plan(db, *FLASH, "--nodes", nodes).stdout
        assert max(map(len, out.splitlines())) <= 80, out
    out = plan(db, *FLASH, "--nodes", "8").stdout
    data = json.loads(plan(db, *FLASH, "--nodes", "8", "--json").stdout)
    short = compact_layout(data["plans"][0]["layout"])
    assert re.search(rf"^layout +{re.escape(short)} *$", out, re.M), out
    assert parse_layout(short, 43, data["plans"][0]["pp"]) == parse_layout(data["plans"][0]["layout"], 43,
                                                                            data["plans"][0]["pp"])


def test_a_request_is_resolved_once(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One plan, or a sweep of node counts, loads the preset and the profiles once: the search, the report and
    the staleness check read the one resolved request."""
    calls = {"preset": 0, "costs": 0}

    def counted(name: str, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    import tuner.plan.profiles as profiles_module
    import tuner.plan.request as request_module

    monkeypatch.setattr(request_module, "load_preset", counted("preset", request_module.load_preset))
    monkeypatch.setattr(profiles_module, "load_preset", counted("preset", profiles_module.load_preset))
    monkeypatch.setattr(request_module, "load_costs", counted("costs", request_module.load_costs))
    plan(db, *FLASH, "--nodes", "8", "--report", "/dev/null")
    assert calls == {"preset": 1, "costs": 1}
    plan(db, *FLASH, "--nodes", "4,8,16")
    assert calls == {"preset": 2, "costs": 2}
