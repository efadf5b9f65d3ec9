"""The link check's arithmetic on iperf3's JSON (no network: the intervals below stand
in for an iperf3 receiver's, and a bare spec for a network; the real check runs in
test_network_netns.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from topologies.check import Measurement, iperf, iperf_timeout_s, read_again, steady_received_mbit
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


def test_seconds_within_the_flows_way_across_are_not_steady():
    # hetero at k = 123: a 1.2 s round trip before the first datagram, 62 ms of
    # jitter; the second from 1 s to 2 s held part of it (a 3 s flood read 38% low)
    end = {
        "sum_received": {"bits_per_second": 5e6},
        "receiver_intervals": [
            interval(0, 1, 0.0),
            interval(1, 2, 0.7),
            interval(2, 3, 1.0),
            interval(3, 4, 1.0),
            interval(4, 4.5, 0.4),
        ],
    }
    assert steady_received_mbit(end)[0] == pytest.approx(2.7 * 8 / 3)
    mbit, steady = steady_received_mbit(end, lead_s=1.48)
    assert steady and mbit == pytest.approx(8.0)


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


class ControlLossNet:
    """Stands in for a Network whose iperf3 client fails its control exchange once
    (as on a 1%-loss line under load), then runs; or always fails with another error."""

    spec = SimpleNamespace(wan=LinkSpec(loss_pct=1.0))

    def __init__(self, errors: list[str]) -> None:
        self.errors, self.runs = errors, 0

    def popen(self, host, argv, log):
        return SimpleNamespace(stop=lambda: None)

    def address(self, host):
        return "10.0.0.2"

    def run(self, host, argv, timeout, check):
        self.runs += 1
        error = self.errors.pop(0) if self.errors else None
        body = {"error": error} if error else {"end": {"sum": {"lost_percent": 1.0}}}
        return SimpleNamespace(stdout=json.dumps(body), stderr="")


def test_iperf_runs_again_once_when_its_control_connection_failed(tmp_path):
    net = ControlLossNet(["unable to read from stream socket: Resource temporarily unavailable"])
    assert iperf(net, "p1", "md1", 1, udp_mbit=5, log_dir=tmp_path)["sum"]["lost_percent"] == 1.0
    assert net.runs == 2
    twice = ControlLossNet(["unable to read from stream socket"] * 2)
    with pytest.raises(RuntimeError, match="stream socket"):
        iperf(twice, "p1", "md1", 1, udp_mbit=5, log_dir=tmp_path)
    other = ControlLossNet(["unable to connect to server"])
    with pytest.raises(RuntimeError, match="unable to connect"):
        iperf(other, "p1", "md1", 1, udp_mbit=5, log_dir=tmp_path)
    assert other.runs == 1


def test_a_reading_out_of_tolerance_is_read_again_and_the_better_one_stands():
    """Stands in for iperf3 and ping with lists of readings: a stall of the shared
    machine skews one reading, a wrong shaper or delay line every one."""

    def reader(*measured: float):
        readings = iter(measured)

        def read() -> list[Measurement]:
            got = next(readings)
            ok = abs(got - 20) <= 2
            return [Measurement("WAN", "rtt_avg_ms", 20.0, got, "±2", ok), MIN_ROW]

        return read

    assert read_again(reader(17.4, 19.6))[0].measured == 19.6  # a stall: the second holds
    assert read_again(reader(12.0, 11.0))[0].measured == 12.0  # wrong twice: the first
    assert not read_again(reader(12.0, 11.0))[0].ok
    assert read_again(reader(19.0))[0].measured == 19.0  # within: read once
    assert read_again(reader(19.0))[0].tolerance == "±2"
    assert read_again(reader(17.4, 19.6))[0].tolerance == "±2 (of 2 readings)"
    assert read_again(reader(25.0, 20.5))[0].measured == 20.5  # too high, then within


MIN_ROW = Measurement("WAN", "rtt_min_ms", None, 20.0, "-", True)
