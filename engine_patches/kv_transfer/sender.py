"""Prefill side: one ``TcpKVSender`` per request.

Lifecycle (``poll()``)::

    Bootstrapping ──decode's TransferRequest claimed──▶ WaitingForInput
        │ (none within the bootstrap timeout)              │ init(); send(pages)…
        ▼                                                  ▼
      Failed ◀── reset / timeout / abort / bad count ── Transferring ──Ack──▶ Success

``send()`` is called on the scheduler thread and only queues; a worker thread reads
the pages from the pool, frames and checksums them, and writes the socket.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import numpy as np
from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll, KVTransferMetric

from engine_patches.kv_transfer.manager import Incoming, TcpKVManager
from engine_patches.kv_transfer.messages import (
    Done,
    KvChunkHeader,
    MsgType,
    ProtocolError,
    crc32,
    recv_frame,
    send_frame,
)
from engine_patches.kv_transfer.transfer_log import TransferRecord

logger = logging.getLogger("pdd.kv_transfer")
MAX_FRAME_BYTES = 8 << 20  # bounds memory per frame and keeps progress visible


class KVTransferError(RuntimeError):
    """Why a KV transfer failed; SGLang reports it to the client."""


class TcpKVSender(BaseKVSender):
    def __init__(
        self,
        mgr: TcpKVManager,
        bootstrap_addr: str,
        bootstrap_room: int,
        req_has_disagg_prefill_dp_rank: bool = False,
    ) -> None:
        self.kv_mgr = mgr
        self.room = bootstrap_room
        self._state = KVPoll.Bootstrapping
        self._reason: str | None = None
        self._created = time.monotonic()
        self._incoming: Incoming | None = None
        self._num_pages: int | None = None
        self._aux_index: int | None = None
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._record: TransferRecord | None = None
        self._released = False  # the connection went back to the manager for reuse
        self._lock = threading.Lock()

    # -- state ----------------------------------------------------------------------
    def poll(self) -> KVPoll:
        if self._state == KVPoll.Bootstrapping:
            self._incoming = self.kv_mgr.claim(self.room)
            if self._incoming is not None:
                self._state = KVPoll.WaitingForInput
            elif time.monotonic() - self._created > self.kv_mgr.timeouts.bootstrap:
                self._fail(
                    f"decode never requested room {self.room} within "
                    f"{self.kv_mgr.timeouts.bootstrap:.0f} s"
                )
        return self._state

    def poll_pp_consensus(self) -> KVPoll:
        return self.poll()

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._state in (KVPoll.Success, KVPoll.Failed):
                return
            self._state, self._reason = KVPoll.Failed, reason
        logger.warning("tcp KV transfer room %d failed: %s", self.room, reason)
        if self._incoming is not None and not self._released:
            with contextlib.suppress(OSError):
                send_frame(self._incoming.conn, MsgType.FAILURE, self.room, reason.encode())
            self._incoming.conn.close()
        self._finish_record("failed", reason)

    def failure_exception(self):
        raise KVTransferError(self._reason or "KV transfer failed")

    # -- SGLang's sender surface ----------------------------------------------------
    def pop_decode_prefix_len(self) -> int:
        return self._incoming.request.decode_prefix_len if self._incoming else 0

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        self._num_pages, self._aux_index = num_kv_indices, aux_index
        incoming = self._incoming
        if incoming is None:
            self._fail("init() before decode's transfer request arrived")
            return
        if num_kv_indices != len(incoming.request.dst_pages):
            self._fail(
                f"prefill will send {num_kv_indices} pages but decode allocated "
                f"{len(incoming.request.dst_pages)}"
            )
            return
        self._record = TransferRecord(
            room=self.room,
            side="prefill",
            peer=incoming.peer,
            start=time.time(),
            decode_prefix_len=incoming.request.decode_prefix_len,
            page_size=self.kv_mgr.page_size,
        )
        self._worker = threading.Thread(
            target=self._run, name=f"pdd-kv-send-{self.room}", daemon=True
        )
        self._worker.start()

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk  # the last chunk carries aux and Done

    def send(self, kv_indices: np.ndarray, state_indices=None, num_kv_tokens=None, **_) -> None:
        last = state_indices is not None  # SGLang passes state indices on the last chunk only
        if last and any(s is not None for s in state_indices):
            self._fail("state buffers cannot be sent by the tcp backend")
            return
        aux = None
        if last and self._aux_index is not None:
            # Snapshot now: the metadata row was just written for this request.
            aux = [row.clone() for row in self.kv_mgr.aux.read(np.array([self._aux_index]))]
        self._queue.put((np.array(kv_indices, dtype=np.int64, copy=True), last, aux))

    def get_transfer_metric(self) -> KVTransferMetric:
        r = self._record
        if r is None or r.end is None:
            return KVTransferMetric()
        return KVTransferMetric(transfer_latency_s=r.end - r.start, transfer_total_bytes=r.kv_bytes)

    def abort(self) -> None:
        self._fail("aborted on the prefill server")

    def clear(self) -> None:
        if self._incoming is not None and not self._released:
            self._incoming.conn.close()

    # -- worker -----------------------------------------------------------------------
    def _run(self) -> None:
        conn = self._incoming.conn
        conn.settimeout(self.kv_mgr.timeouts.idle)
        sent = 0
        try:
            while self._state != KVPoll.Failed:
                try:
                    pages, last, aux = self._queue.get(timeout=self.kv_mgr.timeouts.first_data)
                except queue.Empty:
                    raise TimeoutError("no KV chunk came from the scheduler") from None
                self._state = KVPoll.Transferring
                sent = self._send_pages(conn, pages, sent)
                if last:
                    if sent != self._num_pages:
                        raise KVTransferError(f"sent {sent} pages, expected {self._num_pages}")
                    if aux is not None:
                        parts = [t.numpy() for t in aux]
                        self._record.wire_bytes += send_frame(
                            conn, MsgType.AUX, self.room, crc32(parts).to_bytes(4, "big"), *parts
                        )
                    done = Done(sent, self._record.kv_bytes).encode()
                    self._record.wire_bytes += send_frame(conn, MsgType.DONE, self.room, done)
                    kind, _, body = recv_frame(conn)
                    if kind == MsgType.FAILURE:
                        raise KVTransferError(f"decode refused: {body.decode(errors='replace')}")
                    if kind != MsgType.ACK:
                        raise ProtocolError(f"expected Ack, got {kind.name}")
                    with self._lock:
                        if self._state != KVPoll.Failed:
                            self._state = KVPoll.Success
                    self._finish_record("success", None)
                    self._released = True
                    self.kv_mgr.reuse_connection(conn, self._incoming.peer)
                    return
        except (OSError, KVTransferError, ProtocolError) as exc:
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = f"transfer to {self._incoming.peer} stalled: {reason}"
            self._fail(reason)

    def _send_pages(self, conn, pages: np.ndarray, first: int) -> int:
        per_frame = max(1, MAX_FRAME_BYTES // self.kv_mgr.pool.bytes_per_row)
        for start in range(0, len(pages), per_frame):
            part = pages[start : start + per_frame]
            payload = [t.numpy() for t in self.kv_mgr.pool.read(part)]
            if self._record.first_byte is None:
                self._record.first_byte = time.time()
            header = KvChunkHeader(first + start, len(part), crc32(payload)).encode()
            self._record.wire_bytes += send_frame(
                conn, MsgType.KV_CHUNK, self.room, header, *payload
            )
            self._record.kv_bytes += sum(p.nbytes for p in payload)
            self._record.pages += len(part)
        return first + len(pages)

    def _finish_record(self, status: str, reason: str | None) -> None:
        record = self._record
        if record is None or record.end is not None:
            return
        record.end, record.status, record.reason = time.time(), status, reason
        self.kv_mgr.log.write(record)
