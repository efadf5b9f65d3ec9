"""Decode's pool of KV connections to its prefills, and its log of what it did with them.

Lifecycle of one connection (per prefill address)::

    opened (checkout found none) ─▶ carries one transfer ─▶ checkin (its sender's
      Done-frame window) ─▶ idle ─▶ its sender's Window frame arrives (the window once
      every byte was acknowledged; read at the next checkout, which ranks by it)
      ─▶ checkout (the warmest goes first) ─▶ ... ─▶ closed: idle past ``reuse_s``,
      closed by its peer or by keepalive (a cut WAN), or carrying anything but a Window

Every checkout (a pooled or a new connection) and every checkin is a
:class:`~protocol.records.PoolRecord` line in the server's transfer log: the connection,
its window, and every connection idle after the change. The router's WAN model mirrors
decode's pool from these lines (``testbed.router.wan``) rather than guessing it from
the transfers' ends.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from protocol import clock
from protocol.frames import MsgType, recv_frame
from protocol.kv import POOL_REUSE_S, Window
from protocol.records import IdleConn, JsonlWriter, PoolRecord


@dataclass
class Pooled:
    """An idle connection: when it came back, the window its sender reported (the Window
    frame's once read, else the Done frame's) and the transfer that returned it."""

    sock: socket.socket
    since: float  # time.monotonic()
    cwnd_bytes: int
    ssthresh_bytes: int = 0
    room: int = 0

    def warmth(self) -> tuple[int, float]:
        return self.cwnd_bytes, self.since  # the largest window, then the latest back


class ConnPool:
    def __init__(self, reuse_s: float = POOL_REUSE_S, log: JsonlWriter | None = None) -> None:
        self.reuse_s = reuse_s
        self.log = log or JsonlWriter(None)
        self._idle: dict[str, list[Pooled]] = {}
        self._lock = threading.Lock()

    def checkout(self, addr: str, room: int = 0) -> socket.socket | None:
        """The warmest idle connection to ``addr`` (None: decode opens a new one and says
        so with :meth:`opened`); those idle past ``reuse_s``, or closed, are dropped."""
        now = time.monotonic()
        chosen, dropped = None, []
        with self._lock:
            kept = []
            for c in self._idle.get(addr, []):
                if now - c.since >= self.reuse_s or not _read_window(c):
                    dropped.append(c.sock)
                else:
                    kept.append(c)
            kept.sort(key=Pooled.warmth)
            chosen = kept.pop() if kept else None
            self._idle[addr] = kept
            if chosen is not None:
                self._write("checkout", addr, room, chosen, now)
        for sock in dropped:
            sock.close()
        return chosen.sock if chosen is not None else None

    def opened(self, addr: str, room: int, sock: socket.socket) -> None:
        """A new connection to ``addr`` carries ``room``'s transfer (the pool had none)."""
        with self._lock:
            now = time.monotonic()
            self._write("checkout", addr, room, Pooled(sock, now, 0), now)

    def checkin(
        self, addr: str, sock: socket.socket, window: int = 0, ssthresh: int = 0, room: int = 0
    ) -> None:
        """A connection back into the pool after ``room``'s transfer, with the window its
        sender reported at the transfer's end (0: unknown)."""
        now = time.monotonic()
        back = Pooled(sock, now, window, ssthresh, room)
        with self._lock:
            self._idle.setdefault(addr, []).append(back)
            self._write("checkin", addr, room, back, now)

    def _write(self, event: str, addr: str, room: int, c: Pooled, now: float) -> None:
        """The change as a transfer-log line (under the lock: lines in the pool's order)."""
        idle = [
            IdleConn(_name(i.sock), i.cwnd_bytes, i.ssthresh_bytes, now - i.since, i.room).entry()
            for i in self._idle.get(addr, [])
        ]
        self.log.write(
            PoolRecord(
                room, event, addr, _name(c.sock), c.cwnd_bytes, c.ssthresh_bytes, idle, clock.now()
            )
        )


def _name(sock: socket.socket) -> str:
    """A connection's decode end, ``ip:port`` (as prefill's log names its peer)."""
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return ""
    return f"{host}:{port}"


def _read_window(c: Pooled) -> bool:
    """Whether an idle connection is still good, with its sender's Window frame read into
    it where one came; False if the peer closed it, keepalive gave up on it (a cut WAN),
    or it carries anything else."""
    sock = c.sock
    timeout = sock.gettimeout()
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return False
        while select.select([sock], [], [], 0)[0]:
            sock.settimeout(1.0)  # a frame that began to arrive is whole by then
            kind, _, body = recv_frame(sock)
            if kind != MsgType.WINDOW:
                return False
            told = Window.decode(bytes(body))
            c.cwnd_bytes, c.ssthresh_bytes = told.cwnd_bytes, told.ssthresh_bytes
        return True
    except (OSError, ValueError, struct.error):
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)
