"""Decode side: one ``TcpKVReceiver`` per request.

Lifecycle (``poll()``)::

    Bootstrapping ──init()──▶ WaitingForInput ──send_metadata()──▶ Transferring
                                                                   │ connect, request,
                                                                   │ write pages as they come
          Failed ◀── refused / reset / timeout / bad checksum ─────┤
                                                                   └─ Done verified, Ack ──▶ Success

A thread per transfer owns the connection; it writes each verified chunk straight into
the pages decode preallocated, and the aux row into the request's metadata slot.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

import numpy as np
from sglang.srt.disaggregation.base.conn import BaseKVReceiver, KVPoll

from engine_patches.kv_transfer.manager import TcpKVManager
from engine_patches.kv_transfer.sender import KVTransferError
from protocol import clock
from protocol.frames import (
    MsgType,
    ProtocolError,
    frame_size,
    recv_frame,
    send_frame,
)
from protocol.kv import Done, KvChunkHeader, TransferRequest, crc32, max_chunk_body
from protocol.records import TransferRecord
from protocol.tcp import configure_socket, quiet_for, stamp_arrivals

logger = logging.getLogger("pdd.kv_transfer")


class WireGaps:
    """How long the wire idled before the KV chunks the sender flagged as sent after a
    wait for prefill (``KvChunkHeader.after_wait``), from this host's arrival stamps:
    each flagged chunk's first byte less the last byte of the chunk before it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._first: float | None = None  # this chunk's first byte in
        self._last: list[float | None] = [None, None]  # the chunk before's, and this one's

    def head(self, arrived: float) -> None:
        self._first = arrived

    def end(self, arrived: float | None) -> None:
        self._last = [self._last[1], arrived]

    def chunk(self, after_wait: bool) -> float:
        """A chunk is in (its header read, then its body): the idle so far."""
        before = self._last[0]
        if after_wait and before is not None and self._first is not None:
            self.seconds += max(0.0, self._first - before)
        return self.seconds


class TcpKVReceiver(BaseKVReceiver):
    supports_host_destination = False
    require_staging = False

    def __init__(self, mgr: TcpKVManager, bootstrap_addr: str, bootstrap_room: int | None = None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.abort_notified = False
        self.bootstrap_infos: list = []
        self._state = KVPoll.Bootstrapping
        self._reason: str | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.chunked = False  # a KV chunk of it has begun to arrive

    def still_coming(self, quiet_s: float) -> bool:
        """Whether this KV is here or on its way and not stalled: not failed, and either
        arrived (SGLang merges it into the prefix cache next), prefill has sent none of it
        yet (still computing, or busy with another prompt), or data reached its
        connection within ``quiet_s`` (a chunk is up to 8 MB: the kernel's count, not
        the frames', says whether the wire moves)."""
        if self._state == KVPoll.Failed:
            return False
        sock = self._sock
        if self._state != KVPoll.Transferring or not self.chunked or sock is None:
            return True
        quiet = quiet_for(sock)
        return quiet is None or quiet < quiet_s

    @property
    def conclude_state(self):
        return self._state if self._state in (KVPoll.Success, KVPoll.Failed) else None

    def init(self, prefill_dp_rank: int = 0) -> None:
        if self._state == KVPoll.Bootstrapping:
            self._state = KVPoll.WaitingForInput

    def poll(self) -> KVPoll:
        return self._state

    def send_metadata(
        self,
        kv_indices,
        aux_index=None,
        state_indices=None,
        decode_prefix_len=None,
        destination=None,
        **_,
    ) -> None:
        if state_indices and any(s is not None for s in state_indices):
            self._fail("state buffers cannot be received by the tcp backend")
            return
        request = TransferRequest(
            int(decode_prefix_len or 0),
            -1 if aux_index is None else aux_index,
            self.kv_mgr.layout,
            np.asarray(kv_indices, dtype=np.int32),
        )
        self._state = KVPoll.Transferring
        self._thread = threading.Thread(
            target=self._run, args=(request,), name=f"pdd-kv-recv-{self.room}", daemon=True
        )
        self._thread.start()

    def failure_exception(self):
        raise KVTransferError(self._reason or "KV transfer failed")

    def abort(self) -> None:
        self._fail("aborted on the decode server")

    def ensure_abort_notified(self, *, force_arm: bool = False) -> None:
        """Nothing to wait for: closing the connection stops the prefill's writes."""

    def is_abort_release_safe(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def clear(self) -> None:
        sock = self._sock
        if sock is not None:
            sock.close()

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._state in (KVPoll.Success, KVPoll.Failed):
                return
            self._state, self._reason = KVPoll.Failed, reason
        logger.warning("tcp KV transfer room %s failed: %s", self.room, reason)
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                send_frame(sock, MsgType.FAILURE, self.room or 0, reason.encode())
            sock.close()

    # -- worker -----------------------------------------------------------------------
    def _run(self, request: TransferRequest) -> None:
        mgr = self.kv_mgr
        record = TransferRecord(
            room=self.room,
            side="decode",
            peer=self.bootstrap_addr,
            start=clock.now(),
            decode_prefix_len=request.decode_prefix_len,
            page_size=mgr.page_size,
        )
        pages = request.dst_pages
        progress = {"frames": 0, "pages": 0}
        try:
            for attempt in range(2):
                reused = self._connect(attempt)
                if self._state == KVPoll.Failed:  # aborted while connecting
                    return
                try:
                    self._exchange(request, record, progress)
                    return
                except OSError as exc:
                    # A pooled connection that died while idle (peer closed, or keepalive
                    # gave up during a WAN cut): retry once on a new connection, if
                    # nothing of this transfer arrived yet. A plain socket timeout
                    # (errno None) is a real stall and is not retried.
                    dead = isinstance(exc, ConnectionError) or exc.errno is not None
                    if not reused or progress["frames"] or not dead:
                        raise
                    self._sock.close()
        except TimeoutError as exc:
            received = progress["pages"]
            self._fail(
                f"KV transfer from {self.bootstrap_addr} stalled "
                f"after {received}/{len(pages)} pages ({exc or 'timed out'})"
            )
        except Exception as exc:  # malformed frames too: the transfer fails, never the thread
            received = progress["pages"]
            self._fail(
                f"KV transfer from {self.bootstrap_addr} failed after "
                f"{received}/{len(pages)} pages: {exc}"
            )
        finally:
            if record.status != "success":
                record.status, record.reason = "failed", self._reason
                if self._sock is not None:
                    self._sock.close()
            record.end = clock.now()
            mgr.log.write(record)

    def _connect(self, attempt: int) -> bool:
        """A pooled connection on the first attempt if there is one; True if reused."""
        timeouts = self.kv_mgr.timeouts
        pool = self.kv_mgr.conns
        sock = pool.checkout(self.bootstrap_addr, self.room) if attempt == 0 else None
        if sock is None:
            host, port = self.bootstrap_addr.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=timeouts.connect)
            configure_socket(sock, timeouts.idle)
            stamp_arrivals(sock)  # first and last byte: when they arrived, not when read
            if self.kv_mgr.tls_client is not None:  # servers.tls: verify prefill's cert
                sock = self.kv_mgr.tls_client.wrap_socket(sock)
            self._sock = sock
            pool.opened(self.bootstrap_addr, self.room, sock)
            return False
        self._sock = sock
        return True

    def _exchange(self, request: TransferRequest, record: TransferRecord, progress: dict) -> None:
        """Send the request, write every chunk as it arrives, verify, Ack."""
        mgr, timeouts, sock = self.kv_mgr, self.kv_mgr.timeouts, self._sock
        pages = request.dst_pages
        record.wire_bytes += send_frame(sock, MsgType.TRANSFER_REQUEST, self.room, request.encode())
        sock.settimeout(timeouts.first_data)  # prefill may still be computing

        gaps = WireGaps()

        def mark_arrival(kind: MsgType, arrived: float) -> None:
            progress["frames"] += 1
            if kind == MsgType.KV_CHUNK:
                record.first_byte = record.first_byte or arrived
                gaps.head(arrived)
                self.chunked = True
            elif kind == MsgType.DONE:
                record.last_byte = arrived

        def mark_end(kind: MsgType, arrived: float | None) -> None:
            if kind == MsgType.KV_CHUNK:
                gaps.end(arrived)

        limits = {MsgType.KV_CHUNK: max_chunk_body(mgr.pool.bytes_per_row)}
        while True:
            kind, _, body = recv_frame(sock, mark_arrival, limits, on_body=mark_end)
            if kind == MsgType.WINDOW:  # the last transfer's, come after its checkout
                continue
            sock.settimeout(timeouts.idle)
            record.wire_bytes += frame_size(len(body))
            if kind == MsgType.WAITING:  # prefill still computes: the wire is alive
                continue
            view = memoryview(body)
            if kind == MsgType.KV_CHUNK:
                if len(view) < KvChunkHeader.size:
                    raise ProtocolError(f"a KV chunk of {len(view)} bytes has no header")
                head = KvChunkHeader.decode(view)
                payload = view[KvChunkHeader.size :]
                if len(payload) != head.count * mgr.pool.bytes_per_row:
                    raise ProtocolError(
                        f"a KV chunk of {head.count} pages carries {len(payload)} bytes, "
                        f"not {head.count * mgr.pool.bytes_per_row}"
                    )
                if crc32([payload]) != head.crc32:
                    raise ProtocolError(f"checksum mismatch in pages {head.first}..")
                if head.first + head.count > len(pages):
                    raise ProtocolError("chunk beyond the pages decode allocated")
                mgr.pool.write(pages[head.first : head.first + head.count], payload)
                record.wire_gap_s = gaps.chunk(bool(head.after_wait))
                progress["pages"] += head.count
                record.pages += head.count
                record.kv_bytes += len(payload)
            elif kind == MsgType.AUX:
                if crc32([view[4:]]) != int.from_bytes(view[:4], "big"):
                    raise ProtocolError("checksum mismatch in the metadata row")
                if request.aux_index >= 0:
                    mgr.aux.write(np.array([request.aux_index]), view[4:])
            elif kind == MsgType.DONE:
                done = Done.decode(bytes(body))
                # the sender's count or the receiver's stamps, whichever saw more of it
                record.sender_wait_s = max(done.sender_wait_s, record.wire_gap_s)
                record.cwnd_bytes, record.retransmits = done.cwnd_bytes, done.retransmits
                record.ssthresh_bytes = done.ssthresh_bytes
                record.cwnd_end_bytes = done.cwnd_end_bytes
                record.ssthresh_end_bytes = done.ssthresh_end_bytes
                record.sender_first_byte = done.sender_first_byte or None
                record.computed = done.sender_computed or None
                received = progress["pages"]
                if done.total_pages != received or received != len(pages):
                    raise ProtocolError(
                        f"received {received} pages, prefill sent "
                        f"{done.total_pages}, decode expected {len(pages)}"
                    )
                send_frame(sock, MsgType.ACK, self.room)
                with self._lock:
                    if self._state != KVPoll.Failed:
                        self._state = KVPoll.Success
                record.status = "success"
                self._sock = None
                end = record.cwnd_end_bytes, record.ssthresh_end_bytes
                mgr.conns.checkin(self.bootstrap_addr, sock, *end, room=self.room)
                return
            elif kind == MsgType.FAILURE:
                raise KVTransferError(f"prefill reported: {body.decode(errors='replace')}")
            else:
                raise ProtocolError(f"unexpected {kind.name} from prefill")
