"""Database layer on SQLite and, when ``--postgres-url`` is given, on PostgreSQL."""

from __future__ import annotations

import threading

from sqlalchemy import inspect, select

from db import Sweep, open_database, session_scope
from db.engine import VERSION_TABLE
from tuner.sweep import queue
from tuner.sweep.spec import parse_spec

SPEC = {"kernel": "fault_probe", "shapes": [{"n": 100}]}


def test_schema_is_created_and_upgrade_is_idempotent(db_url):
    engine = open_database(db_url)
    open_database(db_url)  # a second start upgrades nothing and fails on nothing
    tables = set(inspect(engine).get_table_names())
    assert {"tuner_sweeps", "tuner_trials", VERSION_TABLE} <= tables


def test_two_servers_never_claim_the_same_sweep(db_url):
    engine = open_database(db_url)
    ids = [queue.enqueue(engine, parse_spec(SPEC)) for _ in range(6)]
    claims: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def server(name: str) -> None:
        while (sweep_id := queue.claim_next(engine, name)) is not None:
            claims[name].append(sweep_id)

    threads = [threading.Thread(target=server, args=(n,)) for n in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [i for c in claims.values() for i in c]
    assert sorted(taken) == ids  # each sweep claimed exactly once


def test_stale_claim_is_taken_over_and_cancel_stops_heartbeat(db_url):
    engine = open_database(db_url)
    sweep_id = queue.enqueue(engine, parse_spec(SPEC))
    assert queue.try_claim(engine, sweep_id, "first")
    assert not queue.try_claim(engine, sweep_id, "second", lease_s=60)
    assert queue.try_claim(engine, sweep_id, "second", lease_s=0)  # first went silent
    assert not queue.heartbeat(engine, sweep_id, "first")
    assert queue.heartbeat(engine, sweep_id, "second")
    assert queue.cancel(engine, sweep_id) == "cancelled"
    assert not queue.heartbeat(engine, sweep_id, "second")
    with session_scope(engine) as session:
        assert session.scalars(select(Sweep.status)).one() == "cancelled"
