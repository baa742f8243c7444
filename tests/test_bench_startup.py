"""``bench/startup.py``'s targets from a run's figures: met or missed on a GPU host, informative elsewhere."""

from __future__ import annotations

from bench.startup import targets


def test_the_ten_second_target_starting_and_joining_ray():
    own, joined = {"overhead_s": 20.19, "sweep_s": 5.28}, {"overhead_s": 9.5, "sweep_s": 3.03}
    rows = targets(own, joined, gpu=True)
    assert [r["status"] for r in rows] == ["missed", "met"]
    assert rows[0]["measured"] == "20.2 s around a 5.3 s sweep" and rows[1]["target"].endswith("joining a running Ray")
    assert [r["status"] for r in targets(own, None, gpu=False)] == ["not a GPU host"]
