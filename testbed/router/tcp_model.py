"""One TCP flow over a rate-limited line, as the WAN model (:mod:`testbed.router.wan`)
counts it: the round trips a window below the pipe costs (slow start, congestion
avoidance), the rate random loss leaves a long flow, and the robust average the model
learns its parameters with. Pure functions and values: no state of the line here."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

MSS = 1448
INITIAL_WINDOW = 10 * MSS  # Linux's initial congestion window: 10 segments


def flow_rate_bound(rtt: float, loss: float) -> float:
    """Bytes per second one TCP flow carries at most under random loss ``loss`` (a
    fraction) and round trip ``rtt`` (Mathis et al.); unbounded without loss."""
    if loss <= 0 or rtt <= 0:
        return float("inf")
    return (1.5**0.5) * MSS / (rtt * loss**0.5)


def loss_cost_s(rate: float, rtt: float, loss: float, queue_bytes: float = 0.0) -> float:
    """What one random loss costs a long flow, in seconds. Reno halves its window; a
    window that filled the pipe (``rate`` x ``rtt``) and the bottleneck's queue still
    fills the pipe after halving if the queue is at least the pipe, and then costs
    nothing. Short of that, the pipe runs short by a deficit that refills one segment a
    round trip: the flow loses that triangle (deficit^2 / (2 MSS) bytes at the line's
    rate). Where losses come too often for it to refill (every ``MSS / loss`` bytes), a
    loss costs what keeps the flow at the Mathis bound. (Seeded at that bound alone, the
    default run's 11.8 MB transfers were predicted at 4 s and took 1.1: a queue of 1000
    packets over a 200 KB pipe.)"""
    if loss <= 0 or rate <= 0:
        return 0.0
    deficit = max(0.0, (rate * rtt - queue_bytes) / 2)
    triangle = deficit**2 / (2 * MSS * rate)
    mathis = MSS / loss * max(0.0, 1 / flow_rate_bound(rtt, loss) - 1 / rate)
    return min(triangle, mathis)


def slow_start_s(
    nbytes: float,
    rate: float,
    rtt: float,
    window: float = INITIAL_WINDOW,
    ssthresh: float = float("inf"),
) -> float:
    """Seconds a window below the pipe adds to sending ``nbytes`` at ``rate`` over a
    round trip of ``rtt``: each round sends only its window, which doubles each round
    trip (slow start) below ``ssthresh`` and grows one segment a round trip past it
    (congestion avoidance, where a connection that has lost packets stays), until it
    fills the pipe."""
    if nbytes <= 0 or rtt <= 0:
        return 0.0
    pipe, sent, rounds = rate * rtt, 0.0, 0
    while sent + window < nbytes and window < pipe:
        sent, rounds = sent + window, rounds + 1
        window = window * 2 if window < ssthresh else window + MSS
    return max(0.0, rounds * rtt - sent / rate)


def fit_round_trip(
    nbytes: float, seconds: float, line_s: float, rate: float, rtt: float, window: Congestion
) -> float | None:
    """The round trip under which slow start from ``window`` (its pipe at ``rate``)
    explains a transfer of ``nbytes`` taking ``seconds``, ``line_s`` of them at the
    line's goodput, by bisection (slow start's time grows with the round trip); None
    where no round trip between half and four times ``rtt`` (the configured one) does:
    the window was not what the sender said, or something else held the transfer."""

    def taken(r: float) -> float:
        return line_s + window.extra_s(nbytes, rate, r)

    lo, hi = rtt / 2, rtt * 4
    if not taken(lo) < seconds < taken(hi):
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if taken(mid) < seconds else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Congestion:
    """A connection's congestion state, as its sender last reported it (or guessed)."""

    cwnd: float = INITIAL_WINDOW
    ssthresh: float = float("inf")  # none yet: still in slow start

    @classmethod
    def reported(cls, cwnd_bytes: int, ssthresh_bytes: int) -> Congestion:
        """From a sender's TCP state as records carry it (a threshold of 0: none)."""
        return cls(float(cwnd_bytes), float(ssthresh_bytes or "inf"))

    def extra_s(self, nbytes: float, rate: float, rtt: float) -> float:
        return slow_start_s(nbytes, rate, rtt, self.cwnd, self.ssthresh)


class RecentMedian:
    """The median of the last ``n`` samples, ``seed`` until the first, never above
    ``cap``. A median rather than a fitted line or a mean: one transfer a retransmission
    timeout or a busy receiver slowed (hetero: 2.2 MB at half the line's rate) tilted a
    least-squares slope, and with it every size's prediction, until it decayed."""

    def __init__(self, seed: float, n: int = 16, cap: float = float("inf"), prior: int = 0) -> None:
        self.cap, self.value, self.seed, self.prior = cap, min(seed, cap), seed, prior
        self.samples: deque[float] = deque(maxlen=n)

    def add(self, value: float) -> None:
        """A sample; while fewer than ``prior`` came, the seed counts as the rest."""
        self.samples.append(value)
        held = [*self.samples, *[self.seed] * (self.prior - len(self.samples))]
        self.value = min(statistics.median(held), self.cap)
