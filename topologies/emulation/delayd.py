"""delayd — a stdlib-only NFQUEUE daemon that delays packets (delay ± uniform jitter).

Runs inside a gateway's network namespace, bound to the nfqueue that the gateway's
nftables ``forward`` chain sends WAN-bound packets to. Lifecycle:

    start → bind queue (copy-meta: no payload crosses to userspace) → write "ready"
    → loop { read packet ids, stamp each with its release time; release due ones }
    → SIGTERM: release everything pending, unbind, exit 0.

Release times never decrease, so packets are never reordered (netem's default
jitter reorders; this one does not). Verdicts are sent in batches: one
``NFQNL_MSG_VERDICT_BATCH`` accepts every packet id up to the newest due one, which
also releases a packet whose metadata the socket ever dropped (ENOBUFS).
The kernel segments GSO packets before queueing them, so each id is one wire packet.

Usage: python -m topologies.emulation.delayd --queue 0 --delay-ms 10 --jitter-ms 2
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
AF_UNSPEC = 0


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", AF_UNSPEC, 0, socket.htons(queue)) + attrs
    header = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, 0, 0)
    return header + body


def config_message(queue: int, attrs: bytes) -> bytes:
    return _message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK)


def verdict_batch(queue: int, up_to_id: int) -> bytes:
    return _message(
        NFQNL_MSG_VERDICT_BATCH,
        queue,
        _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, up_to_id)),
    )


def packet_ids(buffer: bytes, errors: list[int] | None = None) -> list[int]:
    """Packet ids of every NFQNL_MSG_PACKET in a netlink datagram.

    Netlink error replies are appended to ``errors`` (as negative errno) when given,
    else raised: during configuration a refusal is fatal; while serving, the kernel
    answers ENOENT to a batch verdict whose packets it no longer holds, which is
    harmless and must not stop the daemon (every later packet would be dropped).
    """
    ids, offset = [], 0
    while offset + 16 <= len(buffer):
        length, msg_type = struct.unpack_from("=IH", buffer, offset)
        if length < 16:
            break
        if msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            attr = offset + 20  # nlmsghdr (16) + nfgenmsg (4)
            end = offset + length
            while attr + 4 <= end:
                alen, akind = struct.unpack_from("=HH", buffer, attr)
                if alen < 4:
                    break
                if akind & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", buffer, attr + 4)[0])
                    break
                attr += (alen + 3) & ~3
        elif msg_type == NLMSG_ERROR:
            code = struct.unpack_from("=i", buffer, offset + 16)[0]
            if code and errors is not None:
                errors.append(code)
            elif code:
                raise OSError(-code, f"nfqueue config refused: {os.strerror(-code)}")
        offset += (length + 3) & ~3
    return ids


class DelayLine:
    """Release times for packet ids: delay ± uniform jitter, never decreasing."""

    def __init__(self, delay_s: float, jitter_s: float, seed: int | None = None) -> None:
        self.delay_s, self.jitter_s = delay_s, jitter_s
        self._rng = random.Random(seed)
        self._pending: collections.deque[tuple[float, int]] = collections.deque()
        self._last_due = 0.0

    def admit(self, packet_id: int, now: float) -> None:
        offset = self._rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        due = max(now + self.delay_s + offset, self._last_due)
        self._last_due = due
        self._pending.append((due, packet_id))

    def pop_due(self, now: float) -> int | None:
        """The highest packet id now due (releasing it and all before it), or None."""
        newest = None
        while self._pending and self._pending[0][0] <= now:
            newest = self._pending.popleft()[1]
        return newest

    def next_due(self) -> float | None:
        return self._pending[0][0] if self._pending else None

    def drain(self) -> int | None:
        newest = self._pending[-1][1] if self._pending else None
        self._pending.clear()
        return newest


def open_queue(queue: int, max_len: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: absorb bursts
    sock.bind((0, 0))
    steps = [
        _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0)),
        _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META) + b"\0\0\0"),
        _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", max_len)),
    ]
    for attrs in steps:
        sock.send(config_message(queue, attrs))
        packet_ids(sock.recv(65536))  # the ACK; raises on refusal
    return sock


def serve(queue: int, delay_s: float, jitter_s: float, max_len: int, seed: int | None) -> int:
    sock = open_queue(queue, max_len)
    line = DelayLine(delay_s, jitter_s, seed)
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # select() restarts after a signal (PEP 475); a wake-up fd makes it return.
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    print("ready", flush=True)
    sock.setblocking(False)
    buffer = bytearray(1 << 16)
    errors: list[int] = []
    unsent: int | None = None  # newest due id whose verdict could not be sent yet
    while not stopping:
        due = line.next_due()
        timeout = None if due is None else max(0.0, due - time.monotonic())
        if unsent is not None:  # retry a verdict the socket refused, soon
            timeout = 0.001 if timeout is None else min(timeout, 0.001)
        try:
            readable, _, _ = select.select([sock, wake_r], [], [], timeout)
        except InterruptedError:
            continue
        if sock in readable:
            for _ in range(256):  # drain what is queued, but keep releasing on time
                try:
                    n = sock.recv_into(buffer)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:  # a lost id is released by the next batch
                        continue
                    raise
                now = time.monotonic()
                for packet_id in packet_ids(memoryview(buffer)[:n].tobytes(), errors):
                    line.admit(packet_id, now)
                if errors:
                    print(f"netlink error replies: {sorted(set(errors))}", flush=True)
                    errors.clear()
        newest = line.pop_due(time.monotonic())
        if newest is not None:
            unsent = newest if unsent is None else max(unsent, newest)
        if unsent is not None:
            try:
                sock.send(verdict_batch(queue, unsent))
                unsent = None
            except (BlockingIOError, InterruptedError):
                pass  # a full socket: the next batch verdict covers these ids too
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
    newest = line.drain()
    if unsent is not None:
        newest = unsent if newest is None else max(unsent, newest)
    if newest is not None:
        sock.send(verdict_batch(queue, newest))
    sock.setblocking(True)
    sock.send(
        config_message(queue, _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_UNBIND, 0, 0)))
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=0, help="nfqueue number to bind")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay (ms)")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform jitter ± (ms)")
    parser.add_argument("--max-len", type=int, default=100000, help="kernel queue length")
    parser.add_argument("--seed", type=int, default=None, help="jitter RNG seed")
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or args.jitter_ms < 0 or args.jitter_ms > args.delay_ms:
        parser.error("need 0 <= jitter-ms <= delay-ms")
    return serve(args.queue, args.delay_ms / 1000, args.jitter_ms / 1000, args.max_len, args.seed)


if __name__ == "__main__":
    sys.exit(main())
