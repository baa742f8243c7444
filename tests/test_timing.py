"""``workers.timing.screen``: a sweep's timing of one config, cut short after its probe when the config is
already far over the shape's best. On the CPU it times by wall clock, as the interpreter's trials are timed."""

from __future__ import annotations

import time

from workers.timing import screen


def _sleeping(ms: float):
    calls = []

    def call() -> None:
        calls.append(1)
        time.sleep(ms / 1e3)

    return call, calls


def test_a_probe_over_the_cutoff_stops_the_timing_there():
    call, calls = _sleeping(2.0)
    timing, stopped = screen(call, 0.0, 200.0, on_gpu=False, probe_ms=10.0, stop_over_ms=0.5)
    assert stopped and timing.median_ms >= 2.0
    assert timing.reps == len(calls) - 1 < 20  # the probe's repetitions (after one warm call), not 200 ms of them


def test_a_probe_under_the_cutoff_runs_the_rest_and_keeps_the_probes_samples():
    call, calls = _sleeping(2.0)
    timing, stopped = screen(call, 0.0, 60.0, on_gpu=False, probe_ms=10.0, stop_over_ms=1000.0)
    assert not stopped
    probe_only, _ = screen(_sleeping(2.0)[0], 0.0, 60.0, on_gpu=False, probe_ms=10.0, stop_over_ms=0.5)
    assert timing.reps > probe_only.reps  # the probe's and the rest's samples together
    assert timing.reps == len(calls) - 2  # every call but the two warm ones


def test_without_a_cutoff_or_a_probe_shorter_than_the_timing_every_config_is_timed_whole():
    for probe_ms, stop_over_ms in ((10.0, None), (0.0, 0.5), (60.0, 0.5)):
        call, calls = _sleeping(2.0)
        timing, stopped = screen(call, 0.0, 60.0, on_gpu=False, probe_ms=probe_ms, stop_over_ms=stop_over_ms)
        assert not stopped and timing.reps == len(calls) - 1 > 10
