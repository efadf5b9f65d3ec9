"""What the router believes is on the WAN: bytes queued or in flight, and the goodput
recent transfers achieved — so that a request's KV transfer time is predicted from
what the line is doing, not from its rate alone.

Lifecycle of one transfer on a :class:`WanLine`::

    predict(bytes) ─▶ start(room, bytes)   the router sends the request (P->MD, P->RLD->MD)
                        │ counted in the backlog, which drains at the goodput
                        │   (abandon(room): its request failed before decode took
                        │   a connection: off the line, its connection idle again)
                        ▼
                      settle(room, record)  the receiver's log says it ended: an
                        │                   empty line has no backlog left, and its
                        │                   connection goes back to the pool
                        ▼
                      sender_end(room, record)  the sender's log: its connection's
                                            final window and retransmission count
                                            (a lone transfer is learned with it)

What is predicted (``WanPrediction.span_s``) is the KV's span on the line: the sender's
first KV byte out to the receiver's last in, less the wire's idle while the sender waited
for prefill (``TransferRecord.span_s``): the first byte's way across (learned, alone and
behind others' standing queue), then the receiver's first-to-last time (``seconds``).

The line is a fluid model of TCP over a rate-limited drop-tail queue. Transfers on
it share the rate equally (processor sharing: measured, a small transfer behind a
large one is barely slower), so a transfer of ``s`` bytes among others with ``r_i``
bytes left finishes after ``(s + sum(min(r_i, s))) / goodput``, from when its first
byte is due: ``lag_s`` after routing, the median of recent transfers (decode's
checkout, prefill's compute, the way across), or once the transfer decode holds it back
for has ended (``after``: a prefix on its way, ``protocol.kv.holds_back``).

One flow alone pays, on top of its bytes at the goodput (the arithmetic of one flow:
:mod:`testbed.router.tcp_model`):

- TCP's window, from the one its connection already has: a round trip per doubling
  until it fills the pipe in slow start, ``alpha`` segments more per round trip past
  the slow start threshold. The line mirrors decode's pool of KV connections from
  decode's own pool lines, each with the window its sender reported last
  (:mod:`testbed.router.wan_pool`); decode checks one out ``lead_s`` after routing,
  else opens a new one.
- Random loss and the line's jitter, as :mod:`testbed.router.tcp_model` counts them.
  Past its loss-free run a transfer drains no faster than that flow alone.

Where prefill paces its senders together (``servers.kv_line_share``), the line is that
share of its rate (``paced``), and no window bursts into its bottleneck queue.

Slow start's rounds take ``round_trip``, learned from lone loss-free transfers with
rounds to take (default: 21.5-22.5 ms on a 20 ms line). A flow sharing the line ramps
up only to its share (its window holds it back below it).

Bytes are the wire's (``framing``: frame headers per KV byte, learned). The rest (the
receiver's work, what the model misses) is in the goodput: the median rate of the
recent settled transfers that had the line to themselves (no other's first to last
byte overlapped theirs, none still on the wire was routed before they ended), lost
nothing (by the sender's final count) and had no round to take.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace

from protocol.clock import now as clock_now
from protocol.kv import POOL_REUSE_S
from protocol.records import TransferRecord
from testbed.router.tcp_model import (
    INITIAL_WINDOW,
    MSS,
    RESPONSES,
    Congestion,
    Flow,
    RecentMedian,
    fit_round_trip,
    flow,
    jitter_spread_s,
)
from testbed.router.wan_items import Outstanding, WanPrediction
from testbed.router.wan_pool import PoolModel

STALE_S = 600.0  # an outstanding transfer no log ever settled is dropped after this
MAX_CHAIN = 8  # holds behind holds followed (each is routed before the one held for it)
MAX_UNLEARNED = 32  # lone transfers held for their sender's retransmission count


class WanLine(PoolModel):
    def __init__(
        self,
        rate_bytes_s: float,
        one_way_s: float = 0.0,
        samples: int = 16,
        clock=clock_now,
        loss: float = 0.0,
        pool_reuse_s: float = POOL_REUSE_S,
        queue_bytes: float = float("inf"),
        congestion: str = "reno",
        jitter_s: float = 0.0,
        paced: float = 0.0,
    ) -> None:
        self.rtt, self.jitter, self.loss = 2 * one_way_s, jitter_s, loss
        self.pool_reuse_s = pool_reuse_s  # decode servers' (servers.kv_pool_reuse_s)
        # the line as configured, or as prefill paces its senders together (a share of
        # it, servers.kv_line_share): then no window bursts into the bottleneck queue
        self.rate = float(rate_bytes_s) * (paced or 1.0)
        self.loss_free = MSS / loss if loss > 0 else float("inf")  # bytes between losses
        self.queue = float("inf") if paced else queue_bytes  # the bottleneck's
        self.response = RESPONSES[congestion]  # strict
        # the link-checked rate counts until 3 samples (default: a first at 58 of 100)
        self.achieved = RecentMedian(self.rate, samples, cap=self.rate, prior=3)
        self.way_alone = RecentMedian(one_way_s, samples, prior=3)  # the first byte's
        self.way_shared = RecentMedian(one_way_s, samples, prior=3)
        self.round_trip = RecentMedian(self.rtt, samples, prior=3)  # one outlier is not it
        self.framing = RecentMedian(1.0, samples)  # wire bytes per KV byte (frame headers)
        self.clock = clock
        self.outstanding: dict[int, Outstanding] = {}
        self._init_pool()  # decode's idle connections (testbed.router.wan_pool)
        # senders' final retransmission counts, read before the receiver's settle; lone
        # transfers awaiting their sender's count
        self.resent: dict[int, int] = {}
        self.unlearned: dict[int, tuple[TransferRecord, Congestion]] = {}
        self.recent: deque[tuple[float, float]] = deque(maxlen=64)  # settled: first byte, end
        self.leads: deque[float] = deque(maxlen=32)  # routed to decode's checkout (seconds)
        self.lags: deque[float] = deque(maxlen=32)  # routed to the first byte (seconds)
        self._as_of = clock()

    @property
    def goodput(self) -> float:
        """Bytes per second a loss-free transfer achieves with the line to itself, which
        is what the line carries in all (measured; never above the configured rate)."""
        return self.achieved.value

    def _flow(self, nbytes: float, rate: float, window: Congestion) -> Flow:
        """One flow of ``nbytes`` from ``window`` at ``rate``, with the line's losses."""
        rtt = self.round_trip.value
        return flow(nbytes, rate, rtt, window, self.loss_free, self.queue, self.response)

    def _loss_free_left(self, o: Outstanding) -> float:
        """Bytes before ``o`` leaves its loss-free run (0 once past it)."""
        left = self.loss_free - (o.bytes - o.left)
        return left if left > 1.0 else 0.0

    def _flow_rate(self, o: Outstanding, share: float) -> float:
        """A transfer's rate: its share of the line, and past its loss-free run at most
        its rate alone (the window the losses leave it)."""
        return share if self._loss_free_left(o) else min(share, o.cap)

    def _drain(self, now: float) -> None:
        """Advance the fluid model to ``now``."""
        for room in [r for r, o in self.outstanding.items() if now - o.started > STALE_S]:
            del self.outstanding[room]  # its transfer never ran (the request failed first)
        self._advance(list(self.outstanding.values()), self._as_of, now)
        self._as_of = max(self._as_of, now)

    def _advance(self, items, t: float, until: float, watch=None) -> float | None:
        """Drain ``items`` from ``t`` to ``until``: each begins ``lag_s`` after it was
        routed, and those begun share the goodput. Returns when ``watch`` (one of them)
        drained, if it did."""
        lag = self.lag_s
        while t < until:
            active = [o for o in items if o.left > 1e-6 and o.started + lag <= t + 1e-9]
            waiting = [
                o.started + lag - t for o in items if o.left > 1e-6 and o.started + lag > t + 1e-9
            ]
            if not active and not waiting:
                return None
            share = self.goodput / max(1, len(active))
            rates = [self._flow_rate(o, share) for o in active]
            events = [  # each transfer's next event: done, or the end of its loss-free run
                min(o.left, self._loss_free_left(o) or o.left) / r
                for o, r in zip(active, rates, strict=True)
            ]
            step = min(until - t, *events, *waiting)
            for o, r in zip(active, rates, strict=True):
                o.left = max(0.0, o.left - step * r)
                if o.left <= 1e-6:
                    o.drained_at = t + step
            t += step
            if watch is not None and watch.left <= 1e-6:
                return t
        return None

    def due(self, now: float, after: int | None) -> float:
        """When a transfer routed ``now`` has its first byte due: ``lag_s`` on, or once
        the model sees transfer ``after`` (decode holds it back for) end."""
        due = now + self.lag_s
        return due if after not in self.outstanding else max(due, self._end_of(after))

    def _end_of(self, room: int, depth: int = 0) -> float:
        """When the model, now, expects outstanding transfer ``room`` to end. One decode
        holds back for another (``Outstanding.after``) and has not checked out yet starts
        once that one ends: hetero run 061253 had a turn held 26 s behind a late
        opening, the model saw it drained, and the session's next turn, held for it in
        turn, was routed P->MD as unheld (it waited 76 s)."""
        held = self.outstanding[room]
        drained = held.drained_at
        if held.left > 1e-6:
            items = [replace(o) for o in self.outstanding.values()]
            watch = items[list(self.outstanding).index(room)]
            late = self._as_of + STALE_S
            drained = self._advance(items, self._as_of, late, watch) or self._as_of + self.lag_s
        end = self.ends_at(held, drained, self._as_of)
        if not held.checked_out and held.after in self.outstanding and depth < MAX_CHAIN:
            end = max(end, self._end_of(held.after, depth + 1) + held.alone_s)
        return end

    def ends_at(self, o: Outstanding, drained_at: float, now: float) -> float:
        """When the model expects ``o`` to end, as seen at ``now`` (``drained_at``: when
        the fluid drain empties it): not before its time with the line to itself (the
        drain shares the goodput and sees no window, so it ends a transfer on a new
        connection long before slow start lets it: hetero's 2 MB at a 1-1.4 s round trip
        take 7-10 s). One decode has checked out (its pool line) and not yet ended by
        ``now`` is late, and runs about as long again as it is late (hetero run 193018:
        three transfers that lost 150-920 segments in the opening burst ran 5-8 s where
        3 s were expected, and the model gave their connections, still busy, to the next
        ones). One not checked out yet is late to start, by a wait the model cannot
        see (a relayed request's, behind main decode's batch: hetero run 110250 had two
        start 10 s late and end 2 s after that), and is left at its drain here; one decode
        holds back for another transfer starts once that one ends (``_end_of`` chains it)."""
        end = max(drained_at, o.started + self.lag_s + o.alone_s)
        return end if end >= now or not o.checked_out else 2 * now - end

    def _at(self, t: float) -> list[Outstanding]:
        """Copies of the outstanding transfers as the model expects them at ``t`` (after
        the model's now)."""
        items = [replace(o) for o in self.outstanding.values()]
        self._advance(items, self._as_of, t)
        return items

    def backlog(self, now: float | None = None) -> float:
        """Bytes still on the line (queued or in flight), drained to ``now``."""
        self._drain(self.clock() if now is None else now)
        return sum(o.left for o in self.outstanding.values())

    @property
    def lead_s(self) -> float:
        """How long after routing decode checks a connection out (median of recent)."""
        return statistics.median(self.leads) if self.leads else 0.0

    @property
    def lag_s(self) -> float:
        """How long after routing a transfer's first byte arrives (median of recent):
        decode's checkout, prefill's compute, the first byte's way across."""
        return statistics.median(self.lags) if self.lags else 0.0

    def predict(self, own_bytes: int, after: int | None = None) -> WanPrediction:
        """The model's first-to-last-byte time of ``own_bytes`` routed now (held back
        until transfer ``after`` ends: ``WanPrediction.held_s``)."""
        now = self.clock()
        queued, due = round(self.backlog(now)), self.due(now, after)
        window, _, _ = self._window(now, started=due - self.lag_s)
        held = due - (now + self.lag_s)
        after, cwnd = after if held > 0 else None, round(window.cwnd)
        due_s = max(0.0, self.lag_s - self.lead_s)
        if not own_bytes:  # all it lacks is on its way in ``after``: it waits for that
            return WanPrediction(queued, 0, self.goodput, 0.0, cwnd, 0.0, held, after, 0.0, due_s)
        nbytes = own_bytes * self.framing.value
        # those still on the line when this transfer's first byte comes share it
        shared = sum(min(o.left, nbytes) for o in self._at(due))
        way = (self.way_shared if shared else self.way_alone).value
        line_s = (nbytes + shared) / self.goodput
        # its window against the pipe at the rate it gets (its share)
        share = self.rate * nbytes / (nbytes + shared)
        spread = jitter_spread_s(nbytes, share, self.jitter)
        seconds = self._flow(nbytes, share, window).extra_s + line_s + spread
        return WanPrediction(
            queued, own_bytes, self.goodput, seconds, cwnd, way, held, after, 0.0, due_s
        )

    def start(self, room: int, nbytes: int, after: int | None = None) -> None:
        self._drain(self.clock())
        nbytes = round(nbytes * self.framing.value)
        started = self.due(self._as_of, after) - self.lag_s  # its first byte due then
        window, conn, took = self._window(self._as_of, taker=room, started=started)
        item = Outstanding(
            nbytes, float(nbytes), started, window, conn=conn, took=took, after=after
        )
        item.alone_s = self._flow(nbytes, self.rate, window).extra_s + nbytes / self.goodput
        if self.loss:  # past its loss-free run it drains no faster than alone
            item.cap = nbytes / item.alone_s
        self.outstanding[room] = item

    def settle(self, room: int, record: TransferRecord) -> None:
        """The transfer of ``room`` ended (``record``: the receiver's log line; one that
        never ran leaves by :meth:`abandon`)."""
        self._drain(self.clock())
        item = self.outstanding.pop(room, None)
        resent = self.resent.pop(room, None)
        if item is None:
            return
        if not record.ok or not record.seconds or not record.kv_bytes:
            return  # a failed transfer's connection is closed, not pooled
        self.framing.add(record.wire_bytes / record.kv_bytes)
        self.leads.append(max(0.0, record.start - item.started))
        self.lags.append(max(0.0, record.wire_end - record.seconds - item.started))
        self._settled_conn(room, item, record)
        self._forget_ended()
        first, end = record.wire_end - record.seconds, record.wire_end
        shared = self._others_on(first, end, lag=0.0)
        if record.sender_first_byte:  # its first byte's way, alone or behind another's
            way = max(0.0, record.first_byte - record.sender_first_byte)
            behind = self._others_on(record.first_byte, record.first_byte, lag=self.lag_s)
            (self.way_shared if behind else self.way_alone).add(way)
        self.recent.append((first, end))
        if shared:
            return
        if resent is not None:
            self._learn(record, item.window, resent)
            return
        self.unlearned[room] = (record, item.window)
        while len(self.unlearned) > MAX_UNLEARNED:  # its sender's line never came
            oldest, window = self.unlearned.pop(next(iter(self.unlearned)))
            self._learn(oldest, window, oldest.retransmits)

    def abandon(self, room: int) -> bool:
        """The request of ``room`` failed before decode took a connection for its
        transfer (none will run): its bytes leave the line, a connection the model gave
        it is idle again, and one promised to it is free (kept until ``STALE_S`` they
        would have held the pool model's choice wrong for minutes). A transfer decode
        has checked out runs on, and decode's log settles it. True: dropped."""
        self._drain(self.clock())
        item = self.outstanding.get(room)
        if item is None or item.checked_out:
            return False
        del self.outstanding[room]
        self.resent.pop(room, None)
        for o in self.outstanding.values():
            if o.promised_to == room:
                o.promised_to = None
        if item.took is not None:
            self._returned(item.took)
        return True

    def _others_on(self, first: float, end: float, lag: float) -> bool:
        """Whether another transfer was on the line between ``first`` and ``end``: settled,
        or outstanding with its first byte due (``lag`` after routing) before ``end``."""
        return any(f < end and first < e for f, e in self.recent) or any(
            o.started + lag < end and o.left > 0 for o in self.outstanding.values()
        )

    def _learn(self, record: TransferRecord, window: Congestion, resent: int) -> None:
        """A transfer that had the line to itself, without a retransmission (``resent``:
        the sender's final count): the round trip its window's rounds took or, with none
        to take, its rate (the goodput) if its window spanned the pipe. One with losses
        teaches nothing: what a loss costs follows from the window it cuts
        (:func:`~testbed.router.tcp_model.flow`)."""
        if max(resent, record.retransmits):
            return
        x = record.wire_bytes
        seconds = record.seconds - jitter_spread_s(x, self.rate, self.jitter)
        if record.cwnd_bytes:  # the sender's measured window where it said
            window = Congestion.reported(record.cwnd_bytes, record.ssthresh_bytes)
        if 0 < record.cwnd_bytes <= INITIAL_WINDOW:  # a new connection's first rounds
            return  # took half again as long on default: nothing of the pooled ones'
        extra = window.extra_s(x, self.rate, self.round_trip.value, self.response)
        if extra > 0 and record.cwnd_bytes:
            # slow start had rounds to take from the window its sender measured: the
            # transfer teaches their round trip
            line_s = x / self.goodput
            fit = fit_round_trip(x, seconds, line_s, self.rate, self.rtt, window, self.response)
            if fit is not None:
                self.round_trip.add(fit)
            return
        if 0 < record.cwnd_bytes < self.rate * self.round_trip.value:
            # a window below the pipe set its rate, not the line (the kernel paces a flow
            # at about cwnd / RTT: 139 KB in one 152 KB window took 21 ms on a 12.5 MB/s
            # line, and taught default run 181955 a goodput of 7 MB/s)
            return
        if seconds > extra:
            self.achieved.add(x / (seconds - extra))

    def sender_end(self, room: int, record: TransferRecord) -> None:
        """The sender's log line for ``room``, written after decode's Ack: its final
        retransmission count (the Done frame's misses the last windows' losses), with
        which a lone transfer is learned, and the window its connection ended with
        (decode has it too, from the Window frame)."""
        pending = self.unlearned.pop(room, None)
        if pending is not None:
            self._learn(*pending, record.retransmits)
        elif room in self.outstanding:
            self.resent[room] = record.retransmits
        if record.ok and record.cwnd_end_bytes:
            self._sender_window(room, record)

    def _forget_ended(self) -> None:
        """Drop senders' windows and counts whose transfers the model no longer has."""
        for held in (self.ended, self.resent):
            for room in [r for r in held if r not in self.outstanding]:
                del held[room]
