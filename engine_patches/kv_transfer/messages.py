"""Wire messages of the tcp KV transfer backend (and the token-ID handoff that shares
its framing): typed, explicitly encoded, versioned.

Every frame is a 20-byte header (magic ``PDKV``, version, type, room, body length)
followed by its body. Integers are big-endian.
"""

from __future__ import annotations

import enum
import socket
import struct
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = b"PDKV"
VERSION = 1
HEADER = struct.Struct("!4sBBHQI")  # magic, version, type, reserved, room, body length
MAX_BODY = 1 << 30


class MsgType(enum.IntEnum):
    TRANSFER_REQUEST = 1  # decode → prefill: where to put the pages
    KV_CHUNK = 2  # prefill → decode: pages for every KV buffer
    AUX = 3  # prefill → decode: the request's metadata row (first token, ...)
    DONE = 4  # prefill → decode: totals, to verify
    ACK = 5  # decode → prefill: all verified and written
    FAILURE = 6  # either way: why the transfer ends
    # token-ID handoff (router ↔ main decode), see engine_patches.handoff.messages
    WATCH = 7  # router → MD: tell me when this room's KV is held
    READY = 8  # MD → router: the prompt's KV is held, the request is parked
    HANDOFF = 9  # router → MD: token ids relay decode generated
    EXTENDED = 10  # MD → router: one extend forward over them is done
    RELEASE = 11  # router → MD: relay decode finished the request; drop it


class ProtocolError(ConnectionError):
    """The peer sent something that is not a valid frame."""


@dataclass(frozen=True)
class TransferRequest:
    decode_prefix_len: int
    aux_index: int
    layout_digest: int  # both sides must have the same KV layout
    dst_pages: np.ndarray  # int32, decode's page ids for the pages it lacks

    _FIXED = struct.Struct("!IiQI")

    def encode(self) -> bytes:
        pages = np.ascontiguousarray(self.dst_pages, dtype=">i4")
        return (
            self._FIXED.pack(self.decode_prefix_len, self.aux_index, self.layout_digest, len(pages))
            + pages.tobytes()
        )

    @classmethod
    def decode(cls, body: bytes) -> TransferRequest:
        prefix, aux, digest, n = cls._FIXED.unpack_from(body)
        pages = np.frombuffer(body, dtype=">i4", count=n, offset=cls._FIXED.size)
        return cls(prefix, aux, digest, pages.astype(np.int32))


@dataclass(frozen=True)
class KvChunkHeader:
    """Pages ``[first, first + count)`` of the transfer's page list; payload follows."""

    first: int
    count: int
    crc32: int

    _FIXED = struct.Struct("!III")
    size = _FIXED.size

    def encode(self) -> bytes:
        return self._FIXED.pack(self.first, self.count, self.crc32)

    @classmethod
    def decode(cls, body: bytes | memoryview) -> KvChunkHeader:
        return cls(*cls._FIXED.unpack_from(body))


@dataclass(frozen=True)
class Done:
    total_pages: int
    total_bytes: int

    _FIXED = struct.Struct("!IQ")

    def encode(self) -> bytes:
        return self._FIXED.pack(self.total_pages, self.total_bytes)

    @classmethod
    def decode(cls, body: bytes) -> Done:
        return cls(*cls._FIXED.unpack(body))


def crc32(parts) -> int:
    value = 0
    for part in parts:
        value = zlib.crc32(part, value)
    return value


def send_frame(sock: socket.socket, kind: MsgType, room: int, *parts) -> int:
    """Send one frame (header + parts, which may be large buffers); returns bytes sent."""
    length = sum(memoryview(p).nbytes for p in parts)
    sock.sendall(HEADER.pack(MAGIC, VERSION, kind, 0, room, length))
    for part in parts:
        sock.sendall(part)
    return HEADER.size + length


def recv_exact(sock: socket.socket, n: int, into: bytearray | None = None) -> bytearray:
    buf = into if into is not None else bytearray(n)
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError(f"peer closed the connection after {got} of {n} bytes")
        got += k
    return buf


def recv_frame(sock: socket.socket, on_header=None) -> tuple[MsgType, int, bytearray]:
    """Read one frame; ``on_header(kind)`` runs once the header is in, before the body."""
    magic, version, kind, _, room, length = HEADER.unpack(recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}: not a pdd-testbed KV transfer peer")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, this side speaks {VERSION}")
    if length > MAX_BODY:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_BODY} limit")
    try:
        kind = MsgType(kind)
    except ValueError as exc:
        raise ProtocolError(f"unknown message type {kind}") from exc
    if on_header is not None:
        on_header(kind)
    return kind, room, recv_exact(sock, length)


def configure_socket(sock: socket.socket, idle_timeout: float) -> None:
    """No Nagle; and a dead path (a cut WAN) is detected within ~``idle_timeout``,
    whether data is in flight (TCP_USER_TIMEOUT) or the connection is idle (keepalive)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(idle_timeout / 3)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(idle_timeout / 6)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(idle_timeout * 1000))
