"""What the WAN-line tests share (no servers): a settable clock and the receiver's
records of transfers."""

from __future__ import annotations

from protocol.records import TransferRecord
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


def sent(room: int, retransmits: int = 0) -> TransferRecord:
    """The sender's record of a transfer, as its line after decode's Ack has it: its
    final retransmission count (no window: it changes no pooled connection here)."""
    return TransferRecord(
        room=room, side="prefill", peer="md:1", start=0.0, end=0.0, retransmits=retransmits
    )


def alone(line: WanLine, clock: Clock, room: int, nbytes: int, seconds: float, **kw) -> None:
    """One transfer with the line to itself: routed, run for ``seconds``, settled by the
    receiver's log line and then the sender's (with the same retransmissions)."""
    clock.now += 1.0
    line.start(room, nbytes)
    clock.now += seconds
    line.settle(room, settled(room, nbytes, seconds, end=clock.now, **kw))
    line.sender_end(room, sent(room, kw.get("retransmits", 0)))
