"""Hand-made PDKV frames for the malformed-frame tests, and the check every listener
must pass: a connection that sent one is closed, soon."""

from __future__ import annotations

import contextlib
import socket
import time

from protocol.frames import HEADER, MAGIC, VERSION
from protocol.kv import KvChunkHeader, crc32


def frame(kind: int, room: int, body: bytes, length: int | None = None) -> bytes:
    """A frame header (a ``length`` that may lie about the body) and the body."""
    n = len(body) if length is None else length
    return HEADER.pack(MAGIC, VERSION, kind, 0, room, n) + body


def chunk(first: int, count: int, payload: bytes, crc: int | None = None) -> bytes:
    return KvChunkHeader(first, count, crc32([payload]) if crc is None else crc).encode() + payload


def assert_closed_soon(address: tuple[str, int], raw: bytes, within_s: float = 10.0) -> None:
    """Send ``raw`` to a listener; it answers (a FAILURE frame, say) and closes the
    connection within ``within_s``, or just closes it."""
    with socket.create_connection(address, timeout=within_s) as s:
        s.sendall(raw)
        s.settimeout(within_s)
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while s.recv(4096):
                pass
        assert time.monotonic() - started < within_s, raw[:40]
