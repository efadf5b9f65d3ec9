"""The PDKV frame: how every message of the KV transfer and the handoff is framed.

A frame is a 20-byte header (magic ``PDKV``, version, type, reserved, room, body
length; big-endian) followed by its body. The sync codec serves the SGLang side
(threads on plain sockets), the asyncio codec the router; both check the same things.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct

MAGIC = b"PDKV"
VERSION = 1
HEADER = struct.Struct("!4sBBHQI")  # magic, version, type, reserved, room, body length
MAX_BODY = 1 << 30  # no frame is larger, whatever its type


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
}


class ProtocolError(ConnectionError):
    """The peer sent something that is not a valid frame."""


def header(kind: MsgType, room: int, length: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, 0, room, length)


def parse_header(
    data: bytes | bytearray, limits: dict[MsgType, int] | None = None
) -> tuple[MsgType, int, int]:
    """(type, room, body length) of a frame header; ProtocolError if it is not one, or
    if its body would exceed its type's limit (``limits`` overrides ``BODY_LIMITS``)."""
    magic, version, kind, _, room, length = HEADER.unpack(data)
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
    return kind, room, length


def frame_size(body_bytes: int) -> int:
    return HEADER.size + body_bytes


# -- sync (sockets, threads) -----------------------------------------------------------


def send_frame(sock: socket.socket, kind: MsgType, room: int, *parts) -> int:
    """Send one frame (header + parts, which may be large buffers); returns bytes sent."""
    length = sum(memoryview(p).nbytes for p in parts)
    sock.sendall(header(kind, room, length))
    for part in parts:
        sock.sendall(part)
    return frame_size(length)


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


def recv_frame(
    sock: socket.socket, on_header=None, limits: dict[MsgType, int] | None = None
) -> tuple[MsgType, int, bytearray]:
    """Read one frame; ``on_header(kind)`` runs once the header is in, before the body."""
    kind, room, length = parse_header(recv_exact(sock, HEADER.size), limits)
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


# -- asyncio (the router) --------------------------------------------------------------


async def write_frame(writer: asyncio.StreamWriter, kind: MsgType, room: int, body: bytes) -> int:
    """Send one frame and wait until it is handed to the kernel; returns bytes sent."""
    writer.write(header(kind, room, len(body)) + body)
    await writer.drain()
    return frame_size(len(body))


async def read_frame(reader: asyncio.StreamReader) -> tuple[MsgType, int, bytes]:
    kind, room, length = parse_header(await reader.readexactly(HEADER.size))
    return kind, room, await reader.readexactly(length)
