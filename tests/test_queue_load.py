"""The queue under load (``bench.service_load``, small): concurrent clients and two servers on PostgreSQL,
every sweep done once, no config measured twice; and the queue's statements use their indexes."""

from __future__ import annotations

import argparse

import pytest
from sqlalchemy import text

from bench import service_load
from db import open_database


def test_concurrent_clients_and_two_servers_finish_every_sweep_once(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("the fleet's queue is PostgreSQL's (TUNER_TEST_POSTGRES_URL)")
    parser = argparse.ArgumentParser()
    service_load.add_arguments(parser)
    base = db_url.rsplit("/", 1)[0] + "/postgres"
    figures = service_load.run(parser.parse_args(["--db", base, "--sweeps", "12", "--configs", "2",
                                                  "--clients", "4", "--servers", "2", "--query-reps", "20"]))
    assert figures["sweeps_done"] == 12 and figures["sweep_statuses"] == {"done": 12}
    assert figures["trials"] == 24 and figures["duplicate_trials"] == 0
    assert figures["sweeps_by_both"] == 0 and figures["sweeps_reported_twice"] == 0
    assert sum(figures["sweeps_per_server"]) == 12
    assert figures["trials_per_s"] > 0


@pytest.mark.parametrize("statement,index", [
    ("SELECT id FROM tuner_sweeps WHERE status = 'queued' OR (status = 'running' AND heartbeat_at < '2026-01-01')",
     "ix_tuner_sweeps_status"),
    ("SELECT id FROM tuner_trials WHERE sweep_id = 1 AND identity = 'x'", "ix_tuner_trials_sweep_identity"),
    ("SELECT id FROM tuner_trials WHERE sweep_id = 1 AND shape_key = 'n=1'", "ix_tuner_trials_sweep_shape"),
])
def test_queue_and_runner_lookups_use_an_index(tmp_path, statement, index):
    engine = open_database(f"sqlite:///{tmp_path / 'tuner.db'}")
    with engine.connect() as conn:
        plan = " ".join(str(row[-1]) for row in conn.execute(text(f"EXPLAIN QUERY PLAN {statement}")))
    assert index in plan, plan
