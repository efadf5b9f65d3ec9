"""The link check's arithmetic on iperf3's JSON (no network: the intervals below stand
in for an iperf3 receiver's, and a bare spec for a network; the real check runs in
test_network_netns.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from topologies.check import iperf_timeout_s, steady_received_mbit
from topologies.link import LinkSpec


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


def test_an_iperf_run_may_take_its_control_round_trips_on_a_dilated_line():
    def net(delay_ms: float) -> SimpleNamespace:  # only what the timeout reads
        return SimpleNamespace(spec=SimpleNamespace(wan=LinkSpec(delay_ms=delay_ms)))

    # hetero at k = 590: 2.95 s one way; the flat 33 s of a 3 s check had timed out
    assert iperf_timeout_s(net(2950), 3.0) > 3.0 + 30 + 10 * 5.9
    assert iperf_timeout_s(net(10), 3.0) == pytest.approx(33.0, abs=1.0)
