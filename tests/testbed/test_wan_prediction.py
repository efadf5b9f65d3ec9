"""The WAN line the router predicts transfers on (no servers): transfers on the line
share it, the backlog drains, slow start costs round trips, and the goodput average
follows a changed rate. The line's mirror of decode's connection pool:
test_wan_pool.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from testbed.router.config import PddConfig
from testbed.router.policies import wan_line
from testbed.router.tcp_model import (
    INITIAL_WINDOW,
    RESPONSES,
    Congestion,
    fit_round_trip,
    flow,
    jitter_spread_s,
    slow_start_s,
)
from testbed.router.wan import WanLine
from tests.testbed.wan_line import MB, Clock, alone, sent, settled
from topologies.link import CONGESTION_CONTROLS


def test_slow_start_costs_round_trips_until_the_window_fills_the_pipe():
    rate, rtt = 10 * MB, 0.02  # a pipe of 200 KB
    assert slow_start_s(10_000, rate, rtt) == 0  # within the first window: no extra round
    assert slow_start_s(100 * MB, rate, rtt) == slow_start_s(MB, rate, rtt)  # only the ramp
    assert 2 * rtt < slow_start_s(MB, rate, rtt) < 4 * rtt  # 4 windows of 14.5-116 KB
    assert slow_start_s(MB, rate, 0.0) == 0


def test_bytes_already_on_the_line_count_in_the_next_prediction():
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.01, clock=clock)
    ramp = slow_start_s(MB, 10 * MB, 0.02)
    lone = line.predict(1 * MB)  # the wire's time: first byte to last, no one-way term
    assert lone.queued_bytes == 0 and lone.seconds == pytest.approx(ramp + 0.1)
    line.start(room=1, nbytes=20 * MB)  # a large transfer goes first
    behind = line.predict(1 * MB)
    assert behind.queued_bytes == 20 * MB
    # The two share the line: the small one pays for its share, not for the whole backlog,
    # and its window holds it back only below the pipe of its half of the line (fewer
    # rounds of slow start than alone).
    shared_ramp = slow_start_s(MB, 5 * MB, 0.02)
    assert shared_ramp < ramp and behind.seconds == pytest.approx(shared_ramp + 0.2)
    clock.now += 1.0  # half of it has drained since
    assert line.predict(1 * MB).queued_bytes == pytest.approx(10 * MB, rel=1e-6)
    clock.now += 5.0  # drained entirely, even before its log line arrives
    assert line.predict(1 * MB).queued_bytes == 0


def test_transfers_share_the_line_and_drain_together():
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)
    line.start(1, 2 * MB)
    line.start(2, 20 * MB)
    clock.now += 0.4  # 5 MB/s each: the small one is done, the large one has 18 MB left
    assert line.backlog() == pytest.approx(18 * MB, rel=1e-6)
    clock.now += 0.9  # alone now, at the full rate
    assert line.backlog() == pytest.approx(9 * MB, rel=1e-6)


def test_a_settled_transfer_leaves_the_backlog():
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)
    line.start(1, 5 * MB)
    line.start(2, 5 * MB)
    line.settle(1, settled(1, 5 * MB, 0.5))
    assert line.predict(0).queued_bytes <= 5 * MB  # no more than what is outstanding
    line.settle(2, settled(2, 5 * MB, 1.0))
    assert line.predict(MB).queued_bytes == 0 and not line.outstanding


def test_the_goodput_follows_a_slower_line_ignores_one_slow_transfer_and_failures():
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.0, samples=8, clock=clock)
    assert line.goodput == 10 * MB  # seeded by the configured rate
    for room in range(1, 9):  # the line really carries 2 MB/s
        size = (MB // 10, 2 * MB)[room % 2]
        alone(line, clock, room, size, size / (2 * MB))
    assert line.goodput == pytest.approx(2 * MB)
    alone(line, clock, 9, 2 * MB, 10.0)  # one stalled on a retransmission timeout
    assert line.goodput == pytest.approx(2 * MB)  # a median: one outlier moves nothing
    alone(line, clock, 10, 2 * MB, 100.0, status="failed")  # a cut WAN: no sample
    assert line.goodput == pytest.approx(2 * MB)
    assert line.predict(4 * MB).seconds == pytest.approx(2.0)
    for room in range(11, 17):  # the line got faster: the recent transfers rule
        alone(line, clock, room, MB, MB / (4 * MB))
    assert line.goodput == pytest.approx(4 * MB)


def test_transfers_that_shared_the_line_do_not_train_the_fit():
    clock = Clock()
    line = WanLine(rate_bytes_s=4 * MB, clock=clock)
    line.start(1, 40 * MB)
    line.start(2, 40 * MB)  # both on the line: neither says what the line alone does
    clock.now += 10.0
    line.settle(1, settled(1, 40 * MB, 10.0, end=clock.now))  # 2 is still on the wire
    line.start(3, 4 * MB)  # routed while 2 still runs ...
    clock.now += 10.0
    line.settle(2, settled(2, 40 * MB, 20.0, end=clock.now))
    clock.now += 2.0
    line.settle(3, settled(3, 4 * MB, 3.0, end=clock.now))  # ... so it shared the line too
    assert not line.achieved.samples
    clock.now += 5.0
    line.start(4, 4 * MB)  # settled only later, when the router next looks ...
    clock.now += 3.0
    line.start(5, MB)  # ... so 5 was routed while 4 was outstanding, but after it ended
    line.settle(4, settled(4, 4 * MB, 2.0, end=clock.now - 0.5))
    line.sender_end(4, sent(4))
    assert list(line.achieved.samples) == [pytest.approx(2 * MB)]  # 4 had the line alone


def test_a_transfer_no_log_ever_settles_is_dropped_after_a_while():
    clock = Clock()
    line = WanLine(rate_bytes_s=1.0, clock=clock)  # drains nothing to speak of
    line.start(1, 10 * MB)
    clock.now += 10_000
    assert line.predict(0).queued_bytes == 0 and not line.outstanding


def test_on_a_lossy_line_a_flow_slows_past_its_loss_free_run_and_flows_share_the_line():
    """Default's line (100 Mbit/s, 20 ms, 0.1% loss, CUBIC, a 1000-packet queue): a loss
    every 1.45 MB cuts a window to 0.7 of itself, and it grows back half a segment a
    round trip, so a long flow's window stays at a quarter of the 250 KB pipe: its
    senders reported 40-115 KB, and 6.96 MB from a 57 KB window took 2.74 s (the line's
    rate says 0.56 s)."""
    clock = Clock()
    rate, one_way, loss = 12.5 * MB, 0.01, 0.001
    line = WanLine(rate, one_way_s=one_way, clock=clock, loss=loss, queue_bytes=1.5 * MB)
    cubic = RESPONSES["cubic"]
    long = flow(20 * MB, rate, 0.02, Congestion(60_000, 50_000), 1448 / loss, 1.5 * MB, cubic)
    assert 30_000 < long.end.cwnd < 120_000 and long.end.ssthresh < long.end.cwnd
    measured = flow(6.96 * MB, rate, 0.02, Congestion(57_000, 50_000), 1448 / loss, 1.5 * MB)
    assert 2.0 < measured.extra_s + 6.96 * MB / rate < 3.5
    # within its loss-free run a flow loses nothing: its window's rounds alone
    small = line.predict(int(0.5 * MB)).seconds
    assert small == pytest.approx(slow_start_s(0.5 * MB, rate, 0.02) + 0.5 * MB / rate)
    pooled = Congestion(60_000, 50_000)  # the loss at 1.45 MB cuts it further below the pipe
    lossy = flow(2.5 * MB, rate, 0.02, pooled, 1448 / loss, 1.5 * MB, cubic).extra_s
    assert lossy > flow(2.5 * MB, rate, 0.02, pooled, response=cubic).extra_s + 0.05
    lone = line.predict(int(2.5 * MB)).seconds  # a new connection's slow start overshoots
    assert lone == pytest.approx(slow_start_s(2.5 * MB, rate, 0.02) + 2.5 * MB / rate)
    # Behind a large transfer a flow pays for its share of the line, not the backlog.
    line.start(1, 20 * MB)
    assert lone < line.predict(int(2.5 * MB)).seconds < 2 * lone < 22.5 * MB / rate
    clock.now += 1.0  # the first drained its loss-free run at the line's rate, then slower
    assert 20 * MB - line.backlog() < rate * 1.0
    # Six flows need more than the line: the new one gets a sixth of it.
    for room in range(2, 6):
        line.start(room, 20 * MB)
    assert line.predict(int(2.5 * MB)).seconds > 6 * 2.5 * MB / rate


def test_no_flow_and_no_line_outrun_the_configured_rate():
    clock = Clock()
    rate = 12.5 * MB
    line = WanLine(rate_bytes_s=rate, one_way_s=0.01, clock=clock, loss=0.001)
    for room, size in enumerate((MB // 10, 2 * MB, MB // 10, 2 * MB, MB // 10, 2 * MB)):
        # lucky transfers: faster than the line itself
        alone(line, clock, room, size, 0.02 + size / (30 * MB))
    assert line.goodput <= rate
    assert line.predict(4 * MB).seconds >= 4 * MB / rate


def test_a_transfer_in_congestion_avoidance_does_not_lower_the_goodput():
    """A transfer slowed by its window's linear growth (the sender's threshold at its
    first chunk says it was past slow start) is explained by it, not by a slower line."""
    clock = Clock()
    rate, rtt, cwnd = 2 * MB, 1.0, 200_000
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    for room in range(1, 6):
        seconds = slow_start_s(532_000, rate, rtt, cwnd, cwnd) + 532_000 / rate
        alone(line, clock, room, 532_000, seconds, cwnd_bytes=cwnd, ssthresh_bytes=cwnd)
    assert line.goodput == pytest.approx(rate)


def test_a_transfer_whose_window_was_below_the_pipe_does_not_lower_the_goodput():
    """The kernel paces a flow at about its window per round trip: a transfer that fits
    in one window below the pipe still takes about window / RTT, which its window, not
    the line, set (default run 181955 learned 7 MB/s of a 12.5 MB/s line from two)."""
    clock = Clock()
    rate, rtt, cwnd = 12.5 * MB, 0.02, 152_040  # pipe 250 KB
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    for room in range(1, 6):
        alone(line, clock, room, 141_216, 0.021, cwnd_bytes=cwnd, ssthresh_bytes=cwnd)
    assert line.goodput == pytest.approx(rate)


def test_past_the_slow_start_threshold_a_window_grows_a_segment_a_round_trip():
    """A connection that lost packets is in congestion avoidance: its next transfer's
    window grows linearly, so a transfer many times its window takes many round trips
    (the sender reports its threshold in the Done frame)."""
    rate, rtt, cwnd = 12.5 * MB, 0.02, 20_000  # default's line, a window after losses
    doubling = slow_start_s(272_000, rate, rtt, cwnd)
    linear = slow_start_s(272_000, rate, rtt, cwnd, ssthresh=cwnd)
    assert 2 * rtt < doubling < 3 * rtt and 8 * rtt < linear < 10 * rtt  # plus bytes / rate
    clock = Clock()
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock, congestion="reno")
    line.start(room=1, nbytes=MB)
    clock.now += 1.0
    line.settle(1, settled(1, MB, 0.5, cwnd_end_bytes=cwnd, ssthresh_end_bytes=cwnd))
    assert line.predict(272_000).seconds == pytest.approx(linear + 272_000 / line.goodput)


def test_a_transfer_that_never_settles_does_not_keep_the_fit_from_learning():
    """A routed transfer no log line settles (its request failed first) stays outstanding
    until STALE_S; once the model has drained it, it no longer makes every later
    transfer count as sharing the line."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)
    line.start(1, MB)  # never settled
    clock.now += 5.0  # drained in the model long ago (0.1 s at the line's rate)
    for room, size in enumerate((MB // 10, 2 * MB, MB // 10, 2 * MB), start=2):
        alone(line, clock, room, size, 0.04 + size / (2 * MB))
    assert 1 in line.outstanding and line.goodput < 5 * MB  # it learned the slower line


def test_a_senders_count_for_a_transfer_dropped_unsettled_is_not_kept():
    """The sender's line came, the receiver's never did (the request failed, decode
    never logged it): once the transfer is dropped as stale, its count goes too."""
    from testbed.router.wan import STALE_S

    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)
    line.start(1, MB)
    line.sender_end(1, sent(1, retransmits=3))
    clock.now += STALE_S + 1
    alone(line, clock, 2, MB, 0.2)
    assert 1 not in line.outstanding and 1 not in line.resent


def test_a_lone_transfer_is_learned_with_its_senders_final_retransmission_count():
    """The receiver's line has the sender's count as of the Done frame, before the last
    windows' losses; the model learns a lone transfer once the sender's line (after
    decode's Ack) is in too, whichever comes first. Hetero run 111130: 1.7 MB in 16 s,
    0 retransmissions at the Done frame and 163 at the end, was learned as the line's
    goodput (0.1 MB/s) where it was a loss."""
    clock = Clock()
    line = WanLine(rate_bytes_s=2 * MB, one_way_s=0.0, clock=clock, loss=0.0001)
    clock.now += 1.0
    line.start(1, 2 * MB)
    clock.now += 16.0
    line.settle(1, settled(1, 2 * MB, 16.0, end=clock.now))  # 0 at the Done frame
    assert not line.achieved.samples  # not learned yet: the sender's count is not in
    line.sender_end(1, sent(1, retransmits=163))
    assert not line.achieved.samples  # a loss, not the line's rate
    clock.now += 1.0  # the sender's line first, then the receiver's: learned at once
    line.start(2, MB)
    clock.now += 1.0
    line.sender_end(2, sent(2))
    line.settle(2, settled(2, MB, 1.0, end=clock.now))
    assert list(line.achieved.samples) == [pytest.approx(MB)]


def test_a_lossless_transfer_teaches_the_goodput_and_a_lossy_one_nothing():
    """A lone transfer without a retransmission teaches the line's goodput; one with
    some is explained by the windows its losses cut, not by a slower line."""
    clock = Clock()
    rate, loss = 12.5 * MB, 0.001
    line = WanLine(rate_bytes_s=rate, one_way_s=0.01, clock=clock, loss=loss)
    full = {"cwnd_bytes": MB}  # a window past the pipe: no slow start to explain
    alone(line, clock, 1, 2 * MB, 2 * MB / rate + 0.5, retransmits=2, **full)
    assert not line.achieved.samples
    alone(line, clock, 2, MB, MB / (7.5 * MB), **full)
    assert list(line.achieved.samples) == [pytest.approx(7.5 * MB)]


def test_a_routed_transfer_drains_only_from_when_its_first_byte_is_due():
    """Decode checks its connection out and prefill computes before the first byte
    leaves: bytes routed a moment ago are all still ahead (drained from routing, the
    model saw a transfer routed with others half done before any had begun)."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.01, clock=clock)
    line.start(room=1, nbytes=MB)
    clock.now += 3.0  # first byte 2 s after routing, last 1 s later
    line.settle(1, settled(1, MB, 1.0, end=clock.now, start=clock.now - 2.0))
    assert line.lag_s == pytest.approx(2.0)
    line.start(room=2, nbytes=10 * MB)
    clock.now += 1.5
    assert line.backlog() == pytest.approx(10 * MB)  # not begun yet
    clock.now += 1.0
    assert line.backlog() == pytest.approx(10 * MB - 0.5 * line.goodput)


def test_a_flow_sharing_the_line_ramps_up_only_to_its_share():
    """A new connection's window holds its flow back only while it is below what the
    flow's share of the line carries in a round trip: behind a large transfer, 400 KB
    from a 14.5 KB window send 14.5, 29, 58 and 116 KB in four round trips (each under
    the 200 KB its half of a 10 MB/s line carries in 40 ms), then the rest at 5 MB/s.
    Counting the ramp against the whole line's pipe, and the share on top, added a
    round trip that never happens."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.02, clock=clock)
    line.start(room=1, nbytes=4 * MB)
    sent = sum(INITIAL_WINDOW * 2**i for i in range(4))
    expected = 4 * 0.04 + (400_000 - sent) / (5 * MB)
    assert line.predict(400_000).seconds == pytest.approx(expected)


def test_a_loss_costs_what_the_bottleneck_queue_does_not_cover():
    """A loss cuts the window (Reno to half, CUBIC to 0.7). On default's line (a 250 KB
    pipe) behind a 1000-packet queue a window that had filled the queue still fills the
    pipe after the cut, and the first 11.8 MB transfers took 1.1 s with five
    retransmissions; a window the cut leaves below the pipe costs the round trips it
    takes to grow back. The line predicts with its own congestion control."""
    rate, rtt, every = 12.5 * MB, 0.02, 1448 / 0.001
    full = Congestion(1.6 * MB, 1.6 * MB)  # the pipe and the queue
    lossless = flow(2 * MB, rate, rtt, full, queue=1.5 * MB).extra_s
    assert lossless == 0 and flow(2 * MB, rate, rtt, full, every, 1.5 * MB).extra_s == 0
    pipe = Congestion(250_000, 250_000)  # a window at the pipe: a loss empties it
    reno = flow(3 * MB, rate, rtt, pipe, every, 1.5 * MB, RESPONSES["reno"])
    cubic = flow(3 * MB, rate, rtt, pipe, every, 1.5 * MB, RESPONSES["cubic"])
    assert 0 < cubic.extra_s < reno.extra_s and cubic.end.cwnd < 250_000
    assert flow(3 * MB, rate, rtt, pipe, every, 1.5 * MB, RESPONSES["bbr"]).extra_s == 0
    pdd = PddConfig(wan_loss_pct=0.1, wan_queue_bytes=1_500_000, wan_congestion_control="bbr")
    line = wan_line(pdd)  # the scenario's congestion control and queue reach the line
    assert line.response == RESPONSES["bbr"] and line.queue == 1_500_000
    assert wan_line(PddConfig()).queue == float("inf")  # unknown: no overflow is predicted
    # every congestion control a link may set has a loss response; a typo is an error
    assert set(CONGESTION_CONTROLS) == set(RESPONSES)
    with pytest.raises(ValidationError, match="wan_congestion_control"):
        PddConfig(wan_congestion_control="cubik")


def test_slow_starts_rounds_teach_the_round_trip_they_took():
    """On default's 20 ms line, lone loss-free transfers from a pooled connection's
    120 KB window took the time slow start explains at 21.5-22.5 ms a round, not 20
    (delayed acks, the queue behind other traffic): they teach that round trip, not
    a lower goodput (which then over-predicted every transfer that needed no round).
    A new connection's transfer (the initial window) teaches nothing: its rounds took
    half again as long; neither does one no round trip in range explains."""
    rate, rtt, window = 12.5 * MB, 0.02, Congestion(120_000, 88_000)
    took = 0.27 * MB / rate + window.extra_s(0.27 * MB, rate, 0.022)
    fit = fit_round_trip(0.27 * MB, took, 0.27 * MB / rate, rate, rtt, window)
    assert fit == pytest.approx(0.022, rel=1e-3)
    assert fit_round_trip(0.27 * MB, 0.01, 0.27 * MB / rate, rate, rtt, window) is None
    clock = Clock()
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    pooled = {"cwnd_bytes": 120_000, "ssthresh_bytes": 88_000}
    alone(line, clock, 1, int(0.27 * MB), took, **pooled)
    assert line.round_trip.value == rtt  # one transfer is not yet the line's round trip
    alone(line, clock, 2, int(0.27 * MB), took, **pooled)
    alone(line, clock, 3, int(0.14 * MB), 0.9, cwnd_bytes=INITIAL_WINDOW)  # new connection
    assert line.round_trip.value == pytest.approx(0.022, rel=1e-3)
    assert line.goodput == rate
    # a transfer that needs no round (a window past the pipe) teaches the goodput
    alone(line, clock, 4, int(0.5 * MB), 0.5 * MB / (11 * MB), cwnd_bytes=MB)
    assert list(line.achieved.samples) == [pytest.approx(11 * MB)]
    assert len(line.round_trip.samples) == 2


def test_the_line_predicts_the_wires_bytes_frame_headers_included():
    """The router knows the KV bytes; the wire carries them in frames, a percent more
    on default. Where a window's round ends near the last byte, that percent is a
    round trip (run 215744: 270 KB of KV predicted at 51 ms, 272 KB on the wire took 66),
    so the line learns the wire's bytes per KV byte from the receivers' records."""
    from dataclasses import replace

    clock = Clock()
    rate, rtt = 12.5 * MB, 0.02
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    kv = int(0.27 * MB)
    line.start(1, kv)
    clock.now += 1.0
    line.settle(1, replace(settled(1, kv, 0.5, end=clock.now), wire_bytes=int(kv * 1.01)))
    assert line.framing.value == pytest.approx(1.01, rel=1e-4)
    window, _, _ = line._window(clock.now)
    expected = window.extra_s(kv * 1.01, rate, rtt) + kv * 1.01 / line.goodput
    assert line.predict(kv).seconds == pytest.approx(expected, rel=1e-6)


def test_an_order_keeping_jittered_line_delays_a_transfers_last_byte_by_about_its_jitter():
    """delayd adds ± jitter to each packet but keeps their order: the first byte's draw
    averages 0, the last leaves with the latest draw of those sent within 2 x jitter
    before it. On hetero's dilated line (0.5 ms x 235) that is nearly the whole jitter;
    a lone transfer measured at its bytes' time plus that teaches the configured rate,
    and the prediction carries it."""
    rate, jitter = 0.8 * MB, 0.1175
    assert jitter_spread_s(0.14 * MB, rate, 0.0) == 0.0
    assert jitter_spread_s(1000, rate, jitter) == 0.0  # one packet: the first is the last
    many = jitter_spread_s(0.14 * MB, rate, jitter)  # about 97 packets within 2 x jitter
    assert 0.97 * jitter < many < jitter
    assert jitter_spread_s(10 * MB, rate, jitter) > many  # more packets: a later maximum
    clock = Clock()
    line = WanLine(rate_bytes_s=rate, one_way_s=1.175, clock=clock, jitter_s=jitter)
    full = {"cwnd_bytes": 4 * MB}  # no round to take
    nbytes = int(0.3 * MB)
    spread = jitter_spread_s(nbytes, rate, jitter)
    alone(line, clock, 1, nbytes, nbytes / rate + spread, **full)
    assert line.goodput == pytest.approx(rate)  # not the 0.57 MB/s it seems without
    assert line.predict(nbytes).seconds == pytest.approx(nbytes / rate + spread, rel=1e-3)
