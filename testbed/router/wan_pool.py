"""The WAN line's model of decode's pool of KV connections: which connection, with which
congestion window, a transfer routed now gets when decode checks one out.

Lifecycle of the model's pool (a mixin of :class:`testbed.router.wan.WanLine`, whose
transfers on the line it reads: ``outstanding``, ``_at``, ``ends_at``, ``lead_s``)::

    start(room)  the model gives the routed transfer a connection: the warmest idle one
      │          at decode's checkout (reserved: ``Outstanding.conn``), or that of a
      │          transfer ending before it (promised), or a new one
      │          (abandon(room): its request failed first: the idle one is back)
      ▼
    mirror(line)  decode's pool line (``protocol.records.PoolRecord``): the connection
      │           the transfer really got, and every connection idle after the change;
      │           from the first such line on, the model's pool is decode's, less the
      │           connections reserved for transfers not yet checked out
      ▼
    sender_end(room)  the sender's log: the window the connection kept once every byte
                      was acknowledged (decode ranks by it once its Window frame came)

Without pool lines (a run from before them, ``testbed wan-replay``) the model guesses
the pool from the transfers' ends (``_settled_conn``) and the senders' logs.
"""

from __future__ import annotations

from collections import OrderedDict

from protocol.records import PoolRecord, TransferRecord
from testbed.router.tcp_model import INITIAL_WINDOW, Congestion
from testbed.router.wan_items import Idle, Outstanding

TOLD_KEPT = 256  # senders' end windows kept by room, for connections decode returns


class PoolModel:
    pool: list[Idle]
    outstanding: dict[int, Outstanding]

    def _init_pool(self) -> None:
        self.pool = []  # idle connections
        self.mirrored = False  # decode's pool lines came: the pool is decode's
        # senders' end windows (and connections), read before the receiver's settle
        self.ended: dict[int, tuple[Congestion, str, float]] = {}
        self.told: OrderedDict[int, tuple[Congestion, float]] = OrderedDict()  # by room

    def _window(
        self, now: float, taker: int | None = None, started: float | None = None
    ) -> tuple[Congestion, str | None, Idle | None]:
        """The congestion window the next transfer's connection has, which connection,
        and the idle entry it is, if one (``taker``: the transfer that checks it out).
        Decode takes the warmest idle connection when its request reaches it, ``lead_s``
        after routing (after
        ``started``, for a request decode holds back: it checks out once the hold ends):
        one idle then and still reusable; with none, one of a transfer the model sees
        ending by then (whether it is back in time is the model's guess: preferring a
        warmer one of these to an idle one put default's P95 error at 75-78% where
        decode took the idle one; 57% without); else a new connection's."""
        self.pool = [c for c in self.pool if now - c.since < self.pool_reuse_s]
        checkout = max(now, started if started is not None else now) + self.lead_s
        reusable = [c for c in self.pool if checkout - c.since < self.pool_reuse_s]
        best_idle = max(reusable, key=lambda c: (c.rank, c.since), default=None)
        if best_idle is not None:
            if taker is not None:
                self.pool.remove(best_idle)
            return best_idle.window, best_idle.conn, best_idle
        freed = [
            o
            for o, later in zip(self.outstanding.values(), self._at(checkout), strict=True)
            if o.promised_to is None
            and later.left <= 1e-6
            and self.ends_at(o, later.drained_at, now) <= checkout
        ]
        best_freed = max(freed, key=lambda o: (o.window.cwnd, o.started), default=None)
        if best_freed is None:
            return Congestion(), None, None
        if taker is not None:
            best_freed.promised_to = taker
        return self._grown(best_freed.window, best_freed.bytes), best_freed.conn, None

    def _grown(self, window: Congestion, nbytes: float) -> Congestion:
        """The model's guess of a window after carrying ``nbytes``: on a lossless line,
        slow start grows it by every byte acknowledged, up to the pipe (congestion
        avoidance: barely); on a lossy one, as the losses leave it."""
        if self.loss:
            return self._flow(nbytes, self.rate, window).end
        if window.cwnd >= window.ssthresh:
            return window
        pipe = self.rate * self.round_trip.value
        return Congestion(min(window.cwnd + nbytes, max(pipe, INITIAL_WINDOW)))

    def mirror(self, line: PoolRecord) -> None:
        """A far-site decode's pool line: the connection a transfer checked out (window
        0: a new one) or checked in, and every connection idle after the change, which
        become the model's pool (less those reserved for transfers routed but not yet
        checked out; their window the sender's log gave, where it came)."""
        self._drain(self.clock())
        self.mirrored = True
        item = self.outstanding.get(line.room)
        if line.event == "checkout" and item is not None:
            got = Congestion.reported(line.cwnd_bytes, line.ssthresh_bytes)
            item.window = got if line.cwnd_bytes else Congestion()
            item.conn, item.checked_out = line.conn, True
            for o in self.outstanding.values():
                if o.promised_to == line.room:  # it checked out what it really got
                    o.promised_to = None
                if o is not item and not o.checked_out and o.conn == line.conn:
                    o.conn = o.took = None  # reserved by the model, taken by this one
        reserved = {o.conn for o in self.outstanding.values() if o.conn and not o.checked_out}
        self.pool = []
        for c in line.idle_conns:
            if c.conn in reserved:
                continue
            window = Congestion.reported(c.cwnd_bytes, c.ssthresh_bytes)
            window, rank = self.told.get(c.room, (window, c.cwnd_bytes))
            self.pool.append(Idle(c.room, window, line.time - c.idle_s, rank, c.conn))

    def _settled_conn(self, room: int, item: Outstanding, record: TransferRecord) -> None:
        """Without decode's pool lines: a settled transfer's connection back in the pool
        (with the sender's window as it ended, else the model's guess), unless given to a
        transfer routed after it that checked out after it was back."""
        if self.mirrored:
            return
        if record.cwnd_end_bytes:
            window = Congestion.reported(record.cwnd_end_bytes, record.ssthresh_end_bytes)
        else:
            window = self._grown(item.window, record.wire_bytes)
        taker = self.outstanding.get(item.promised_to) if item.promised_to is not None else None
        if taker is None or record.end > taker.started + self.lead_s:
            window, conn, rank = self.ended.pop(room, (window, None, window.cwnd))
            self._returned(Idle(room, window, self._as_of, rank, conn))

    def _sender_window(self, room: int, record: TransferRecord) -> None:
        """The sender's log line for ``room``: the window its connection ended with,
        and the one it told decode (which ranks its pool by it)."""
        window = Congestion.reported(record.cwnd_end_bytes, record.ssthresh_end_bytes)
        told = record.told_cwnd_bytes or window.cwnd  # settled after it: what it has
        self.told[room] = (window, told)
        while len(self.told) > TOLD_KEPT:
            self.told.popitem(last=False)
        for idle in self.pool:
            if idle.room == room:
                idle.window, idle.conn, idle.rank = window, record.peer, told
                self._returned(idle)
                return
        if room in self.outstanding and not self.mirrored:  # the receiver's line is not read yet
            self.ended[room] = (window, record.peer, told)

    def _returned(self, idle: Idle) -> None:
        """``idle`` is back in the pool: an entry the model still holds for the same
        connection is a ghost of a wrong guess, and goes."""
        if idle not in self.pool:
            self.pool.append(idle)
        if idle.conn is not None:
            self.pool = [c for c in self.pool if c is idle or c.conn != idle.conn]
