"""``tuner profile alltoall`` end to end on the CPU (a local Ray of 2 CPUs, 2 gloo ranks in Ray actors, the tiny
preset, a SQLite file): the stored row and the planner's costs it completes, the arguments it refuses, and the
volume and the summary by hand."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from db import open_database, session_scope
from db.planning import AlltoallProfile
from tuner.plan.profiles import load_costs, store_profiles
from workers.alltoall_cost import AlltoallShape, summarize
from tuner.train.profile_layers import LayerCost
from v4.config import layer_kind, load_preset
from tests.cli_run import invoke_tuner as tuner

A2A = ["profile", "alltoall", "--model", "tiny", "--seq", "64", "--device", "cpu"]


def stored(db: str) -> list[AlltoallProfile]:
    with session_scope(open_database(db)) as session:
        return list(session.scalars(select(AlltoallProfile)).all())


def tiny_layer_profiles(db: str) -> None:
    """Synthetic layer rows of tiny on the CPU at seq 64, mbs 1, ep 2: what the all-to-all completes."""
    config = load_preset("tiny")
    kinds = {layer_kind(config, i) for i in config.layer_ids} | {"embedding", "head"}
    store_profiles(open_database(db), [LayerCost(
        layer_kind=k, forward_ms=1.0, backward_ms=2.0, recompute_backward_ms=3.0, activation_bytes=1000,
        recompute_kept_bytes=100, params=1000, expert_params=0, optimizer_ms_per_param=1e-6, p2p_bytes=100)
        for k in kinds], gpu_kind="cpu", gpu_memory_bytes=None, model="tiny", seq=64, mbs=1, ep=2,
        kernel_tables="eager")


def test_measured_on_two_gloo_ranks_stored_and_given_to_the_moe_layers(local_ray, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    tiny_layer_profiles(db)
    code, out = tuner(db, *A2A, "--ep", "2", "--warmup", "1", "--reps", "5")
    assert code == 0, out
    assert "dispatch" in out and "combine" in out and "GB/s" in out and "median of 5 rounds" in out
    [row] = stored(db)
    assert (row.gpu_kind, row.model, row.seq, row.mbs, row.ep, row.reps) == ("cpu", "tiny", 64, 1, 2, 5)
    assert (row.rows_per_rank, row.hidden) == (64 * 2, 64)  # seq x experts_per_token rows of hidden bf16
    assert row.bytes_per_rank == 64 * 2 * 64 * 2 // 2  # half of them go to the other rank
    assert row.dispatch_ms > 0 and row.combine_ms > 0
    assert row.alltoall_ms == pytest.approx(row.dispatch_ms + row.combine_ms)
    assert row.gbps == pytest.approx(2 * row.bytes_per_rank / (row.alltoall_ms * 1e6))
    assert row.toolchain["torch"]
    loaded = load_costs(open_database(db), "cpu", "tiny", 64, 1, 2, "eager")
    assert loaded.costs.alltoall_ms == (row.alltoall_ms,) * 5  # 4 decoder layers and the MTP layer
    assert {l.forward_ms for l in loaded.costs.layers} == {1.0}  # apart from, not inside, the layer times


def test_more_ranks_than_one_node_has_are_refused(local_ray, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, out = tuner(db, *A2A, "--ep", "4")
    assert code == 2 and "ep: 4 ranks need 4 CPUs on one node; the largest Ray node has 2" in " ".join(out.split())
    assert "Traceback" not in out and stored(db) == []


@pytest.mark.parametrize("args, message", [
    (["--ep", "1"], "ep: an all-to-all needs at least 2 expert-parallel ranks, got 1"),
    (["--ep", "3"], "ep: 3 does not divide the 8 experts of tiny"),
    (["--ep", "8"], "ep: 8 leaves 1 local experts, fewer than experts_per_token=2"),
    (["--ep", "2", "--model", "v9"], "model: unknown preset 'v9'"),
    (["--ep", "2", "--seq", "0"], "seq: must be >= 1, got 0"),
    (["--ep", "2", "--device", "tpu"], "device: must be auto, cpu or cuda, got 'tpu'"),
    (["--ep", "2", "--reps", "0"], "reps: must be >= 1, got 0"),
    (["--ep", "2", "--warmup", "-1"], "warmup: must be >= 0, got -1"),
])
def test_bad_arguments_exit_2_naming_the_field(tmp_path, args, message) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, out = tuner(db, *A2A, *args)
    assert code == 2 and message in " ".join(out.split()) and "Traceback" not in out, out
    assert stored(db) == []


def test_volume_and_summary_by_hand() -> None:
    shape = AlltoallShape(rows=10, hidden=4, ep=4)
    assert shape.splits == [3, 3, 2, 2] and shape.bytes_per_rank == 10 * 3 * 4 * 2 // 4
    per_rank = [{"dispatch": [1.0, 5.0, 2.0], "combine": [1.0, 1.0, 1.0]},
                {"dispatch": [3.0, 1.0, 1.0], "combine": [2.0, 0.5, 4.0]}]
    cost = summarize(shape, per_rank)  # per round the slower rank: dispatch 3, 5, 2; combine 2, 1, 4
    assert (cost.dispatch_ms, cost.combine_ms, cost.alltoall_ms, cost.reps) == (3.0, 2.0, 5.0, 3)
    assert cost.gbps == pytest.approx(2 * 60 / 5e6)
