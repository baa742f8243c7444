"""``tuner plan`` end to end on a temporary database holding synthetic V4-Flash profiles stored through
``store_profiles``: tables, JSON, the HTML report, no-fit and bad-argument exits, staleness, planning
from another GPU kind's profiles, and the time budget of a full auto pp/vpp request."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from db import open_database, session_scope
from db.planning import StoredPlan
from tuner.cli.main import app
from v4.layout import parse_layout
from tuner.plan.profiles import load_costs, store_alltoall, store_profiles
from tuner.plan.request import PlanRequest, current_tables_key, plan_request
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
    assert "chosen" in out and "memory per stage" in out and "proven optimal" in out
    layout = re.search(r"--pipeline-model-parallel-layout '([^']+)'", out).group(1)
    parse_layout(layout, 43, 8, 1)
    assert "stored as plan 1" in out
    with session_scope(open_database(db)) as session:
        row = session.scalars(select(StoredPlan)).one()
        assert row.plans[0]["layout"] == layout and row.step_ms > 0
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


def test_full_auto_request_is_fast(db: str) -> None:
    request = PlanRequest.parse(model="v4-flash", nodes=8, gpus_per_node=8, gpu="h200", gbs=256, seq=4096)
    start = time.perf_counter()
    outcome = plan_request(open_database(db), request)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"planning took {elapsed:.1f} s"
    pps = {p.model.pp for p in outcome.plans}
    assert pps <= {4, 8} and outcome.result.lower_bound_ms <= outcome.plans[0].step_ms


def test_no_fit_exits_2_with_the_overflow_and_advice(db: str) -> None:
    err = plan(db, *FLASH, "--nodes", "4", code=2).stderr
    assert "no plan fits" in err and re.search(r"stage \d+ still overflows by [\d.]+ GiB", err)
    assert "more nodes" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "0"], "--nodes: Input should be greater than 0"),
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
    assert "no" in err and "'AMD Instinct MI355X'" in err and "--profiles-from KIND --scale-time F" in " ".join(err.split())
    args = [*FLASH, "--nodes", "4", "--gpu", "mi355x", "--profiles-from", "h200", "--scale-time", "0.8", "--pp", "4",
            "--vpp", "1"]
    out = " ".join(plan(db, *args).stdout.split())
    label = "planned for mi355x from h200 profiles with times scaled by 0.8"
    assert out.count(label) >= 2  # the note and the table title
    data = json.loads(plan(db, *args, "--json").stdout)
    assert data["label"] == label and data["capacity_bytes"] == 288 * GB
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
