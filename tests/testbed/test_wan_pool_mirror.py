"""The WAN line's pool once decode's pool lines come (testbed.router.wan_pool.mirror;
no servers): the model's pool is decode's, the transfer that checked a connection out
runs from its real window, and a connection the model gave a routed transfer stays
its until decode says which one it took."""

from __future__ import annotations

import pytest

from protocol.records import IdleConn, PoolRecord
from testbed.router.tcp_model import INITIAL_WINDOW, slow_start_s
from testbed.router.wan import WanLine
from tests.testbed.wan_line import MB, Clock, settled


def pool_line(clock, event: str, room: int, conn: str, cwnd: int, *idle: IdleConn) -> PoolRecord:
    return PoolRecord(room, event, "p:1", conn, cwnd, 0, [i.entry() for i in idle], time=clock.now)


def line_and_clock() -> tuple[WanLine, Clock]:
    clock = Clock()
    return WanLine(rate_bytes_s=10 * MB, one_way_s=0.5, clock=clock), clock


def test_decode_pool_lines_replace_the_models_guess_of_its_pool():
    """The model guessed from room 1's end that its connection idles with a 2 MB window;
    decode's line says it holds one 50 KB connection only (room 1's was closed): the
    next transfer is predicted from decode's, and once decode's lines come a settle adds
    no guessed connection."""
    line, clock = line_and_clock()
    rate, rtt = line.rate, line.rtt
    line.start(room=1, nbytes=MB)
    clock.now += 5.0
    line.settle(1, settled(1, MB, 1.0, end=clock.now, cwnd_end_bytes=2 * MB))
    guessed = slow_start_s(MB, rate, rtt, 2 * MB) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(guessed)
    line.mirror(pool_line(clock, "checkin", 9, "md:7", 50_000, IdleConn("md:7", 50_000, 0, 0, 9)))
    mirrored = slow_start_s(MB, rate, rtt, 50_000) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(mirrored)
    line.start(room=2, nbytes=MB)  # the model gives it md:7
    clock.now += 5.0
    line.settle(2, settled(2, MB, 1.0, end=clock.now, cwnd_end_bytes=3 * MB))
    assert line.pool == []  # decode's checkin line returns it, not the settle
    cold = slow_start_s(MB, rate, rtt) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(cold)


def test_a_checkout_line_gives_the_transfer_its_real_window_and_frees_a_reservation():
    """The model gave room 1 the warm connection md:1; decode opened a new one for it
    (window 0 on its checkout line). Room 1 now runs from a new connection's window, and
    md:1, no longer reserved, is the next transfer's."""
    line, clock = line_and_clock()
    warm = IdleConn("md:1", 2 * MB, 0, 1.0, 5)
    line.mirror(pool_line(clock, "checkin", 5, "md:1", 2 * MB, warm))
    line.start(room=1, nbytes=MB)
    assert line.outstanding[1].conn == "md:1" and line.pool == []
    line.mirror(pool_line(clock, "checkin", 6, "md:2", 70_000, IdleConn("md:2", 70_000, 0, 0, 6)))
    assert [c.conn for c in line.pool] == ["md:2"]  # md:1 stays room 1's
    line.mirror(pool_line(clock, "checkout", 1, "md:9", 0, warm, IdleConn("md:2", 70_000, 0, 0, 6)))
    item = line.outstanding[1]
    assert (item.conn, item.checked_out, item.window.cwnd) == ("md:9", True, INITIAL_WINDOW)
    assert sorted(c.conn for c in line.pool) == ["md:1", "md:2"]
    assert line.predict(MB).cwnd_bytes == 2 * MB  # decode's warmest


def test_the_senders_told_window_ranks_a_mirrored_connection():
    """Decode ranks by the sender's Window frame once it reads it (at its next checkout);
    the sender's log has it earlier. A connection decode's line lists with its Done-frame
    window is ranked by the told one, and predicted from the window it kept."""
    line, clock = line_and_clock()
    told = settled(4, MB, 1.0, cwnd_end_bytes=300_000, told_cwnd_bytes=300_000)
    line.sender_end(4, told)
    a, b = IdleConn("md:1", 900_000, 0, 0, 4), IdleConn("md:2", 500_000, 0, 0, 3)
    line.mirror(pool_line(clock, "checkin", 4, "md:1", 900_000, a, b))
    assert line.predict(MB).cwnd_bytes == 500_000  # md:2 ranks above md:1 now


def taught_lead(line: WanLine, clock: Clock) -> None:
    """Decode checks a connection out 1 s after routing; the first byte comes 0.4 s later."""
    routed = clock.now
    line.start(room=9, nbytes=MB // 10)
    clock.now += 2.0
    line.settle(9, settled(9, MB // 10, 0.6, end=clock.now, start=routed + 1.0))
    assert (line.lead_s, line.lag_s) == pytest.approx((1.0, 1.4))


def test_a_transfer_still_unsettled_past_its_end_keeps_its_connection_as_long_again():
    """Room 1's last byte was due 1.41 s after routing, and decode's log has not ended it:
    it is late, and is expected to run about as long again as it is late. Late by 0.3 s,
    it frees its connection before the next checkout (1 s on); late by 2 s, it does not,
    and the next transfer is predicted on a new connection (hetero run 193018: transfers
    that lost hundreds of segments ran seconds late, their connections busy)."""
    line, clock = line_and_clock()
    taught_lead(line, clock)
    warm = IdleConn("md:1", 2 * MB, 0, 0, 5)
    line.mirror(pool_line(clock, "checkin", 5, "md:1", 2 * MB, warm))
    routed = clock.now
    line.start(room=1, nbytes=MB // 10)
    line.mirror(pool_line(clock, "checkout", 1, "md:1", 2 * MB))
    clock.now = routed + 1.71
    assert line.predict(MB).cwnd_bytes == 2 * MB + MB // 10
    clock.now = routed + 3.41
    assert line.predict(MB).cwnd_bytes == INITIAL_WINDOW


def test_an_idle_connection_serves_the_next_transfer_before_one_the_model_sees_freed():
    """Decode takes what is idle at its checkout. A transfer the model sees ending just
    before it, with a larger window, is a guess (it may not be back in time): the next
    transfer is predicted on the idle connection; with none idle, on the freed one."""
    line, clock = line_and_clock()
    rate, rtt = line.rate, line.rtt
    taught_lead(line, clock)
    busy = IdleConn("md:1", 2 * MB, 0, 0, 5)
    line.mirror(pool_line(clock, "checkin", 5, "md:1", 2 * MB, busy))
    line.start(room=1, nbytes=MB // 10)  # takes md:1; its last byte is due 1.41 s on
    line.mirror(pool_line(clock, "checkout", 1, "md:1", 2 * MB))
    line.mirror(pool_line(clock, "checkin", 6, "md:2", 50_000, IdleConn("md:2", 50_000, 0, 0, 6)))
    clock.now += 0.5  # the next transfers check out 1.5 s after room 1's routing
    idle = slow_start_s(MB, rate, rtt, 50_000) + MB / line.goodput
    assert line.predict(MB).seconds == pytest.approx(idle)
    line.start(room=2, nbytes=MB)  # takes md:2; room 1's connection is next
    assert line.predict(MB).cwnd_bytes == 2 * MB + MB // 10  # grown by what room 1 carried


def test_a_request_that_failed_before_decode_took_a_connection_gives_it_back():
    """Room 1's request failed before decode checked a connection out (its transfer will
    never run): the warm connection the model gave it is the next transfer's again, and
    its bytes are off the line, at once and after decode's next pool line. A transfer
    decode did check out runs on until decode's log settles it."""
    line, clock = line_and_clock()
    warm = IdleConn("md:1", 2 * MB, 0, 1.0, 5)
    line.mirror(pool_line(clock, "checkin", 5, "md:1", 2 * MB, warm))
    line.start(room=1, nbytes=MB)
    assert line.predict(MB).cwnd_bytes == INITIAL_WINDOW  # md:1 is room 1's
    line.abandon(1)
    again = line.predict(MB)
    assert (again.cwnd_bytes, again.queued_bytes) == (2 * MB, 0)
    other = IdleConn("md:2", 70_000, 0, 0, 6)
    line.mirror(pool_line(clock, "checkin", 6, "md:2", 70_000, warm, other))
    assert sorted(c.conn for c in line.pool) == ["md:1", "md:2"]
    line.start(room=2, nbytes=MB)
    line.mirror(pool_line(clock, "checkout", 2, "md:1", 2 * MB, other))
    line.abandon(2)  # decode has it: its log settles it
    assert 2 in line.outstanding and line.predict(MB).queued_bytes == MB


def test_a_failed_request_gives_back_no_connection_another_transfer_took():
    """The model reserved md:1 for room 1, but decode checked it out for room 2: when room
    1's request fails, md:1 is busy with room 2 and does not come back to the pool."""
    line, clock = line_and_clock()
    warm = IdleConn("md:1", 2 * MB, 0, 1.0, 5)
    line.mirror(pool_line(clock, "checkin", 5, "md:1", 2 * MB, warm))
    line.start(room=1, nbytes=MB)  # the model gives it md:1
    line.start(room=2, nbytes=MB)
    line.mirror(pool_line(clock, "checkout", 2, "md:1", 2 * MB))
    assert line.abandon(1)
    assert line.pool == [] and line.predict(MB).cwnd_bytes == INITIAL_WINDOW
