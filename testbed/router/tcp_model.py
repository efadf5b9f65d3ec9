"""One TCP flow over a rate-limited line, as the WAN model (:mod:`testbed.router.wan`)
counts it: the round trips a window below the pipe costs (slow start, congestion
avoidance) and the windows random loss leaves it, and the robust average the model
learns its parameters with. Pure functions and values: no state of the line here.

- Random loss: a loss every ``MSS / p`` bytes (the first after that many), each cutting
  the window as the line's congestion control does (``RESPONSES``), as does a window
  beyond the pipe and the bottleneck queue; round by round (:func:`flow`), so a loss
  costs what the window then falls short of the pipe (on default, 0.1% and CUBIC, a
  long flow's window stays near a quarter of the pipe, as its senders reported).
- The line's jitter: an order-keeping delay line delays the last byte about that much
  more than the first (:func:`jitter_spread_s`; hetero).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

MSS = 1448
INITIAL_WINDOW = 10 * MSS  # Linux's initial congestion window: 10 segments


@dataclass(frozen=True)
class Response:
    """How a congestion control answers a loss and grows its window past the slow start
    threshold: the window is multiplied by ``beta`` at a loss and grows ``alpha``
    segments a round trip after it."""

    beta: float
    alpha: float


# Reno halves and adds a segment a round trip; CUBIC keeps 0.7 of its window and, at
# the windows and round trips of these lines, grows as its Reno-friendly estimate does,
# 3 (1 - beta) / (1 + beta) segments a round trip (its cubic curve grows slower there).
# On default (0.1% loss, 20 ms) that puts a long flow's window at 40-115 KB, as its
# senders reported, a quarter of the pipe. BBR does not answer random loss.
RESPONSES = {
    "reno": Response(0.5, 1.0),
    "cubic": Response(0.7, 3 * 0.3 / 1.7),
    "bbr": Response(1.0, 1.0),
}


@dataclass(frozen=True)
class Flow:
    """What one flow of some bytes takes: its seconds beyond the bytes at the line's
    rate, and the congestion state it ends with."""

    extra_s: float
    end: Congestion


def flow(
    nbytes: float,
    rate: float,
    rtt: float,
    start: Congestion,
    loss_every: float = float("inf"),
    queue: float = float("inf"),
    response: Response = RESPONSES["reno"],
) -> Flow:
    """One flow sending ``nbytes`` over a line of ``rate`` and round trip ``rtt`` from
    the window ``start``, round by round: each round sends the window and takes a round
    trip, or the window's bytes at the line's rate once it fills the pipe (the rest
    waits in the bottleneck queue). Below the slow start threshold the window doubles
    each round; past it, it grows by ``response.alpha`` segments. A loss every
    ``loss_every`` bytes (the first after that many: most flows shorter than that lose
    nothing), and a window beyond the pipe and the ``queue``, cut it to ``beta`` of
    itself and set the threshold there: so a loss costs what the window then falls
    short of the pipe, nothing where the queue keeps the pipe full."""
    if nbytes <= 0 or rtt <= 0:
        return Flow(0.0, start)
    pipe, sent, extra = rate * rtt, 0.0, 0.0
    window, ssthresh, next_loss = start.cwnd, start.ssthresh, loss_every
    for _ in range(100_000):  # a round each: bounded however odd the inputs
        if window >= nbytes - sent:
            break  # the last round: its bytes at the line's rate
        if window >= pipe and next_loss > nbytes and queue == float("inf"):
            break  # the pipe stays full to the end
        sent += window
        extra += max(0.0, rtt - window / rate)  # a round trip for less than it carries
        if sent >= next_loss or window > pipe + queue:
            window = ssthresh = max(window * response.beta, 2 * MSS)
            while next_loss <= sent:
                next_loss += loss_every
        elif window < ssthresh:
            window *= 2
        else:
            window += response.alpha * MSS
    return Flow(extra, Congestion(window, ssthresh))


def jitter_spread_s(nbytes: float, rate: float, jitter: float) -> float:
    """How much later a transfer's last byte arrives than its first on a delay line
    that adds a uniform ``± jitter`` to each packet but keeps their order (delayd: a
    packet leaves no earlier than the one before it). The first byte's draw averages
    0; the last leaves with the latest of the draws of the packets sent within the
    ``2 jitter`` before it: of ``n`` draws, ``jitter (n - 1) / (n + 1)`` on average.
    On hetero's dilated line (0.5 ms x 235) nearly the whole jitter, 117 ms, on every
    transfer past a few packets; on default's (1 ms), at most 1 ms."""
    if jitter <= 0 or nbytes <= 0:
        return 0.0
    n = max(1.0, min(nbytes, 2 * jitter * rate) / MSS)
    return jitter * (n - 1) / (n + 1)


def slow_start_s(
    nbytes: float,
    rate: float,
    rtt: float,
    window: float = INITIAL_WINDOW,
    ssthresh: float = float("inf"),
) -> float:
    """Seconds a window below the pipe adds to sending ``nbytes`` at ``rate`` over a
    round trip of ``rtt`` without a loss: each round sends only its window, which
    doubles each round trip (slow start) below ``ssthresh`` and grows one segment a
    round trip past it (congestion avoidance, where a connection that has lost packets
    stays), until it fills the pipe."""
    return flow(nbytes, rate, rtt, Congestion(window, ssthresh)).extra_s


def fit_round_trip(
    nbytes: float,
    seconds: float,
    line_s: float,
    rate: float,
    rtt: float,
    window: Congestion,
    response: Response = RESPONSES["reno"],
) -> float | None:
    """The round trip under which slow start from ``window`` (its pipe at ``rate``)
    explains a transfer of ``nbytes`` taking ``seconds``, ``line_s`` of them at the
    line's goodput, by bisection (slow start's time grows with the round trip); None
    where no round trip between half and four times ``rtt`` (the configured one) does:
    the window was not what the sender said, or something else held the transfer."""

    def taken(r: float) -> float:
        return line_s + window.extra_s(nbytes, rate, r, response)

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

    def extra_s(
        self, nbytes: float, rate: float, rtt: float, response: Response = RESPONSES["reno"]
    ) -> float:
        """Seconds its window adds to ``nbytes`` at ``rate`` without a loss."""
        return flow(nbytes, rate, rtt, self, response=response).extra_s


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
