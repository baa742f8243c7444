"""Layer profiles in the database (SQLite, and PostgreSQL with ``--postgres-url``): the migration, newest
row wins, the model's layer ids mapped to kinds, what the loader derives, the EP all-to-all measured apart,
and clear errors."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import inspect

from db import open_database
from db.engine import VERSION_TABLE
from tuner.plan.profiles import (
    ProfileError, ProfilesMissing, expert_params, load_costs, model_layer_kinds, store_alltoall, store_profiles)
from workers.alltoall_cost import AlltoallCost, AlltoallShape
from tuner.train.profile_layers import LayerCost
from v4.config import load_preset

MiB = 1 << 20
KEY = dict(gpu_kind="NVIDIA H200", gpu_memory_bytes=150_000_000_000, model="v4-flash", seq=4096, mbs=1, ep=8)
FLASH_KINDS = ("window/hash", "csa/hash", "hca/learned", "csa/learned", "mtp", "embedding", "head")


def measured(kind: str, forward: float = 5.0, expert: int | None = None, p2p: int = 128 * MiB,
             optimizer: float | None = 1e-8) -> LayerCost:
    return LayerCost(layer_kind=kind, forward_ms=forward, backward_ms=2 * forward, recompute_backward_ms=2.9 * forward,
                     activation_bytes=3000 * MiB, recompute_kept_bytes=128 * MiB, params=900_000_000,
                     expert_params=expert, optimizer_ms_per_param=optimizer, p2p_bytes=p2p)


def alltoall(engine, dispatch: float, combine: float, ep: int = 8) -> int:
    shape = AlltoallShape(4096 * 6, 4096, ep)
    return store_alltoall(engine, AlltoallCost(shape, dispatch, combine, reps=50), gpu_kind="NVIDIA H200",
                          model="v4-flash", seq=4096, mbs=1, ep=ep, rows_per_rank=shape.rows, hidden=shape.hidden,
                          bytes_per_rank=shape.bytes_per_rank)


def test_schema_has_the_planner_tables(db_url: str) -> None:
    tables = set(inspect(open_database(db_url)).get_table_names())
    assert {"tuner_layer_profiles", "tuner_plans", VERSION_TABLE} <= tables


def test_newest_profile_wins_and_maps_every_layer(db_url: str) -> None:
    engine = open_database(db_url)
    first = store_profiles(engine, [measured(k) for k in FLASH_KINDS], kernel_tables="triton:sm_90:aaaaaaaaaaaa", **KEY)
    again = store_profiles(engine, [measured("csa/learned", forward=7.0)], kernel_tables="triton:sm_90:aaaaaaaaaaaa",
                           **KEY)
    assert again == [first[FLASH_KINDS.index("csa/learned")]]  # same key: the row is replaced, not added
    newer = store_profiles(engine, [measured("hca/learned", forward=9.0, p2p=200 * MiB)],
                           kernel_tables="triton:sm_90:bbbbbbbbbbbb", **KEY)
    loaded = load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)
    config = load_preset("v4-flash")
    kinds = model_layer_kinds(config)
    assert len(loaded.costs.layers) == 44 and kinds[:4] == ["window/hash", "window/hash", "csa/hash", "hca/learned"]
    assert kinds[4] == "csa/learned" and kinds[42] == "csa/learned" and kinds[43] == "mtp"
    assert kinds.count("hca/learned") == 20 and kinds.count("csa/learned") == 20
    by_kind = {l.kind: l for l in loaded.costs.layers}
    assert by_kind["csa/learned"].forward_ms == 7.0 and by_kind["hca/learned"].forward_ms == 9.0
    assert by_kind["window/hash"].recompute_cost_ms == pytest.approx(0.9 * 5.0)  # backward with recompute - backward
    assert by_kind["mtp"].expert_param_count == expert_params(config, 8) == 32 * 3 * 4096 * 2048  # from the preset
    assert loaded.costs.p2p_bytes == 200 * MiB and loaded.costs.optimizer_ms_per_param == pytest.approx(1e-8)
    assert loaded.costs.extras.head_params == 900_000_000 and loaded.gpu_memory_bytes == 150_000_000_000
    rows = {r.layer_kind: r for r in loaded.rows}
    assert rows["hca/learned"].id == newer[0] and rows["hca/learned"].kernel_tables == "triton:sm_90:bbbbbbbbbbbb"
    assert loaded.kernel_tables == "triton:sm_90:aaaaaaaaaaaa+triton:sm_90:bbbbbbbbbbbb"


def test_costs_come_from_one_kernel_path_triton_first(db_url: str) -> None:
    engine = open_database(db_url)
    store_profiles(engine, [measured(k, forward=5.0) for k in FLASH_KINDS], kernel_tables="triton:sm_90:aaaaaaaaaaaa", **KEY)
    store_profiles(engine, [measured(k, forward=8.0) for k in FLASH_KINDS], kernel_tables="eager", **KEY)  # newer
    forward = lambda loaded: {l.forward_ms for l in loaded.costs.layers}  # noqa: E731
    assert forward(load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)) == {5.0}
    assert forward(load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8, "eager")) == {8.0}
    store_profiles(engine, [measured("mtp", forward=6.0)], kernel_tables="triton:sm_90:bbbbbbbbbbbb", **KEY)
    assert forward(load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8, "triton")) == {5.0, 6.0}
    with pytest.raises(ValueError, match="kernels"):
        load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8, "cuda")


def test_eager_rows_serve_when_triton_rows_do_not_cover_the_model(db_url: str) -> None:
    engine = open_database(db_url)
    store_profiles(engine, [measured(k, forward=8.0) for k in FLASH_KINDS], kernel_tables="eager", **KEY)
    store_profiles(engine, [measured("mtp", forward=5.0)], kernel_tables="triton:sm_90:aaaaaaaaaaaa", **KEY)
    assert {l.forward_ms for l in load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8).costs.layers} == {8.0}
    with pytest.raises(ProfilesMissing, match="triton kernels"):
        load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8, "triton")


def test_recorded_expert_params_are_kept(db_url: str) -> None:
    engine = open_database(db_url)
    store_profiles(engine, [measured(k, expert=0 if k in ("embedding", "head") else 800_000_000) for k in FLASH_KINDS],
                   kernel_tables="eager", **KEY)
    layers = load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8).costs.layers
    assert {l.expert_param_count for l in layers} == {800_000_000}


def test_the_alltoall_is_stored_apart_and_given_to_every_moe_layer(db_url: str) -> None:
    engine = open_database(db_url)
    store_profiles(engine, [measured(k) for k in FLASH_KINDS], kernel_tables="eager", **KEY)
    before = load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)
    assert before.costs.alltoall_ms == (None,) * 44 and not before.alltoall_measured
    first = alltoall(engine, 0.3, 0.2)
    alltoall(engine, 0.9, 0.9, ep=4)  # another key: not this plan's
    store_profiles(engine, [measured(k) for k in FLASH_KINDS], kernel_tables="eager", **KEY)  # re-profiled layers
    loaded = load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)
    assert loaded.costs.alltoall_ms == pytest.approx((0.5,) * 44)  # every decoder layer and the MTP layer
    assert {l.forward_ms for l in loaded.costs.layers} == {5.0}  # not folded into the layer times
    assert loaded.alltoall_measured and loaded.kernel_tables == "eager"
    [row] = [r for r in loaded.rows if r.layer_kind == "alltoall"]
    assert alltoall(engine, 0.4, 0.2) == row.id == first  # measured again: the row is replaced and newer
    again = load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)
    assert again.costs.alltoall_ms[0] == pytest.approx(0.6)
    assert [r.created_at for r in again.rows if r.layer_kind == "alltoall"][0] > row.created_at
    with pytest.raises(ProfileError, match=r"alltoall\.dispatch_ms"):
        alltoall(engine, float("nan"), 0.2)


def test_missing_kinds_and_bad_measurements(db_url: str) -> None:
    engine = open_database(db_url)
    store_profiles(engine, [measured(k) for k in FLASH_KINDS if k != "mtp"], kernel_tables="eager", **KEY)
    with pytest.raises(ProfilesMissing, match=r"no mtp profile of v4-flash on 'NVIDIA H200'.*NVIDIA H200"):
        load_costs(engine, "NVIDIA H200", "v4-flash", 4096, 1, 8)
    with pytest.raises(ProfilesMissing, match=r"no measured profiles of v4-flash .* seq 8192.* in the database$"):
        load_costs(engine, "NVIDIA H200", "v4-flash", 8192, 1, 8)
    with pytest.raises(ProfilesMissing, match=r"in the database or the packaged profiles \(shipped for h100"):
        load_costs(engine, "NVIDIA H200", "v4-flash", 8192, 1, 8, packaged="h200")
    # the database's rows win over the packaged ones, even incomplete: missing kinds are named, not filled in
    with pytest.raises(ProfilesMissing, match=r"no mtp profile of v4-flash on 'NVIDIA H100 80GB HBM3'"):
        store_profiles(engine, [measured(k) for k in FLASH_KINDS if k != "mtp"], kernel_tables="eager",
                       **{**KEY, "gpu_kind": "NVIDIA H100 80GB HBM3"})
        load_costs(engine, "NVIDIA H100 80GB HBM3", "v4-flash", 4096, 1, 8, packaged="h100")
    for bad, match in [(dataclasses.replace(measured("mtp"), layer_kind="moe"), "layer_kind must be one of"),
                       (dataclasses.replace(measured("mtp"), forward_ms=-1.0), r"mtp\.forward_ms"),
                       (dataclasses.replace(measured("mtp"), optimizer_ms_per_param=float("inf")),
                        r"mtp\.optimizer_ms_per_param")]:
        with pytest.raises(ProfileError, match=match):
            store_profiles(engine, [bad], kernel_tables="eager", **KEY)
    with pytest.raises(ProfileError, match="one measurement per layer kind"):
        store_profiles(engine, [measured("mtp"), measured("mtp")], kernel_tables="eager", **KEY)
