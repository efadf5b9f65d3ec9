"""What the router believes is on the WAN: bytes queued or in flight, and the goodput
recent transfers achieved — so that a request's KV transfer time is predicted from
what the line is doing, not from its rate alone.

Lifecycle of one transfer on a :class:`WanLine`::

    predict(bytes) ─▶ start(room, bytes)   the router sends the request (P->MD, P->RLD->MD)
                        │ counted in the backlog, which drains at the goodput
                        ▼
                      settle(room, record)  the receiver's log says it ended: the
                                            goodput average learns from it, and an
                                            empty line has no backlog left

The backlog is a fluid queue: it drains at the goodput while the line is busy, so a
prediction made halfway through a long transfer counts only what is left of it.
A transfer's time is modelled as ``overhead + bytes / goodput``, where bytes are its
own and those ahead of it: the overhead (round trips, framing, the receiver's work)
dominates small transfers, the goodput large ones. Both come from a decaying
least-squares fit, seeded by the configured rate and one-way delay, over the settled
transfers that had the line to themselves (one that shared it with a transfer started
after it says nothing the model could have known), so one kind of transfer does not
bias the other's estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protocol.records import TransferRecord

STALE_S = 600.0  # an outstanding transfer no log ever settled is dropped after this


@dataclass(frozen=True)
class WanPrediction:
    queued_bytes: int  # already on the line ahead of this transfer
    own_bytes: int  # this request's uncached KV
    goodput_bps: float  # bytes per second the line achieves
    seconds: float  # predicted first-to-last-byte time of this transfer


@dataclass
class _Outstanding:
    bytes: int
    queued_ahead: float
    started: float
    shared: bool = False  # another transfer was on the line at some point


class _Fit:
    """y = overhead + x / goodput, fitted by exponentially weighted least squares."""

    def __init__(self, rate: float, overhead: float, weight: float) -> None:
        self.weight = weight
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0
        scale = max(rate * 0.1, 1.0)  # seed: two points on the configured line
        for x in (0.0, scale):
            self.add(x, overhead + x / rate, decay=False)
        self.overhead, self.goodput = overhead, rate

    def add(self, x: float, y: float, decay: bool = True) -> None:
        keep = 1 - self.weight if decay else 1.0
        self.n, self.sx, self.sy = keep * self.n + 1, keep * self.sx + x, keep * self.sy + y
        self.sxx, self.sxy = keep * self.sxx + x * x, keep * self.sxy + x * y
        if not decay:
            return
        var = self.sxx / self.n - (self.sx / self.n) ** 2
        if var <= 0:
            return
        slope = (self.sxy / self.n - self.sx * self.sy / self.n**2) / var
        if slope <= 0:
            return  # not enough spread in sizes yet: keep the last estimate
        self.goodput = 1 / slope
        self.overhead = max(0.0, self.sy / self.n - slope * self.sx / self.n)


class WanLine:
    def __init__(
        self, rate_bytes_s: float, one_way_s: float = 0.0, weight: float = 0.2, clock=time.time
    ) -> None:
        self.fit = _Fit(float(rate_bytes_s), one_way_s, weight)
        self.one_way_s = one_way_s
        self.clock = clock
        self.outstanding: dict[int, _Outstanding] = {}
        self._backlog = 0.0
        self._as_of = clock()

    def backlog(self, now: float | None = None) -> float:
        """Bytes still ahead on the line (the fluid queue, drained to ``now``)."""
        now = self.clock() if now is None else now
        for room in [r for r, o in self.outstanding.items() if now - o.started > STALE_S]:
            del self.outstanding[room]  # its transfer never ran (the request failed first)
        if not self.outstanding:
            return 0.0
        return max(0.0, self._backlog - self.goodput * max(0.0, now - self._as_of))

    @property
    def goodput(self) -> float:
        return self.fit.goodput

    def predict(self, own_bytes: int) -> WanPrediction:
        queued = self.backlog()
        seconds = self.fit.overhead + (queued + own_bytes) / self.goodput if own_bytes else 0.0
        return WanPrediction(round(queued), own_bytes, self.goodput, seconds)

    def start(self, room: int, nbytes: int) -> None:
        now = self.clock()
        queued = self.backlog(now)
        self._backlog, self._as_of = queued + nbytes, now
        for other in self.outstanding.values():
            other.shared = True
        self.outstanding[room] = _Outstanding(nbytes, queued, now, shared=bool(self.outstanding))

    def settle(self, room: int, record: TransferRecord | None = None) -> None:
        """The transfer of ``room`` ended (``record``: the receiver's log line, or None
        when it never ran, e.g. a request that failed before its transfer)."""
        item = self.outstanding.pop(room, None)
        if item is None:
            return
        now = self.clock()  # no more backlog than the transfers still outstanding
        left = sum(o.bytes for o in self.outstanding.values())
        self._backlog, self._as_of = min(self.backlog(now), left), now
        if record is None or not record.ok or not record.seconds or not record.kv_bytes:
            return
        if not item.shared:
            self.fit.add(record.wire_bytes, record.seconds)
