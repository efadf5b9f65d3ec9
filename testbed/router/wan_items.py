"""The shapes :mod:`testbed.router.wan`'s model of the line keeps: a request's
prediction, a transfer on the line, a pooled connection."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.router.tcp_model import Congestion


@dataclass(frozen=True)
class WanPrediction:
    queued_bytes: int  # on the line (queued or in flight) when this transfer was routed
    own_bytes: int  # this request's uncached KV
    goodput_bytes_s: float  # bytes per second one transfer achieves alone
    seconds: float  # predicted first-to-last-byte time of this transfer
    cwnd_bytes: int = 0  # the congestion window the model gave its connection
    way_s: float = 0.0  # predicted: its first byte's way across (queueing included)
    held_s: float = 0.0  # decode holds it back this long for a prefix on its way
    after: int | None = None  # the transfer it is held back for (its room)
    unheld_s: float = 0.0  # predicted ``seconds`` of all it lacks, had decode not held it back
    # from decode having the request to its first KV byte in, unheld (prefill's compute,
    # the way across): the model's lag less its lead
    due_s: float = 0.0

    @property
    def span_s(self) -> float:  # the KV's time on the line: its first byte out to last in
        return self.way_s + self.seconds


@dataclass
class Idle:
    """A pooled connection, as the model sees it."""

    room: int  # the transfer that returned it
    window: Congestion  # its congestion state: the Done frame's, then the sender's log's
    since: float
    rank: float  # the window decode's pool ranks it by (its Window frame's)
    conn: str | None = None  # which connection: its decode end, as the sender's log names it


@dataclass
class Outstanding:
    bytes: int
    left: float  # not yet drained (the fluid model's view)
    started: float
    window: Congestion  # its connection's when it started
    cap: float = float("inf")  # its rate alone on a lossy line (its window's)
    alone_s: float = 0.0  # its first to last byte with the line to itself (its window's rounds)
    drained_at: float = 0.0  # when the fluid drain emptied it (once it has)
    promised_to: int | None = None  # the transfer routed after it given its connection
    conn: str | None = None  # its connection: decode's pool line's, else the model's choice
    checked_out: bool = False  # decode's pool line said which connection it took
    took: Idle | None = None  # the idle connection the model gave it (back if it never runs)
    after: int | None = None  # the transfer decode holds it back for (its room), if any
