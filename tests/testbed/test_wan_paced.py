"""The router's model of a WAN line whose senders share it (``servers.kv_line_share``:
prefill paces its KV connections across the line together at a share of its rate)."""

from __future__ import annotations

import pytest

from protocol.kv import LINE_SHARE_HEADROOM
from testbed.router.config import PddConfig
from testbed.router.policies import wan_line
from testbed.router.tcp_model import Congestion
from testbed.router.wan import WanLine
from tests.testbed.wan_line import MB, Clock


def test_a_line_its_senders_share_runs_at_their_pace_and_no_window_bursts_into_its_queue():
    """Unpaced, a new connection's slow start doubles its window past the pipe and the
    bottleneck queue, and a loss cuts it (hetero's opening: hundreds of segments a
    transfer); paced at 0.9 of the line, the window's bursts leave at the pace and the
    queue stays short, so the transfer runs at the pace once its window fills the pipe."""
    clock = Clock()
    line = dict(rate_bytes_s=2 * MB, one_way_s=0.5, clock=clock, queue_bytes=MB // 10)
    plain, paced = WanLine(**line), WanLine(**line, paced=LINE_SHARE_HEADROOM)
    assert paced.rate == pytest.approx(1.8 * MB) and paced.goodput == pytest.approx(1.8 * MB)
    assert paced.queue == float("inf") and plain.queue == MB // 10
    rounds, first = 8, 14_480 * (2**8 - 1)  # 14.5 KB doubled to the 1.8 MB pipe
    expected = rounds * 1.0 - first / (1.8 * MB) + 10 * MB / (1.8 * MB)
    assert paced.predict(10 * MB).seconds == pytest.approx(expected, rel=0.02)
    new = Congestion()  # a new connection: slow start, no threshold yet
    assert paced._flow(10 * MB, paced.rate, new).end.ssthresh == float("inf")  # never cut
    assert plain._flow(10 * MB, plain.rate, new).end.ssthresh < 2 * MB  # cut past the queue


def test_the_routers_line_is_paced_where_the_scenario_shares_it():
    assert wan_line(PddConfig(wan_paced_share=LINE_SHARE_HEADROOM)).rate == pytest.approx(
        LINE_SHARE_HEADROOM * 100e6 / 8
    )
    assert wan_line(PddConfig()).rate == pytest.approx(100e6 / 8)
