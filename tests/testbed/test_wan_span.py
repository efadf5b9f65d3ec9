"""The KV's span on the WAN (no servers): the sender's first byte out to the receiver's
last in, as the records measure it and the router's line predicts it; and the line's
goodput seeded by the configured rate."""

from __future__ import annotations

import pytest

from protocol.records import TransferRecord
from testbed.router.wan import WanLine
from tests.testbed.wan_line import MB, Clock, alone, settled


def test_the_span_runs_from_the_senders_first_byte_less_its_wait_for_prefill():
    record = TransferRecord(
        room=1,
        side="decode",
        peer="p",
        start=9.0,
        first_byte=10.6,  # one draw of the line's jitter late, or early
        last_byte=11.5,
        end=11.6,
        sender_first_byte=10.0,
        sender_wait_s=0.2,
    )
    assert record.seconds == pytest.approx(0.7)  # first in to last in, less the wait
    assert record.span_s == pytest.approx(1.3)  # first out to last in, less the wait
    assert record.span_s - record.seconds == pytest.approx(0.6)  # the first byte's way
    assert TransferRecord(room=1, side="decode", peer="p", start=0.0, end=1.0).span_s is None


def test_the_predicted_span_adds_the_first_bytes_way_alone_or_behind_others():
    """Seeded by the configured one-way delay; learned from the receivers' lines, alone
    and behind another transfer (a standing queue: hetero 0.6 s and 1.0-1.1 s)."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.5, clock=clock)
    lone = line.predict(MB)
    assert lone.way_s == 0.5 and lone.span_s == pytest.approx(lone.seconds + 0.5)
    for room in (1, 2, 3):  # alone, 0.6 s across
        clock.now += 1.0
        line.start(room, MB)
        clock.now += 1.0
        first = clock.now - 0.1
        line.settle(room, settled(room, MB, 0.1, end=clock.now, sender_first_byte=first - 0.6))
    assert line.predict(MB).way_s == pytest.approx(0.6)
    assert not line.way_shared.samples
    for room in (4, 5, 6):  # each behind a large transfer still on the line
        clock.now += 1.0
        line.start(100 + room, 100 * MB)
        line.start(room, MB)
        clock.now += 2.0
        first = clock.now - 0.5
        line.settle(room, settled(room, MB, 0.5, end=clock.now, sender_first_byte=first - 1.1))
        line.abandon(100 + room)  # gone from the line (never ran)
    assert line.way_shared.value == pytest.approx(1.1)
    assert line.way_alone.value == pytest.approx(0.6)  # the alone ones taught it nothing
    line.start(7, 100 * MB)
    behind = line.predict(MB)
    assert behind.way_s == pytest.approx(1.1)
    assert behind.span_s == pytest.approx(behind.seconds + 1.1)


def test_one_slow_first_transfer_does_not_set_the_lines_goodput():
    """Default run 034803: the first lone transfer the goodput learned from came at 58
    Mbit/s of the link-checked 100 (a busy receiver); on it alone the next transfers
    were predicted 70% long. The configured rate counts as three samples until the
    line has as many of its own, and then the line's own rule."""
    clock = Clock()
    line = WanLine(rate_bytes_s=12.5 * MB, clock=clock)
    alone(line, clock, 1, MB, MB / (7.25 * MB), cwnd_bytes=MB)
    assert line.goodput == pytest.approx(12.5 * MB)
    for room in (2, 3, 4):  # the line really is slower: it follows
        alone(line, clock, room, MB, MB / (8 * MB), cwnd_bytes=MB)
    assert line.goodput == pytest.approx(8 * MB)
