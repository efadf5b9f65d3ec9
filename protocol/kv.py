"""Bodies of the KV transfer frames (framing: :mod:`protocol.frames`)."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from dataclasses import dataclass

import numpy as np


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


def common_prefix(a, b) -> int:
    """How many leading tokens two prompts share: the KV one's decode can reuse of the
    other's (token id sequences: arrays or lists)."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def holds_back(
    prompt, cached: int, on_its_way: list, page_size: int = 1, arrived: list = ()
) -> tuple[int, int]:
    """Whether decode holds a request back for another's KV on its way to it
    (``on_its_way``: their prompts; ``arrived``: prompts whose KV is here, not yet in the
    prefix cache, listed after them): the tokens of ``prompt`` beyond the ``cached`` ones
    it would then hold, and which transfer it waits for; else (0, -1).

    It waits where, under a fair share of the line, waiting for the other's KV and then
    sending its own rest ends no later than sending all it lacks beside the other: with
    the other's whole lack still to go (at most its prompt beyond ``cached``) that is
    whenever the other lacks no more than this one lacks plus what it brings (beside one
    carrying more, a transfer ends after twice its own bytes). And what it brings is a
    page and a quarter of what this one lacks at least: below that, waiting saves little
    against the other's timing, which no one knows (it may stall on the wire).
    Hetero run 061253: a turn lacking 2,976 tokens, 1,440 of them coming in its
    session's previous turn, sent its 24 MB beside that one's 11.8 MB on a new
    connection (2,330 retransmissions), and the other stalled 89 s (the rule was half).
    (engine_patches.kv_transfer.prefix_wait; the router mirrors it.)"""
    lack = len(prompt) - cached
    best, extra = -1, 0
    for i, other in enumerate([*on_its_way, *arrived]):
        brings = common_prefix(prompt, other) - cached
        others_lack = 0 if i >= len(on_its_way) else len(other) - cached
        if brings > extra and others_lack <= lack + brings:
            best, extra = i, brings
    if extra >= max(page_size, 1) and 4 * extra >= lack:
        return extra, best
    return 0, -1


# KV connections are pooled per decode server and prefill (a warm congestion window: no
# slow start per request on a long-RTT WAN). Decode reuses the warmest connection (the
# largest window its sender reported: its Window frame, else its Done frame; then the
# one returned last) idle less than this;
# prefill closes one idle twice as long. The default of
# ``servers.kv_pool_reuse_s``, dilated under emulation as the other KV timeouts are.
POOL_REUSE_S = 30.0
# The other defaults a deployment passes its servers (servers.kv_*; dilated likewise):
IDLE_TIMEOUT_S = 30.0  # a transfer that makes no progress this long fails (a cut WAN)
LATE_LEG_S = 10.0  # dual path: main decode's request may come this long after relay decode's
MAX_FRAME_BYTES = 8 << 20  # a KV chunk's payload: bounds memory per frame, shows progress
# servers.kv_line_share: prefill's senders across the WAN together send at this share of
# the line's rate (IP/TCP headers are 3.6% at MTU 1500, and the shaper has its own); the
# router's model of the line runs at it too
LINE_SHARE_HEADROOM = 0.9


def rows_per_chunk(bytes_per_row: int) -> int:
    """Pages per KV chunk (one at least, however large a page is)."""
    return max(1, MAX_FRAME_BYTES // bytes_per_row)


def max_chunk_body(bytes_per_row: int) -> int:
    """The largest KV_CHUNK body a sender with this page size sends."""
    return KvChunkHeader.size + rows_per_chunk(bytes_per_row) * bytes_per_row


@dataclass(frozen=True)
class KvChunkHeader:
    """Pages ``[first, first + count)`` of the transfer's page list; payload follows.
    ``after_wait`` (1): the sender waited for prefill to compute this chunk after it had
    sent the one before, so the wire idled between them (the receiver measures how long
    from its own arrival stamps: ``TransferRecord.wire_gap_s``)."""

    first: int
    count: int
    crc32: int
    after_wait: int = 0

    _FIXED = struct.Struct("!IIIB")
    size = _FIXED.size

    def encode(self) -> bytes:
        return self._FIXED.pack(self.first, self.count, self.crc32, self.after_wait)

    @classmethod
    def decode(cls, body: bytes | memoryview) -> KvChunkHeader:
        return cls(*cls._FIXED.unpack_from(body))


@dataclass(frozen=True)
class Done:
    total_pages: int
    total_bytes: int
    # Seconds the wire idled, after the first chunk, while the sender waited for prefill
    # to compute the next (from when all it had sent was acknowledged): the receiver's
    # first-to-last-byte time less this is the wire's.
    sender_wait_s: float = 0.0
    # The sender's TCP state (protocol.tcp.tcp_state): its congestion window when the
    # first chunk left, the segments it retransmitted until this frame, its window and
    # slow start threshold now (where the connection's next transfer starts), and its
    # slow start threshold when the first chunk left (0: none, still in slow start).
    cwnd_bytes: int = 0
    retransmits: int = 0
    cwnd_end_bytes: int = 0
    ssthresh_end_bytes: int = 0
    ssthresh_bytes: int = 0
    # When the sender's first chunk left (``protocol.clock``; 0: none). The receiver's
    # log line has it, so a request's record joined before the sender's own line (written
    # once its connection settled, up to 2 s after the Ack) still has prefill's stamp.
    sender_first_byte: float = 0.0
    # When prefill had computed the prompt: its last KV chunk queued for sending (0:
    # unknown). A room that starts early (P->MD) computes before decode asks; past this
    # its KV waited for decode to ask (decode held the request back, or queued it).
    sender_computed: float = 0.0

    _FIXED = struct.Struct("!IQdIIIIIdd")

    @classmethod
    def of_sender(cls, pages: int, record) -> Done:
        """The frame a sender's ``protocol.records.TransferRecord`` ends with."""
        r = record
        return cls(
            pages,
            r.kv_bytes,
            r.sender_wait_s,
            r.cwnd_bytes,
            r.retransmits,
            r.cwnd_end_bytes,
            r.ssthresh_end_bytes,
            r.ssthresh_bytes,
            r.first_byte or 0.0,
            r.computed or 0.0,
        )

    def encode(self) -> bytes:
        return self._FIXED.pack(*dataclasses.astuple(self))

    @classmethod
    def decode(cls, body: bytes) -> Done:
        return cls(*cls._FIXED.unpack(body))


@dataclass(frozen=True)
class Window:
    """The sender's congestion window and slow start threshold (0: none) once the
    receiver's Ack came back: every byte acknowledged and every loss recovered, where the
    Done frame's were read with the last windows still in flight. Sent after the Ack;
    decode ranks its pooled connections by it (the Done frame's until it arrives)."""

    cwnd_bytes: int
    ssthresh_bytes: int = 0

    _FIXED = struct.Struct("!II")

    def encode(self) -> bytes:
        return self._FIXED.pack(self.cwnd_bytes, self.ssthresh_bytes)

    @classmethod
    def decode(cls, body: bytes) -> Window:
        return cls(*cls._FIXED.unpack(body))


def crc32(parts) -> int:
    value = 0
    for part in parts:
        value = zlib.crc32(part, value)
    return value
