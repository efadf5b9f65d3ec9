"""The PDKV frame: how every message of the KV transfer and the handoff is framed.

A frame is a 20-byte header (magic ``PDKV``, version, type, flags, room, body
length; big-endian) followed by its body and, when the deployment has a frame key,
a 16-byte tag: HMAC-SHA256 (truncated, as RFC 4868 does) over header and body under
the per-deployment key the harness hands every server and the router (``Env.FRAME_KEY``).
A listener with a key refuses untagged frames and frames whose tag does not verify,
so nobody who merely reaches a KV or handoff port can feed it data. Not covered: an
on-path attacker replaying captured frames (no per-connection nonce), and secrecy
(the bytes are not encrypted). The sync codec serves the SGLang side (threads on
plain sockets), the asyncio codec the router; both check the same things.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import hmac
import os
import socket
import ssl
import struct
import termios
from pathlib import Path

from protocol import clock, tcp
from protocol.env import Env

MAGIC = b"PDKV"
VERSION = 5  # 2: Done carries the sender's threshold at its first chunk; the Window frame
# 3: the Waiting frame; 4: Done carries when the sender's first chunk left; 5: a KV chunk's
# header says whether the sender waited for prefill before it
HEADER = struct.Struct("!4sBBHQI")  # magic, version, type, flags, room, body length
MAX_BODY = 1 << 30  # no frame is larger, whatever its type
TAGGED = 1  # flags: an authentication tag follows the body
TAG_BYTES = 16


class MsgType(enum.IntEnum):
    TRANSFER_REQUEST = 1  # decode → prefill: where to put the pages
    KV_CHUNK = 2  # prefill → decode: pages for every KV buffer
    AUX = 3  # prefill → decode: the request's metadata row (first token, ...)
    DONE = 4  # prefill → decode: totals, to verify
    ACK = 5  # decode → prefill: all verified and written
    FAILURE = 6  # either way: why the transfer ends
    # token-ID handoff (router ↔ main decode), bodies in protocol.handoff
    WATCH = 7  # router → MD: tell me when this room's KV is held
    READY = 8  # MD → router: the prompt's KV is held, the request is parked
    HANDOFF = 9  # router → MD: token ids relay decode generated
    EXTENDED = 10  # MD → router: one extend forward over them is done
    RELEASE = 11  # router → MD: relay decode finished the request; drop it
    WINDOW = 12  # prefill → decode, after the Ack: the connection's congestion state
    WAITING = 13  # prefill → decode, between chunks: still computing (not a stalled wire)


SMALL = 4 << 10
# The largest body each type may carry: a peer's 20-byte header never makes the other
# side allocate more than this (KV chunks: the receiver passes its own, tighter, bound).
BODY_LIMITS: dict[MsgType, int] = {
    MsgType.TRANSFER_REQUEST: 64 << 20,
    MsgType.KV_CHUNK: MAX_BODY,
    MsgType.AUX: 1 << 20,
    MsgType.DONE: SMALL,
    MsgType.ACK: SMALL,
    MsgType.FAILURE: 64 << 10,
    MsgType.WATCH: SMALL,
    MsgType.READY: SMALL,
    MsgType.HANDOFF: 64 << 20,
    MsgType.EXTENDED: SMALL,
    MsgType.RELEASE: 64 << 10,
    MsgType.WINDOW: SMALL,
    MsgType.WAITING: SMALL,
}


class ProtocolError(ConnectionError):
    """The peer sent something that is not a valid frame."""


def _key_from_env() -> bytes | None:
    text = os.environ.get(Env.FRAME_KEY, "")
    try:
        return bytes.fromhex(text) or None
    except ValueError as exc:
        raise SystemExit(f"{Env.FRAME_KEY} must be hex: {exc}") from None


_key: bytes | None = _key_from_env()  # read once: each process has one deployment


def set_frame_key(key: bytes | None) -> None:
    """Use ``key`` (None: no authentication) for the frames this process sends and
    accepts; the servers and router get it from ``Env.FRAME_KEY`` instead."""
    global _key
    _key = key or None


def new_frame_key() -> str:
    """A fresh per-deployment key, hex, for ``Env.FRAME_KEY``."""
    return os.urandom(32).hex()


def read_frame_key(path: Path) -> str:
    """A frame key file's hex key (``testbed key`` writes one); ValueError naming the
    file if it cannot be read or is not one."""
    try:
        text = Path(path).read_text().strip()
        if len(bytes.fromhex(text)) < 16:
            raise ValueError("shorter than 16 bytes")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a frame key ({exc})") from None
    return text


def _mac(head: bytes, parts) -> bytes:
    mac = hmac.new(_key, head, hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()[:TAG_BYTES]


def tag(head: bytes, *parts) -> bytes:
    """The tag that follows a frame's body under this process's key (b"" without one)."""
    return _mac(head, parts) if _key else b""


def _check_tag(head: bytes, body, tag: bytes) -> None:
    if not hmac.compare_digest(_mac(head, (body,)), bytes(tag)):
        raise ProtocolError("frame failed authentication: the peer has another frame key")


def header(kind: MsgType, room: int, length: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, TAGGED if _key else 0, room, length)


def parse_header(
    data: bytes | bytearray, limits: dict[MsgType, int] | None = None
) -> tuple[MsgType, int, int]:
    """(type, room, body length) of a frame header; ProtocolError if it is not one, if
    its body would exceed its type's limit (``limits`` overrides ``BODY_LIMITS``), or
    if it is untagged where this side requires tags (or the reverse)."""
    magic, version, kind, flags, room, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}: not a pdd-testbed KV transfer peer")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, this side speaks {VERSION}")
    try:
        kind = MsgType(kind)
    except ValueError as exc:
        raise ProtocolError(f"unknown message type {kind}") from exc
    cap = min(MAX_BODY, (limits or {}).get(kind, BODY_LIMITS[kind]))
    if length > cap:
        raise ProtocolError(f"{kind.name} frame of {length} bytes exceeds its {cap}-byte limit")
    if _key and not flags & TAGGED:
        raise ProtocolError(f"unauthenticated {kind.name} frame: the peer has no frame key")
    if flags & TAGGED and not _key:
        raise ProtocolError(f"authenticated {kind.name} frame, but this side has no frame key")
    return kind, room, length


def frame_size(body_bytes: int) -> int:
    """Bytes on the wire for a frame with this body (header, body, tag if any)."""
    return HEADER.size + body_bytes + (TAG_BYTES if _key else 0)


# -- sync (sockets, threads) -----------------------------------------------------------


def send_frame(sock: socket.socket, kind: MsgType, room: int, *parts) -> int:
    """Send one frame (header + parts, which may be large buffers); returns bytes sent."""
    length = sum(memoryview(p).nbytes for p in parts)
    head = header(kind, room, length)
    sock.sendall(head)
    for part in parts:
        sock.sendall(part)
    if _key:
        sock.sendall(tag(head, *parts))
    return frame_size(length)


BATCH_MIN_BYTES = 64 * 1024  # a read this large wakes its reader in batches (RcvLowat)


class Arrival:
    """Reads that note when the last bytes they returned reached this host: the kernel's
    stamp where the socket asked for them (``tcp.stamp_arrivals``), else when read."""

    def __init__(self) -> None:
        self.at: float | None = None

    def read(self, sock: socket.socket, view: memoryview) -> int:
        if isinstance(sock, ssl.SSLSocket):
            k = sock.recv_into(view)
            self.at = clock.now()
            return k
        k, ancdata, _, _ = sock.recvmsg_into([view], tcp.ARRIVAL_CMSG_BYTES)
        self.at = tcp.arrival(ancdata) or clock.now()
        return k


def recv_exact(
    sock: socket.socket, n: int, into: bytearray | None = None, arrival: Arrival | None = None
) -> bytearray:
    """Read exactly ``n`` bytes (``arrival``: noting when the last of them came). A large
    read (a KV chunk) asks the kernel to wake it only once a batch of bytes is queued
    (see :class:`RcvLowat`), not once per segment: on a decode server the receiving
    threads otherwise wake thousands of times a second while KV lands, and each wake
    takes the interpreter's lock from the scheduler's forward pass on the same core."""
    buf = into if into is not None else bytearray(n)
    view = memoryview(buf)[:n]
    got = 0
    lowat = RcvLowat(sock) if n >= BATCH_MIN_BYTES else None
    batch = True  # wait for a batch (off for the read after a batch timed out)
    try:
        while got < n:
            if lowat is not None and batch:
                lowat.expect(n - got)
            batch = True
            try:
                if arrival is None:
                    k = sock.recv_into(view[got:], n - got)
                else:
                    k = arrival.read(sock, view[got:])
            except TimeoutError:
                # no batch within the timeout: a stall only if not a byte is queued;
                # else what is queued is read at once
                if lowat is None or not lowat.queued():
                    raise
                lowat.off()
                batch = False
                continue
            if k == 0:
                raise ConnectionResetError(f"peer closed the connection after {got} of {n} bytes")
            got += k
    finally:
        if lowat is not None:
            lowat.off()
    return buf


class RcvLowat:
    """SO_RCVLOWAT for one read: the socket reads as ready (and a blocking read returns)
    only once this many bytes are queued, or the stream ended. Capped at a quarter of
    the receive buffer: never more sits unread, so the window TCP advertises, and
    hence the sender's pace, hardly changes (Linux grows the buffer, and raises the
    window clamp with it, for a mark above half of it). TLS sockets are left alone
    (their records carry more bytes than the plaintext asked for)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = None if isinstance(sock, ssl.SSLSocket) else sock
        self.mark = 1

    def expect(self, n: int) -> None:
        if self.sock is None:
            return
        try:
            cap = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
            self._set(max(1, min(n, cap)))
        except OSError:
            self.sock = None  # not a TCP socket the kernel lets us tune: read as before

    def queued(self) -> bool:
        """Whether any byte is waiting in the receive queue."""
        if self.sock is None:
            return False
        try:
            raw = fcntl.ioctl(self.sock, termios.FIONREAD, b"\0" * 4)
            return struct.unpack("i", raw)[0] > 0
        except OSError:
            return False

    def off(self) -> None:
        if self.sock is not None and self.mark != 1:
            with contextlib.suppress(OSError):
                self._set(1)

    def _set(self, mark: int) -> None:
        if mark != self.mark:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
            self.mark = mark


def recv_frame(
    sock: socket.socket,
    on_header=None,
    limits: dict[MsgType, int] | None = None,
    on_body=None,
) -> tuple[MsgType, int, bytearray]:
    """Read one frame; ``on_header(kind, arrived)`` runs once the header is in, before
    the body, with when its first bytes reached this host (see :func:`_recv_head`), and
    ``on_body(kind, arrived)`` once the body is, with when its last bytes did."""
    if on_header is None:
        head = bytes(recv_exact(sock, HEADER.size))
        kind, room, length = parse_header(head, limits)
    else:
        head, arrived = _recv_head(sock)
        kind, room, length = parse_header(head, limits)
        on_header(kind, arrived)
    arrival = Arrival() if on_body is not None else None
    body = recv_exact(sock, length, arrival=arrival)
    if arrival is not None:
        on_body(kind, arrival.at if length else None)
    if _key:
        _check_tag(head, body, recv_exact(sock, TAG_BYTES))
    return kind, room, body


def _recv_head(sock: socket.socket) -> tuple[bytes, float]:
    """A frame header, and when (records' clock) its first bytes reached this host: the
    kernel's stamp where the socket asked for them (``tcp.stamp_arrivals``), else the
    time it was read (TLS, or no stamp)."""
    if isinstance(sock, ssl.SSLSocket):
        return bytes(recv_exact(sock, HEADER.size)), clock.now()
    data, ancdata, _, _ = sock.recvmsg(HEADER.size, tcp.ARRIVAL_CMSG_BYTES)
    if not data:
        raise ConnectionResetError("peer closed the connection before a frame header")
    arrived = tcp.arrival(ancdata) or clock.now()
    if len(data) < HEADER.size:
        data += bytes(recv_exact(sock, HEADER.size - len(data)))
    return data, arrived


# -- asyncio (the router) --------------------------------------------------------------


async def write_frame(writer: asyncio.StreamWriter, kind: MsgType, room: int, body: bytes) -> int:
    """Send one frame and wait until it is handed to the kernel; returns bytes sent."""
    head = header(kind, room, len(body))
    writer.write(head + body + tag(head, body))
    await writer.drain()
    return frame_size(len(body))


async def read_frame(reader: asyncio.StreamReader) -> tuple[MsgType, int, bytes]:
    head = await reader.readexactly(HEADER.size)
    kind, room, length = parse_header(head)
    body = await reader.readexactly(length)
    if _key:
        _check_tag(head, body, await reader.readexactly(TAG_BYTES))
    return kind, room, body
