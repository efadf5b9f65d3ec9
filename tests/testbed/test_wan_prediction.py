"""The WAN line the router predicts transfers on (no servers): transfers on the line
share it, the backlog drains, slow start costs round trips, and the goodput average
follows a changed rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol.records import TransferRecord
from testbed.router.tcp_model import INITIAL_WINDOW, flow_rate_bound, slow_start_s
from testbed.router.wan import WanLine

MB = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settled(
    room: int,
    nbytes: int,
    seconds: float,
    status: str = "success",
    end: float = 10.0,
    start: float = 0.0,
    **tcp,
) -> TransferRecord:
    """The receiver's record of a transfer whose last byte came at ``end``, begun (its
    connection checked out) at ``start`` (``tcp``: the sender's cwnd_bytes,
    cwnd_end_bytes, retransmits from its Done frame)."""
    return TransferRecord(
        room=room,
        side="decode",
        peer="p",
        start=start,
        first_byte=end - seconds,
        end=end,
        status=status,
        kv_bytes=nbytes,
        wire_bytes=nbytes,
        **tcp,
    )


def alone(line: WanLine, clock: Clock, room: int, nbytes: int, seconds: float, **kw) -> None:
    """One transfer with the line to itself: routed, run for ``seconds``, settled."""
    clock.now += 1.0
    line.start(room, nbytes)
    clock.now += seconds
    line.settle(room, settled(room, nbytes, seconds, end=clock.now, **kw))


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
    assert line.goodput == pytest.approx(4 * MB)
    clock.now += 5.0
    line.start(4, 4 * MB)  # settled only later, when the router next looks ...
    clock.now += 3.0
    line.start(5, MB)  # ... so 5 was routed while 4 was outstanding, but after it ended
    line.settle(4, settled(4, 4 * MB, 2.0, end=clock.now - 0.5))
    assert line.goodput < 4 * MB  # 4 had the line to itself: it trains the fit


def test_a_transfer_no_log_ever_settles_is_dropped_after_a_while():
    clock = Clock()
    line = WanLine(rate_bytes_s=1.0, clock=clock)  # drains nothing to speak of
    line.start(1, 10 * MB)
    clock.now += 10_000
    assert line.predict(0).queued_bytes == 0 and not line.outstanding


def test_on_a_lossy_line_a_flow_slows_past_its_loss_free_run_and_flows_share_the_line():
    clock = Clock()
    rate, one_way, loss = 12.5 * MB, 0.01, 0.001  # the default scenario's WAN
    line = WanLine(rate_bytes_s=rate, one_way_s=one_way, clock=clock, loss=loss)
    flow = flow_rate_bound(0.02, loss)
    assert 2.5 * MB < flow < 3 * MB and line.goodput == pytest.approx(rate)
    assert flow_rate_bound(0.02, 0.0) == float("inf")
    free = 1448 / loss  # the bytes a flow sends, on average, between two losses
    ramp = slow_start_s(2.5 * MB, rate, 0.02)
    # A lone 2.5 MB transfer: its first 1.45 MB at the line's rate, the rest at one
    # flow's loss bound (measured on default: 1.3 s where the line rate said 0.2 s).
    lone = line.predict(int(2.5 * MB)).seconds
    assert lone == pytest.approx(ramp + free / rate + (2.5 * MB - free) / flow)
    small = line.predict(int(0.5 * MB)).seconds  # within the loss-free run: the line's rate
    assert small == pytest.approx(slow_start_s(0.5 * MB, rate, 0.02) + 0.5 * MB / rate)
    # Two flows fit the line side by side: the second is barely slowed by the first.
    line.start(1, 20 * MB)
    half = slow_start_s(2.5 * MB, rate / 2, 0.02)  # its slow start against half the pipe
    assert line.predict(int(2.5 * MB)).seconds == pytest.approx(lone - ramp + half)
    clock.now += 1.0  # the first drained its loss-free run at the line's rate, then slower
    drained = free + (1.0 - free / rate) * flow
    assert line.backlog() == pytest.approx(20 * MB - drained, rel=1e-6)
    # Six flows need more than the line: the new one gets a sixth of it.
    for room in range(2, 6):
        line.start(room, 20 * MB)
    crowded = slow_start_s(2.5 * MB, rate / 6, 0.02) + 6 * 2.5 * MB / rate
    assert line.predict(int(2.5 * MB)).seconds == pytest.approx(crowded) and crowded > lone


def test_no_flow_and_no_line_outrun_the_configured_rate():
    clock = Clock()
    rate = 12.5 * MB
    line = WanLine(rate_bytes_s=rate, one_way_s=0.01, clock=clock, loss=0.001)
    for room, size in enumerate((MB // 10, 2 * MB, MB // 10, 2 * MB, MB // 10, 2 * MB)):
        # lucky transfers: faster than the line itself
        alone(line, clock, room, size, 0.02 + size / (30 * MB))
    assert line.goodput <= rate
    assert line.predict(4 * MB).seconds >= 4 * MB / rate


def test_a_reused_connection_keeps_its_window_and_only_a_new_one_pays_slow_start():
    """Decode pools its KV connections: the one returned last is reused while it idled
    less than servers.kv_pool_reuse_s, with the window its last transfer grew; a second
    transfer at the same time, or one after the pool went stale, opens a new connection."""
    clock = Clock()
    rate, rtt, reuse = 10 * MB, 0.02, 5.0
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock, pool_reuse_s=reuse)
    cold = line.predict(MB).seconds
    line.start(room=1, nbytes=MB)
    clock.now += cold
    line.settle(1, settled(1, MB, cold))
    warm = line.predict(MB).seconds
    assert cold - warm == pytest.approx(slow_start_s(MB, rate, rtt), rel=0.05)
    line.start(room=2, nbytes=MB)  # takes the warm connection ...
    concurrent = line.predict(MB).seconds  # ... so this one would open a new one
    assert concurrent - slow_start_s(MB, rate, rtt) > warm
    clock.now += 1.0
    line.settle(2, settled(2, MB, warm))
    clock.now += reuse + 1  # idle too long: decode opens a new connection
    assert line.predict(MB).seconds == pytest.approx(cold, rel=0.05)
    line.start(room=3, nbytes=MB)
    clock.now += 1.0
    line.settle(3, settled(3, MB, 0.0, status="failed"))  # closed, not pooled
    assert line.predict(MB).seconds == pytest.approx(cold, rel=0.05)


def test_slow_start_grows_a_pooled_window_by_the_bytes_it_carried():
    """A window w that carried x bytes in slow start comes back as w + x (each byte
    acknowledged adds one), so the next transfer starts from there."""
    clock = Clock()
    rate, rtt = 10 * MB, 1.0  # a 10 MB pipe: small transfers never leave slow start
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    small = 3 * INITIAL_WINDOW
    line.start(room=1, nbytes=small)
    clock.now += 3.0
    line.settle(1, settled(1, small, 2 * rtt))
    expected = slow_start_s(MB, rate, rtt, window=INITIAL_WINDOW + small)
    assert expected < slow_start_s(MB, rate, rtt)  # fewer rounds than a new one
    assert line.predict(MB).seconds == pytest.approx(expected + MB / line.goodput, rel=0.01)


def test_the_window_the_sender_reported_is_the_one_the_next_transfer_starts_from():
    """Loss shrinks a window where slow start alone would have grown it: the pool's
    window is the sender's own at the end of the transfer (its Done frame)."""
    clock = Clock()
    rate, rtt = 10 * MB, 1.0
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    line.start(room=1, nbytes=MB)
    clock.now += 5.0
    line.settle(1, settled(1, MB, 4.0, cwnd_bytes=INITIAL_WINDOW, cwnd_end_bytes=30_000))
    assert line.pool[-1].window.cwnd == 30_000  # not 14.5 KB + 1 MB
    expected = slow_start_s(MB, rate, rtt, window=30_000)
    assert line.predict(MB).seconds == pytest.approx(expected + MB / line.goodput, rel=0.01)


@pytest.mark.parametrize("in_flight", [10 * MB, 100 * MB])
def test_a_busy_connection_that_frees_before_decode_checks_out_serves_the_next(in_flight):
    """Decode checks a connection out lead_s after routing (learned from the receivers'
    start stamps). With every pooled connection busy, a transfer whose busy connection
    the model sees free by then is warm; one behind a transfer still running then pays
    a new connection's slow start. A freed connection serves one transfer only."""
    clock = Clock()
    rate, rtt = 10 * MB, 1.0
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    line.start(room=1, nbytes=MB)
    routed = clock.now
    clock.now += 5.0
    # decode checked the connection out 2 s after routing; the first byte came then
    record = settled(1, MB, 3.0, end=clock.now, start=routed + 2.0, cwnd_end_bytes=2 * MB)
    line.settle(1, record)
    assert line.lead_s == pytest.approx(2.0) and line.lag_s == pytest.approx(2.0)
    line.start(room=2, nbytes=in_flight)  # takes the pooled connection; begins in 2 s
    clock.now += 1.5  # the next transfer's checkout comes 3.5 s after room 2's routing
    freed = line.lag_s + in_flight / line.goodput <= 1.5 + line.lead_s
    window = (2 * MB + in_flight) if freed else INITIAL_WINDOW
    # what room 2 has left at this one's first byte (it has run 1.5 s by then) shares
    left = 0.0 if freed else in_flight - 1.5 * line.goodput
    shared = (MB + min(left, MB)) / line.goodput
    share = rate * MB / (MB + min(left, MB))  # the rate its window ramps up to
    expected = slow_start_s(MB, share, rtt, window=min(window, rate * rtt))
    assert line.predict(MB).seconds == pytest.approx(expected + shared)
    line.start(room=3, nbytes=50 * MB)  # ... and gets the freed connection, if any
    cold = slow_start_s(MB, rate, rtt)
    assert line.predict(MB).seconds >= cold  # no second promise
    clock.now += 1.0  # back before decode checks one out for room 3 (lead_s = 2 s)
    line.settle(2, settled(2, in_flight, 1.0, end=clock.now, start=clock.now - 3.0))
    assert len(line.pool) == (0 if freed else 1)  # promised, not pooled


def test_a_promised_connection_back_after_its_taker_checked_out_goes_to_the_pool():
    """The model gave room 2 the connection room 1 was to free by room 2's checkout;
    room 1 ended later than that, so decode gave room 2 another one and room 1's
    connection idles: the next transfer gets its window (it was lost to the mirror,
    which then predicted a poorer connection than decode took)."""
    clock = Clock()
    rate, rtt = 10 * MB, 1.0
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    alone(line, clock, 0, MB, 1.0, start=clock.now + 1.0 + 2.0)  # lead_s = 2 s
    line.start(room=1, nbytes=MB)  # takes room 0's connection
    clock.now += 0.5
    line.start(room=2, nbytes=MB)  # promised room 1's, seen free within lead_s
    assert line.outstanding[1].promised_to == 2
    clock.now += 10.0  # room 1 ends long after room 2's checkout
    line.settle(1, settled(1, MB, 1.0, end=clock.now, start=clock.now - 9.0, cwnd_end_bytes=MB))
    assert [c.window.cwnd for c in line.pool] == [MB]
    expected = slow_start_s(MB, rate, rtt, window=MB) + MB / line.goodput  # room 2 drained
    assert line.predict(MB).seconds == pytest.approx(expected)


def two_routed() -> tuple[WanLine, Clock]:
    """A 10 MB/s line with a 1 s round trip; two 1 MB transfers routed 5 s ago."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.5, clock=clock)
    line.start(room=1, nbytes=MB)
    line.start(room=2, nbytes=MB)
    clock.now += 5.0
    return line, clock


def test_the_line_mirrors_decode_taking_its_warmest_connection():
    """Decode reuses the idle connection with the largest reported window, whichever
    came back last; the mirror gives the next transfer that window, then the next."""
    line, clock = two_routed()
    rate, rtt = line.rate, line.rtt
    line.settle(1, settled(1, MB, 1.0, end=clock.now, cwnd_end_bytes=900_000))
    line.settle(2, settled(2, MB, 1.0, end=clock.now, cwnd_end_bytes=100_000))  # last back
    for n, window in enumerate((900_000, 100_000)):  # each shares with those before it
        share = rate / (n + 1)
        expected = slow_start_s(MB, share, rtt, window=window) + (n + 1) * MB / line.goodput
        assert line.predict(MB).seconds == pytest.approx(expected)
        line.start(room=window, nbytes=MB)  # checks it out


@pytest.mark.parametrize("sender_first", [False, True])
def test_the_senders_log_gives_the_window_the_connection_really_kept(sender_first):
    """The Done frame leaves while the last windows are in flight, so losses there are
    missing from it; the sender's log line, written once the receiver acknowledged, has
    the window the connection really keeps (decode has it from the Window frame and
    ranks its pool by it), whichever of the two log lines the router reads first."""
    line, clock = two_routed()
    rate, rtt = line.rate, line.rtt
    shrunk = dict(cwnd_end_bytes=400_000, ssthresh_end_bytes=400_000)
    if sender_first:
        line.sender_end(1, settled(1, MB, 1.0, **shrunk))
    line.settle(1, settled(1, MB, 1.0, end=clock.now, cwnd_end_bytes=900_000))
    line.settle(2, settled(2, MB, 1.0, end=clock.now, cwnd_end_bytes=600_000))
    if not sender_first:
        line.sender_end(1, settled(1, MB, 1.0, **shrunk))
    line.sender_end(7, settled(7, MB, 1.0, **shrunk))  # a transfer the line never had
    assert not line.ended
    expected = slow_start_s(MB, rate, rtt, 600_000) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(expected)  # room 2's is warmest now
    line.start(room=3, nbytes=MB)
    expected = slow_start_s(MB, rate / 2, rtt, 400_000, 400_000) + 2 * MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(expected)  # then room 1's, as it ended


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


def test_past_the_slow_start_threshold_a_window_grows_a_segment_a_round_trip():
    """A connection that lost packets is in congestion avoidance: its next transfer's
    window grows linearly, so a transfer many times its window takes many round trips
    (the sender reports its threshold in the Done frame)."""
    rate, rtt, cwnd = 12.5 * MB, 0.02, 20_000  # default's line, a window after losses
    doubling = slow_start_s(272_000, rate, rtt, cwnd)
    linear = slow_start_s(272_000, rate, rtt, cwnd, ssthresh=cwnd)
    assert 2 * rtt < doubling < 3 * rtt and 8 * rtt < linear < 10 * rtt  # plus bytes / rate
    clock = Clock()
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
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


def test_a_lossless_transfer_teaches_the_goodput_and_a_lossy_one_what_a_loss_costs():
    """Measured on default: under load transfers went at about 60% of the line, and a
    loss cost about 0.1 s where the Mathis bound the model is seeded with said 0.4 s.
    Each lone transfer teaches one of the two, by whether its sender retransmitted."""
    clock = Clock()
    rate, loss = 12.5 * MB, 0.001
    line = WanLine(rate_bytes_s=rate, one_way_s=0.01, clock=clock, loss=loss)
    free = 1448 / loss
    seeded = line.loss_s(10 * MB)
    assert seeded == pytest.approx((10 * MB - free) * (1 / flow_rate_bound(0.02, loss) - 1 / rate))
    full = {"cwnd_bytes": MB}  # a window past the pipe: no slow start to explain
    # Two retransmissions, 0.2 s beyond the line's rate: the goodput stays.
    alone(line, clock, 1, 2 * MB, 2 * MB / rate + 0.2, retransmits=2, **full)
    assert line.goodput == pytest.approx(rate) and line.loss_cost.value == pytest.approx(0.1)
    assert line.loss_s(10 * MB) == pytest.approx((10 * MB - free) / free * 0.1)
    assert line.loss_s(10 * MB) < seeded / 3
    # None: its rate is the goodput, which the next loss's cost is measured against.
    alone(line, clock, 2, MB, MB / (7.5 * MB), **full)
    assert line.goodput == pytest.approx(7.5 * MB)
    alone(line, clock, 3, 2 * MB, 2 * MB / (7.5 * MB) + 0.05, retransmits=1, **full)
    assert line.goodput == pytest.approx(7.5 * MB)
    assert line.loss_cost.value == pytest.approx((0.1 + 0.05) / 2)
    assert line.loss_s(MB) == 0  # within the loss-free run: most such flows lose nothing


def test_the_pool_holds_one_entry_per_connection_the_senders_log_names():
    """The model gave room 2 a new connection (room 1 looked busy past room 2's
    checkout), but decode reused room 1's: once the sender's log names the connection
    room 2 ran on, the entry room 1 left for it is a ghost and goes, and the next
    transfer starts from the window room 2 left (a ghost with room 1's larger window
    predicted a 0.4 MB transfer at 0.3 s where it took 1.5 s on hetero)."""
    clock = Clock()
    rate, rtt = 10 * MB, 1.0
    line = WanLine(rate_bytes_s=rate, one_way_s=rtt / 2, clock=clock)
    line.start(room=1, nbytes=100 * MB)
    line.start(room=2, nbytes=MB)  # nothing idle, nothing freed in time: a new one
    conn = "10.0.2.10:40000"

    def logs(room: int, cwnd: int) -> None:
        line.settle(room, settled(room, MB, 1.0, end=clock.now, cwnd_end_bytes=cwnd))
        line.sender_end(room, replace(settled(room, MB, 1.0, cwnd_end_bytes=cwnd), peer=conn))

    clock.now += 5.0
    logs(1, 900_000)
    clock.now += 1.0
    logs(2, 200_000)
    assert [(c.conn, c.window.cwnd) for c in line.pool] == [(conn, 200_000)]
    expected = slow_start_s(MB, rate, rtt, 200_000) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(expected)


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
