"""Training runs and layer profiles end to end on the CPU: the ``tuner`` CLI in this process, a local Ray of
2 CPUs (one session for the module, with a worker hook that can make the last stage run out of memory),
gloo ranks in Ray actors, the tiny preset, and the SQL database."""

from __future__ import annotations

import json

import pytest
import ray
from sqlalchemy import select

from db import open_database, session_scope
from db.planning import LayerProfile
from db.training import TrainRun
from v4.config import layer_kind, load_preset
from v4.recompute import SELECTIVE_MODULES
from workers import train_runner
from tests.cli_run import invoke_tuner as tuner

RUN = ["--model", "tiny", "--layout", "Et*2|t*2mL", "--gbs", "4", "--seq", "64", "--world", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "tests.train_faults.oom_on_last_stage"})
    yield
    ray.shutdown()


def rows(db: str) -> list[TrainRun]:
    with session_scope(open_database(db)) as session:
        return list(session.scalars(select(TrainRun).order_by(TrainRun.id)).all())


def test_run_through_ray_stores_a_falling_loss_and_memory_per_stage(local_ray, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, out = tuner(db, "train", "run", *RUN, "--iters", "6", "--lr", "1e-2")
    assert code == 0, out
    [row] = rows(db)
    assert row.status == "ok" and row.error is None and (row.pp, row.dp, row.microbatches) == (2, 1, 4)
    assert len(row.losses) == len(row.step_times_s) == 6 and row.losses[-1] < row.losses[0] - 0.2, row.losses
    assert row.step_p20_s <= row.step_median_s <= row.step_p80_s
    assert row.step_median_s == pytest.approx(sorted(row.step_times_s[1:])[2])  # the warm-up iteration left out
    assert row.tokens_per_s_per_gpu > 0 and row.model_tflops_per_gpu > 0
    assert [m["stages"] for m in row.stage_memory] == [[0], [1]]
    assert all(m["saved_activation_peak_bytes"] > 0 and m["params"] > 0 for m in row.stage_memory)
    assert row.layout == "Et*2|t*2mL" and row.recompute == "none" and row.model["name"] == "tiny"
    assert row.versions["torch"] and row.host and row.kernel_tables == {"kernels": "eager", "arch": None, "sha256": None}
    code, out = tuner(db, "train", "show", str(row.id))
    assert code == 0 and "loss " in out and f"{row.losses[-1]:.3f}" in out and "memory per pipeline rank" in out


@pytest.mark.parametrize("args, message", [
    (["--world", "3"], "world: 3 is not a multiple of pp=2"),
    (["--gbs", "1"], "world: 1 microbatches per replica is fewer than pp=2"),
    (["--recompute", "0-9"], "layer id(s) [5, 6, 7, 8, 9] out of range"),
    (["--iters", "0"], "iters: Input should be greater than 0"),
    (["--model", "v9"], "unknown preset 'v9'"),
])
def test_an_impossible_run_exits_2_naming_the_field_and_writes_nothing(tmp_path, args, message) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    base = ["--model", "tiny", "--gbs", "4", "--seq", "64", "--iters", "2", "--world", "2", "--device", "cpu"]
    for command in ("run", "queue"):
        code, out = tuner(db, "train", command, *base, "--layout", "Et*2|t*2mL", *args)
        assert code == 2 and message in out, out
    assert rows(db) == []


def test_serve_drain_picks_up_a_queued_run(local_ray, tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, out = tuner(db, "train", "queue", *RUN, "--iters", "2", "--recompute", "0-4")
    assert code == 0 and out.strip() == "1"
    assert rows(db)[0].status == "queued"
    code, out = tuner(db, "serve", "--drain")
    assert code == 0 and "training run 1: ok" in out and "drained after 1 job(s)" in out, out
    [row] = rows(db)
    assert row.status == "ok" and row.owner and row.recompute == "0-4" and len(row.losses) == 2


def test_an_out_of_memory_stage_is_stored_as_oom(local_ray, tmp_path, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    monkeypatch.setenv("TUNER_TEST_OOM_LAST_STAGE", "1")  # forwarded to the ranks, see tests/train_faults.py
    monkeypatch.setattr(train_runner, "GRACE_S", 1.0)  # rank 0 waits on its dead peer: stop it soon
    code, out = tuner(db, "train", "run", *RUN, "--iters", "2")
    assert code == 1, out
    [row] = rows(db)
    assert (row.status, row.oom_stage) == ("oom", 1) and "out of memory" in row.error
    assert "OOM stage" in out


def test_profile_layers_writes_a_trace_per_kind(tmp_path) -> None:
    db, traces = f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "traces"
    code, out = tuner(db, "profile", "layers", "--model", "tiny", "--device", "cpu", "--seq", "16", "--warmup", "0",
                      "--reps", "1", "--trace", str(traces))
    assert code == 0, out
    config = load_preset("tiny")
    kinds = {layer_kind(config, i) for i in config.layer_ids} | {"embedding", "head"}
    names = {k.replace("/", "-") for k in kinds}
    assert {p.name for p in traces.iterdir()} == {f"{n}.{ext}" for n in names for ext in ("json", "txt")}
    table = (traces / "csa-learned.txt").read_text()
    assert "aten::mm" in table or "aten::matmul" in table or "aten::bmm" in table  # the layer's GEMMs are in it
    assert json.loads((traces / "head.json").read_text())["traceEvents"]


def test_profile_layers_refuses_a_trace_folder_it_cannot_create(tmp_path) -> None:
    db, blocker = f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "a-file"
    blocker.write_text("")
    code, out = tuner(db, "profile", "layers", "--model", "tiny", "--device", "cpu", "--seq", "16", "--warmup", "0",
                      "--reps", "1", "--trace", str(blocker / "traces"))
    assert code == 2 and "trace: cannot create the folder" in out and "Traceback" not in out
    with session_scope(open_database(db)) as session:
        assert session.scalars(select(LayerProfile)).all() == []


def test_profile_layers_stores_one_row_per_kind(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, out = tuner(db, "profile", "layers", "--model", "tiny", "--device", "cpu", "--seq", "32", "--ep", "2",
                      "--warmup", "0", "--reps", "1")
    assert code == 0, out
    config = load_preset("tiny")
    kinds = {layer_kind(config, i) for i in config.layer_ids} | {"embedding", "head"}
    with session_scope(open_database(db)) as session:
        profiles = {p.layer_kind: p for p in session.scalars(select(LayerProfile)).all()}
    assert set(profiles) == kinds
    for kind, p in profiles.items():
        assert (p.gpu_kind, p.model, p.seq, p.mbs, p.ep) == ("cpu", "tiny", 32, 1, 2)
        assert p.forward_ms > 0 and p.backward_ms > 0 and p.recompute_backward_ms > 0 and p.params > 0
        assert p.optimizer_ms_per_param > 0
        # the embedding saves only its token ids, which the checkpoint keeps too
        assert p.recompute_kept_bytes < p.activation_bytes or kind == "embedding"
        if kind in ("embedding", "head"):
            assert p.selective_kept_bytes is None
        else:  # each selective module alone keeps less than the plain layer, more than its full recompute
            assert set(p.selective_kept_bytes) == set(SELECTIVE_MODULES)
            assert all(p.recompute_kept_bytes < b < p.activation_bytes for b in p.selective_kept_bytes.values())
    streams = 32 * 4 * config.hidden * 2
    assert profiles["window/hash"].p2p_bytes == streams and profiles["head"].p2p_bytes == 0
    layer = profiles["csa/learned"]
    assert layer.expert_params == 4 * 3 * config.expert_ffn * config.hidden  # 8 experts / ep 2, w13 and w2


@pytest.mark.parametrize("layout, stages", [("Et*43m|L", 2), ("Et*20|t*23|m|L", 4), ("Et*3|(tt|)*20,m|L", 23)])
def test_a_layout_without_pp_runs_one_stage_per_rank(tmp_path, layout: str, stages: int) -> None:
    """Without --pp the layout's own stage count is the pipeline size, whatever virtual stage the MTP layer is in."""
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    args = ["--model", "v4-flash", "--layout", layout, "--gbs", str(2 * stages), "--seq", "4096", "--iters", "2",
            "--world", str(stages), "--device", "cpu"]
    code, out = tuner(db, "train", "queue", *args)
    assert code == 0, out
    code, out = tuner(db, "train", "queue", *args, "--pp", str(stages))
    assert code == 0, out
    assert [(row.request["pp"], row.request["layout"]) for row in rows(db)] == [(stages, layout)] * 2


def test_a_run_with_cuda_graphs_is_queued_for_a_gpu(tmp_path) -> None:
    """Graphs run only on a GPU: "auto" is checked as a GPU run, and an explicit CPU device is refused by name."""
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    args = ["--model", "tiny", "--gbs", "2", "--seq", "64", "--iters", "2", "--kernels", "triton", "--cuda-graphs"]
    assert tuner(db, "train", "queue", *args) == (0, "1\n")
    assert rows(db)[0].request["cuda_graphs"] is True and rows(db)[0].device == "auto"
    code, out = tuner(db, "train", "queue", *args, "--device", "cpu")
    assert code == 2 and "cuda_graphs needs device cuda (got cpu)" in out, out
