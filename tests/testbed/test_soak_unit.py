"""The soak's memory bookkeeping (testbed.bench.soak.growth) on made-up samples."""

from __future__ import annotations

from testbed.bench.soak import growth


def _samples(pid, values, every=10.0):
    return [
        {"t_s": i * every, "host": "h", "pid": pid, "process": "router", "rss": v}
        for i, v in enumerate(values)
    ]


def test_growth_counts_only_after_warm_up_and_skips_short_lived_processes():
    flat = _samples(1, [50, 90, 100, 100, 101, 100, 100, 102, 101])  # warm-up jump, then flat
    leak = _samples(2, [100, 100, 100, 110, 120, 130, 140, 150, 160])
    brief = _samples(3, [100, 200])  # restarted mid-run: too few samples to judge
    rows = {r["pid"]: r for r in growth(flat + leak + brief, warmup_s=20, tail=3)}
    assert set(rows) == {1, 2}
    assert abs(rows[1]["growth"]) <= 0.01
    assert rows[2]["growth"] > 0.3
