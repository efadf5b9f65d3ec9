"""Hand-made PDKV frames for the malformed-frame tests, and the check every listener
must pass: a connection that sent one is closed, soon."""

from __future__ import annotations

import contextlib
import socket
import time

from protocol import frames
from protocol.frames import HEADER, MAGIC, TAGGED, VERSION
from protocol.kv import KvChunkHeader, crc32


def frame(kind: int, room: int, body: bytes, length: int | None = None) -> bytes:
    """A frame header (a ``length`` that may lie about the body), the body, and the tag
    under this process's frame key (the deployment's): a peer that holds the key."""
    n = len(body) if length is None else length
    flags = TAGGED if frames.tag(b"") else 0
    head = HEADER.pack(MAGIC, VERSION, kind, flags, room, n)
    return head + body + frames.tag(head, body)


def untagged(kind: int, room: int, body: bytes) -> bytes:
    """A well-formed frame from a peer without the key: no tag."""
    return HEADER.pack(MAGIC, VERSION, kind, 0, room, len(body)) + body


def forged(kind: int, room: int, body: bytes) -> bytes:
    """A frame that claims a tag it cannot make (another key's, or none at all)."""
    head = HEADER.pack(MAGIC, VERSION, kind, TAGGED, room, len(body))
    return head + body + bytes(frames.TAG_BYTES)


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
