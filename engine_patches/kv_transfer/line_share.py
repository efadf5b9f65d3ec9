"""Prefill's KV sends across the WAN share the line's rate (``servers.kv_line_share``).

Left to TCP, each sender finds the line's rate by overflowing its queue: a pooled
connection starts a transfer with the whole window it grew and sends it as one burst,
and two or three such (requests a prefix hold released together) overflow the rate
limiter's drop-tail queue at once (hetero 100144: 941, 254 and 1231 retransmissions, 7-15
s for 1.7-12 MB that the line carries in 1-6). With a share, prefill paces every KV
connection that is sending across the line at ``HEADROOM`` x the line's rate divided by
their number (the kernel's TCP pacing, ``SO_MAX_PACING_RATE``): together they send no
faster than the line drains, no window bursts into its queue, and each gets an equal
share, which is what the router's model of the line assumes (processor sharing,
:mod:`testbed.router.wan`, at ``HEADROOM`` of the rate: ``PddConfig.wan_paced_share``).
A window below its share still limits its flow (a new connection's slow start); only
random loss still costs a round trip.

Lifecycle::

    from_env() (the prefill manager, once; None without PDD_KV_LINE)
      join(sock)   a leg sends a KV chunk to a far-site peer: every member re-paced
      leave(sock)  the kernel has sent all it was given while the leg waits for
                   prefill's next chunk (it joins again with the chunk) or for decode's
                   Ack (leave_once_sent), or its transfer failed: the rest re-paced

A leg leaves only once the kernel has sent everything it was given: left with bytes
still queued in its socket, those would drain at its old pace beside the others' larger
shares and overfill the line. Bytes sent left at the pace, so they do not: a leg need
not wait for their acknowledgement, a round trip later. Waiting for it, every transfer
that began within a round trip of another's last byte ran at half the line for that
round trip (hetero run ``bench-hetero-20261207-234754``, a 1 s round trip: 17 of 49
transfers across it started at a half or a third of the line, and lone 0.53 MB ones ran
at 0.83-0.94 MB/s where the share gave 1.84).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from protocol.env import Env
from protocol.kv import LINE_SHARE_HEADROOM as HEADROOM
from protocol.tcp import cap_pacing, unsent_bytes

logger = logging.getLogger("pdd.kv_transfer")
SHARE_POLL_S = 0.05  # a member waiting for prefill looks this often whether all is sent
SENT_POLL_S = 0.005  # a member that sent its Done looks this often whether all is sent


@dataclass
class LineShare:
    rate_bytes_s: float  # the line's (configured) rate
    peers: frozenset[str]  # decode hosts across the line (their addresses)
    members: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_env(cls) -> LineShare | None:
        """``PDD_KV_LINE``: ``{"rate_bytes_s": ..., "peers": [addresses]}``."""
        raw = os.environ.get(Env.KV_LINE)
        if not raw:
            return None
        spec = json.loads(raw)
        share = cls(float(spec["rate_bytes_s"]), frozenset(spec["peers"]))
        logger.info(
            "tcp KV transfer: sends to %s share %.0f B/s", sorted(share.peers), share.rate_bytes_s
        )
        return share

    @staticmethod
    def across(line: LineShare | None, peer: str) -> LineShare | None:
        """``line`` where ``peer`` is across it, else None."""
        return line if line is not None and line.crosses(peer) else None

    def crosses(self, peer: str) -> bool:
        """Whether a peer (``host:port`` as a sender's record names it) is across the line."""
        return peer.rsplit(":", 1)[0].strip("[]") in self.peers

    def __contains__(self, sock: socket.socket) -> bool:
        return sock in self.members

    def join(self, sock: socket.socket) -> None:
        with self._lock:
            if sock not in self.members:
                self.members.append(sock)
            self._reshare()

    def leave(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self.members:
                self.members.remove(sock)
                self._reshare()

    @staticmethod
    def all_sent(sock: socket.socket) -> bool:
        """Whether the kernel has sent all ``sock`` was given (False where it does not say)."""
        return unsent_bytes(sock) == 0

    def leave_once_sent(self, sock: socket.socket) -> bool:
        """Leave once the kernel has sent all ``sock`` was given, polling while that
        should take at its share (twice that, and a second); True: it left. Stays where
        the kernel does not say or the bytes do not go (a stalled wire): its Ack or its
        failure ends it then."""
        unsent = unsent_bytes(sock)
        if unsent is None or sock not in self:
            return False
        deadline = time.monotonic() + 2 * unsent / self.each_bytes_s() + 1.0
        while unsent and time.monotonic() < deadline:
            time.sleep(SENT_POLL_S)
            unsent = unsent_bytes(sock)
        if unsent == 0:
            self.leave(sock)
        return unsent == 0

    def each_bytes_s(self) -> float:
        return HEADROOM * self.rate_bytes_s / max(1, len(self.members))

    def _reshare(self) -> None:
        each = self.each_bytes_s()
        for sock in list(self.members):
            with contextlib.suppress(OSError):  # closed under us: its leg leaves next
                cap_pacing(sock, each)
