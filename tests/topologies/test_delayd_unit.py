"""delayd's pieces without a kernel queue: message parsing and the delay line."""

from __future__ import annotations

import struct

from topologies.emulation.delayd import NLMSG_ERROR, DelayLine, packet_ids


def error_reply(code: int) -> bytes:
    # nlmsghdr (16) + error code (4) + the offending header (16)
    body = struct.pack("=i", code) + b"\0" * 16
    return struct.pack("=IHHII", 16 + len(body), NLMSG_ERROR, 0, 0, 0) + body


def test_error_replies_are_collected_while_serving_not_raised():
    errors: list[int] = []
    assert packet_ids(error_reply(-2), errors) == []
    assert errors == [-2]


def test_delay_line_never_reorders_and_releases_in_batches():
    line = DelayLine(delay_s=0.010, jitter_s=0.005, seed=1)
    for i in range(1, 200):
        line.admit(i, now=i * 0.0001)
    dues = [d for d, _ in line._pending]
    assert dues == sorted(dues)  # release times never decrease
    assert line.pop_due(0.0) is None
    newest = line.pop_due(0.016)
    assert newest is not None and 1 <= newest < 199
    assert line.drain() == 199
