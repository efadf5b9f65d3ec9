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

The line is a fluid model of TCP over a rate-limited drop-tail queue. Transfers on
it share the rate equally (processor sharing), so a transfer of ``s`` bytes among
others with ``r_i`` bytes left finishes after ``(s + sum(min(r_i, s))) / goodput``;
each transfer's remaining bytes drain that way between events (measured here: a
small transfer behind a large one is barely slower, as TCP shares the line, where a
first-come-first-served backlog predicted it ten times slower). A transfer pays TCP
slow start, a round trip per doubling of its window until the window fills the pipe,
from the window its connection already has: decode servers pool their KV connections
and reuse the one returned last (``protocol.kv.POOL_REUSE_S``), so the line mirrors
that pool — a connection that carried ``x`` bytes comes back with a window of about
``x`` (at most the pipe), and only a new one starts from the initial window. The
rest — framing, the receiver's work, what the model misses — is an overhead fitted
with the goodput by decaying least squares, seeded by the configured rate and
one-way delay, over the settled transfers that had the line to themselves (one that
shared it says nothing the model could have known).

On a lossy line one TCP flow cannot fill the pipe: its window settles where losses
halve it, about ``sqrt(3/2) * MSS / sqrt(p)`` (Mathis et al.), so a flow carries at
most that per round trip — at 0.1% loss and a 20 ms round trip about 2.8 MB/s of a
12.5 MB/s line (measured in the default bench: a lone 2.5 MB transfer took 1.3 s where
the line rate alone predicted 0.26 s). The fit therefore learns the goodput of one
flow, seeded by the smaller of the line rate and that bound, and the line itself is
the configured rate scaled by how far the fit moved from its seed; transfers sharing
the line each get at most one flow's goodput.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protocol.kv import POOL_REUSE_S
from protocol.records import TransferRecord

STALE_S = 600.0  # an outstanding transfer no log ever settled is dropped after this
MSS = 1448
INITIAL_WINDOW = 10 * MSS  # Linux's initial congestion window: 10 segments


def flow_rate_bound(rtt: float, loss: float) -> float:
    """Bytes per second one TCP flow carries at most under random loss ``loss`` (a
    fraction) and round trip ``rtt`` (Mathis et al.); unbounded without loss."""
    if loss <= 0 or rtt <= 0:
        return float("inf")
    return (1.5**0.5) * MSS / (rtt * loss**0.5)


def slow_start_s(nbytes: float, rate: float, rtt: float, window: float = INITIAL_WINDOW) -> float:
    """Seconds TCP slow start adds to sending ``nbytes`` at ``rate`` over a round trip
    of ``rtt``: the window doubles each round trip until it fills the pipe, and each
    round sends only its window."""
    if nbytes <= 0 or rtt <= 0:
        return 0.0
    pipe, sent, rounds = rate * rtt, 0.0, 0
    while sent + window < nbytes and window < pipe:
        sent, window, rounds = sent + window, window * 2, rounds + 1
    return max(0.0, rounds * rtt - sent / rate)


@dataclass(frozen=True)
class WanPrediction:
    queued_bytes: int  # on the line (queued or in flight) when this transfer was routed
    own_bytes: int  # this request's uncached KV
    goodput_bytes_s: float  # bytes per second one transfer achieves alone
    seconds: float  # predicted first-to-last-byte time of this transfer


@dataclass
class _Outstanding:
    bytes: int
    left: float  # not yet drained (the fluid model's view)
    started: float
    window: float  # its connection's congestion window (bytes) when it started
    shared: bool = False  # another transfer was on the line at some point


class _Fit:
    """y = overhead + x / goodput, fitted by exponentially weighted least squares; the
    goodput never above ``cap`` (a flow cannot outrun the line it is on)."""

    def __init__(self, rate: float, overhead: float, weight: float, cap: float) -> None:
        self.weight, self.cap = weight, cap
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
        self.goodput = min(1 / slope, self.cap)
        self.overhead = max(0.0, self.sy / self.n - self.sx / self.n / self.goodput)


class WanLine:
    def __init__(
        self,
        rate_bytes_s: float,
        one_way_s: float = 0.0,
        weight: float = 0.2,
        clock=time.time,
        loss: float = 0.0,
    ) -> None:
        self.rtt = 2 * one_way_s
        self.rate = float(rate_bytes_s)  # the line as configured
        self.flow_seed = min(self.rate, flow_rate_bound(self.rtt, loss))
        self.fit = _Fit(self.flow_seed, one_way_s, weight, cap=self.rate)
        self.clock = clock
        self.outstanding: dict[int, _Outstanding] = {}
        self.pool: list[tuple[float, float]] = []  # idle connections: (window, since), LIFO
        self._as_of = clock()

    @property
    def goodput(self) -> float:
        """Bytes per second one transfer achieves with the line to itself (fitted)."""
        return self.fit.goodput

    @property
    def line_rate(self) -> float:
        """What the line carries in all: the configured rate, scaled down as the fit
        fell below its seed (flows faster than the loss bound say nothing of the line)."""
        return self.rate * min(1.0, self.fit.goodput / self.flow_seed)

    def _drain(self, now: float) -> None:
        """Advance the fluid model to ``now``: active transfers share the goodput."""
        for room in [r for r, o in self.outstanding.items() if now - o.started > STALE_S]:
            del self.outstanding[room]  # its transfer never ran (the request failed first)
        elapsed, self._as_of = max(0.0, now - self._as_of), now
        active = [o for o in self.outstanding.values() if o.left > 0]
        while elapsed > 0 and active:
            share = min(self.goodput, self.line_rate / len(active))
            step = min(elapsed, min(o.left for o in active) / share)
            for o in active:
                o.left = max(0.0, o.left - step * share)
            elapsed -= step
            active = [o for o in active if o.left > 1e-6]

    def backlog(self, now: float | None = None) -> float:
        """Bytes still on the line (queued or in flight), drained to ``now``."""
        self._drain(self.clock() if now is None else now)
        return sum(o.left for o in self.outstanding.values())

    def _window(self, now: float, take: bool) -> float:
        """The congestion window the next transfer's connection has: the pool's last
        returned one if still reused, else a new connection's (``take``: check it out)."""
        self.pool = [(w, since) for w, since in self.pool if now - since < POOL_REUSE_S]
        if not self.pool:
            return INITIAL_WINDOW
        return self.pool.pop()[0] if take else self.pool[-1][0]

    def seconds(self, own_bytes: float) -> float:
        """The model's first-to-last-byte time of ``own_bytes`` starting now."""
        if not own_bytes:
            return 0.0
        shared = sum(min(o.left, own_bytes) for o in self.outstanding.values())
        window = self._window(self.clock(), take=False)
        return (
            self.fit.overhead
            + slow_start_s(own_bytes, self.goodput, self.rtt, window)
            + max((own_bytes + shared) / self.line_rate, own_bytes / self.goodput)
        )

    def predict(self, own_bytes: int) -> WanPrediction:
        queued = self.backlog()
        return WanPrediction(round(queued), own_bytes, self.goodput, self.seconds(own_bytes))

    def start(self, room: int, nbytes: int) -> None:
        self._drain(self.clock())
        busy = bool(self.outstanding)
        for other in self.outstanding.values():
            other.shared = True
        window = self._window(self._as_of, take=True)
        self.outstanding[room] = _Outstanding(
            nbytes, float(nbytes), self._as_of, window, shared=busy
        )

    def settle(self, room: int, record: TransferRecord | None = None) -> None:
        """The transfer of ``room`` ended (``record``: the receiver's log line, or None
        when it never ran, e.g. a request that failed before its transfer)."""
        self._drain(self.clock())
        item = self.outstanding.pop(room, None)
        if item is None:
            return
        if record is None or not record.ok or not record.seconds or not record.kv_bytes:
            return  # a failed transfer's connection is closed, not pooled
        pipe = max(self.goodput * self.rtt, INITIAL_WINDOW)
        self.pool.append((min(max(item.window, float(record.wire_bytes)), pipe), self._as_of))
        if not item.shared:  # what slow start explains is not the overhead's
            x = record.wire_bytes
            self.fit.add(x, record.seconds - slow_start_s(x, self.goodput, self.rtt, item.window))
