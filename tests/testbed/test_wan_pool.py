"""The WAN line's mirror of decode's KV connection pool (no servers): which connection,
with which congestion window, the next transfer gets, as decode and the senders' logs
say."""

from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.router.tcp_model import INITIAL_WINDOW, slow_start_s
from testbed.router.wan import WanLine
from tests.testbed.wan_line import MB, Clock, alone, settled


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


@pytest.mark.parametrize("in_flight", [MB // 2, 10 * MB, 100 * MB])
def test_a_busy_connection_that_frees_before_decode_checks_out_serves_the_next(in_flight):
    """Decode checks a connection out lead_s after routing (learned from the receivers'
    start stamps). With every pooled connection busy, a transfer whose busy connection
    the model sees free by then is warm; one behind a transfer still running then pays
    a new connection's slow start. A freed connection serves one transfer only. Free
    means done had it the line alone, its window's rounds included: 10 MB from a 2 MB
    window on a 1 s round trip takes three rounds, not the 1 s its bytes take at the
    rate."""
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
    alone = slow_start_s(in_flight, rate, rtt, window=2 * MB) + in_flight / line.goodput
    freed = line.lag_s + alone <= 1.5 + line.lead_s
    window = (2 * MB + in_flight) if freed else INITIAL_WINDOW
    # what room 2 has left at this one's first byte (it has run 1.5 s by then) shares
    left = max(0.0, in_flight - 1.5 * line.goodput)
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


def test_decode_ranks_by_the_window_it_was_told_and_gets_the_one_that_settled():
    """The sender tells decode its window right after the Ack (the Window frame: decode's
    pool takes the largest), and logs the one the connection has once the kernel undid
    a spurious cut. The model ranks as decode does and predicts with what it gets."""
    line, clock = two_routed()
    rate, rtt = line.rate, line.rtt
    line.settle(1, settled(1, MB, 1.0, end=clock.now, cwnd_end_bytes=300_000))
    line.settle(2, settled(2, MB, 1.0, end=clock.now, cwnd_end_bytes=600_000))
    undone = dict(cwnd_end_bytes=900_000, ssthresh_end_bytes=900_000, told_cwnd_bytes=300_000)
    line.sender_end(1, replace(settled(1, MB, 1.0, **undone), peer="md:1"))
    told = settled(2, MB, 1.0, cwnd_end_bytes=600_000, told_cwnd_bytes=600_000)
    line.sender_end(2, replace(told, peer="md:2"))  # two connections
    expected = slow_start_s(MB, rate, rtt, 600_000) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(expected)  # decode takes room 2's
    line.start(room=3, nbytes=MB)
    expected = slow_start_s(MB, rate / 2, rtt, 900_000, 900_000) + 2 * MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(expected)  # then room 1's, as settled


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
