"""The link check's arithmetic on iperf3's JSON (no network: the intervals below stand
in for an iperf3 receiver's; the real check runs in test_network_netns.py)."""

from __future__ import annotations

import pytest

from topologies.check import steady_received_mbit


def interval(start: float, end: float, mbytes: float) -> dict:
    return {"sum": {"start": start, "end": end, "seconds": end - start, "bytes": mbytes * 1e6}}


def test_a_floods_rate_is_read_from_its_steady_seconds_at_the_receiver():
    # a 1 s one-way delay: the receiver's first second holds a fifth of the flow, its
    # last one the tail; the whole run's clock also ran two more control round trips
    end = {
        "sum_received": {"bits_per_second": 9.8e6},
        "receiver_intervals": [
            interval(0, 1, 0.3),
            interval(1, 2, 1.68),
            interval(2, 3, 1.66),
            interval(3, 3.5, 0.8),
        ],
    }
    mbit, steady = steady_received_mbit(end)
    assert steady and mbit == pytest.approx((1.68 + 1.66) * 8 / 2)


def test_without_steady_seconds_the_whole_runs_rate_is_used():
    two = [interval(0, 1, 1.0), interval(1, 2, 1.0)]
    for end in (
        {"sum_received": {"bits_per_second": 8e6}, "receiver_intervals": two},
        {"sum_received": {"bits_per_second": 8e6}},
    ):
        assert steady_received_mbit(end) == (8.0, False)
