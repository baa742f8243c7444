"""Which stored verdicts of a config another sweep may reuse instead of measuring it again."""

from __future__ import annotations

from db import Sweep, Trial, open_database, session_scope
from tuner.sweep.runner import reusable_trial

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.00 GiB"


def test_only_times_and_real_compiler_refusals_are_reused(db_url):
    verdicts = {  # identity: the trials stored for it, oldest first
        "timed": [("ok", None)],
        "refused": [("compile_error", "CompilationError: at 12:4: out of resources")],
        "gpu-was-full": [("compile_error", OOM)],
        "wrong": [("wrong", "output 1: 1 elements out of tolerance")],
        "crashed": [("crash", "SIGSEGV")],
        "timed-out": [("timeout", "no answer within 60 s")],
        "pruned": [("pruned", "constraint violated")],
        "full-then-timed": [("compile_error", OOM), ("ok", None)],
    }
    engine = open_database(db_url)
    with session_scope(engine) as session:
        sweep = Sweep(kernel="fault_probe", arch="interp", spec={}, status="done")
        session.add(sweep)
        session.flush()
        for identity, trials in verdicts.items():
            for status, error in trials:
                session.add(Trial(sweep_id=sweep.id, kernel="fault_probe", shape_key="n=1", arch="interp",
                                  config={}, identity=identity, status=status, error=error,
                                  median_ms=1.0 if status == "ok" else None))
    with session_scope(engine) as session:
        reused = {identity: getattr(reusable_trial(session, identity), "status", None) for identity in verdicts}
    assert reused == {"timed": "ok", "refused": "compile_error", "gpu-was-full": None, "wrong": None,
                      "crashed": None, "timed-out": None, "pruned": None, "full-then-timed": "ok"}
