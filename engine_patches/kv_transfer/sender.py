"""Prefill side: one ``TcpKVSender`` per request, feeding one or two destinations.

Lifecycle (``poll()``)::

    Bootstrapping ──a decode's TransferRequest claimed──▶ WaitingForInput
      (an early-start room: at once)
        │ (none within the bootstrap timeout)                 │ init(); send(pages)…
        ▼                                                     ▼
      Failed ◀── every leg failed ──────────────────── Transferring ──every leg ended,
                                                                        one Acked──▶ Success

Each destination is a *leg* with its own connection, worker thread and record. A plain
room has one leg. A dual-path room (``protocol.rooms.is_dual_path``: PDD's relay decode over
the LAN and main decode over the WAN) has two, fed from the same ``send()`` calls;
SGLang is asked to offer every page (prefix length 0) and each leg skips the pages
its own destination already holds. A leg that joins late gets every chunk so far
replayed; one that has not joined ``late_leg`` seconds after the first gives up, and
the manager refuses its room from then on. One leg failing (a cut WAN) does not fail
the request as long as the other succeeds. An early-start room
(``protocol.rooms.starts_early``: PDD's P->MD) has one leg that may join after the
prefill computed: its chunks are queued, every page offered, and replayed when it joins
(within the bootstrap timeout).

``send()`` is called on the scheduler thread and only queues.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import numpy as np
from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll, KVTransferMetric

from engine_patches.kv_transfer.line_share import SHARE_POLL_S, LineShare
from engine_patches.kv_transfer.manager import Incoming, TcpKVManager
from protocol import clock
from protocol.frames import MsgType, ProtocolError, recv_frame, send_frame
from protocol.kv import Done, KvChunkHeader, Window, crc32, rows_per_chunk
from protocol.records import TransferRecord
from protocol.rooms import legs_expected, starts_early
from protocol.tcp import Chrono, pacing_cap, settled_state, tcp_state, wire_idle_from

logger = logging.getLogger("pdd.kv_transfer")


class KVTransferError(RuntimeError):
    """Why a KV transfer failed; SGLang reports it to the client."""


class _Leg:
    """One destination of a transfer: its connection, queue, worker and record."""

    def __init__(self, sender: TcpKVSender, incoming: Incoming) -> None:
        self.sender = sender
        self.incoming = incoming
        self.queue: queue.Queue = queue.Queue()
        self.state = "pending"  # pending | success | failed
        self.reason: str | None = None
        self.released = False  # the connection is not the leg's to close (reused or closed)
        self.record: TransferRecord | None = None
        self.skip = 0  # leading pages of the send stream this destination already holds
        self.after_wait = False  # it waited for prefill since its last chunk went
        self._retransmitted = 0  # the connection's retransmissions before this transfer
        self._chrono = Chrono()  # the connection's sending times before this transfer

    @property
    def request(self):
        return self.incoming.request

    def start(self, num_pages: int, sglang_prefix_pages: int) -> None:
        mgr = self.sender.kv_mgr
        own_prefix = self.request.decode_prefix_len // mgr.page_size
        self.skip = own_prefix - sglang_prefix_pages
        self.record = TransferRecord(
            room=self.sender.room,
            side="prefill",
            peer=self.incoming.peer,
            start=clock.now(),
            decode_prefix_len=self.request.decode_prefix_len,
            page_size=mgr.page_size,
        )
        wanted = num_pages - self.skip
        if self.skip < 0 or wanted != len(self.request.dst_pages):
            self.fail(
                f"prefill will send {wanted} pages but decode allocated "
                f"{len(self.request.dst_pages)}"
            )
            return
        threading.Thread(
            target=self._run, name=f"pdd-kv-send-{self.sender.room}", daemon=True
        ).start()

    def fail(self, reason: str) -> None:
        with self.sender._lock:
            if self.state != "pending":
                return
            self.state, self.reason = "failed", reason
        logger.warning(
            "tcp KV transfer room %d to %s failed: %s", self.sender.room, self.incoming.peer, reason
        )
        if not self.released:
            with contextlib.suppress(OSError):
                send_frame(self.incoming.conn, MsgType.FAILURE, self.sender.room, reason.encode())
            self.incoming.conn.close()
        self._finish_record("failed", reason)

    def _run(self) -> None:
        share = LineShare.across(self.sender.kv_mgr.line, self.incoming.peer)
        try:
            self._transfer(share)
        finally:  # a pooled connection left at its Ack (a next leg may have it now)
            if share is not None and self.state != "success":
                share.leave(self.incoming.conn)

    def _transfer(self, share) -> None:
        """Pages, aux, Done; on the Ack the connection is pooled (``share``: the line's)."""
        conn, mgr, room = self.incoming.conn, self.sender.kv_mgr, self.sender.room
        record = self.record
        conn.settimeout(mgr.timeouts.idle)
        offered = sent = 0  # pages of the send stream seen / sent to this destination
        try:
            while self.state == "pending":
                pages, last, aux, idle_s, waited = self._next_chunk(conn, share)
                if record.first_byte is not None:  # the wire idled for prefill
                    record.sender_wait_s += idle_s
                    self.after_wait = self.after_wait or waited  # flags its next chunk
                keep = pages[max(0, self.skip - offered) :]
                offered += len(pages)
                if share is not None and len(keep):
                    share.join(conn)  # once sending: paced at its share of the line
                    record.paced_bytes_s = record.paced_bytes_s or pacing_cap(conn)
                sent = self._send_pages(conn, keep, sent)
                if not last:
                    continue
                record.computed = self.sender.computed
                if sent != len(self.request.dst_pages):
                    raise KVTransferError(
                        f"sent {sent} pages, expected {len(self.request.dst_pages)}"
                    )
                if aux is not None:
                    parts = [t.numpy() for t in aux]
                    record.wire_bytes += send_frame(
                        conn, MsgType.AUX, room, crc32(parts).to_bytes(4, "big"), *parts
                    )
                self._end_state(conn)
                done = Done.of_sender(sent, record)
                record.wire_bytes += send_frame(conn, MsgType.DONE, room, done.encode())
                if share is not None:  # its bytes sent, at the pace: the line is the others'
                    share.leave_once_sent(conn)
                kind, _, body = recv_frame(conn)
                if kind == MsgType.FAILURE:
                    raise KVTransferError(f"decode refused: {body.decode(errors='replace')}")
                if kind != MsgType.ACK:
                    raise ProtocolError(f"expected Ack, got {kind.name}")
                if share is not None:
                    share.leave(conn)  # at the latest: every byte acknowledged
                with self.sender._lock:
                    if self.state != "pending" or self.released:
                        return
                    # One step: SGLang polls success and then clear()s, which closes
                    # the connections no leg has released (it closed warm pooled
                    # connections under their next request's reader: EBADF).
                    self.state, self.released = "success", True
                self._end_state(conn)  # and the last round trip
                with contextlib.suppress(OSError):  # a broken one ends at the next read
                    end = Window(record.cwnd_end_bytes, record.ssthresh_end_bytes)
                    send_frame(conn, MsgType.WINDOW, room, end.encode())
                record.told_cwnd_bytes = record.cwnd_end_bytes
                self._finish_record("success", None, write=False)
                mgr.reuse_connection(conn, self.incoming.peer)
                # the log's end window once the kernel had a moment to undo a spurious
                # cut (the Window frame above has the one decode chooses by)
                tcp = settled_state(conn)
                record.cwnd_end_bytes, record.ssthresh_end_bytes = tcp[:2]
                mgr.log.write(record)
                return
        except Exception as exc:  # a worker never dies silently: the transfer fails
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = f"transfer to {self.incoming.peer} stalled: {reason}"
            self.fail(reason)

    def _next_chunk(self, conn, share=None):
        """Prefill's next chunk of pages, how long of the wait for it the wire idled, and
        whether there was a wait at all (the chunk's header says so, and the receiver
        times the idle from its own stamps: this count, the sender's, took a round trip's
        draws of hetero's dilated jitter and missed a wait its kernel counted busy).
        The idle counts from when the connection had sent its last byte and all were
        acknowledged (until then it still carried the chunk before: counting the whole
        wait took those bytes' time off the measured transfer, and small transfers were
        measured faster than the line's rate). While prefill computes, a Waiting frame
        every third of the idle timeout tells decode the transfer is alive: its idle
        timeout is for a stalled wire (a cut WAN), and a long prompt's next chunk on a busy
        prefill can take longer. All it was given sent, a leg leaves its ``share`` of the
        line (joins again with a chunk)."""
        mgr, room = self.sender.kv_mgr, self.sender.room
        period = max(0.05, mgr.timeouts.idle / 3)
        asked = noted = time.monotonic()
        idle_from, waited = None, self.queue.empty()
        while True:
            sharing = share is not None and conn in share
            try:
                pages, last, aux = self.queue.get(timeout=SHARE_POLL_S if sharing else period)
            except queue.Empty:
                idle_from = idle_from or wire_idle_from(conn)  # before a Waiting frame's bytes
                if sharing and (idle_from or share.all_sent(conn)):
                    share.leave(conn)  # all it was given is sent (acknowledged or not)
                now = time.monotonic()
                if now - asked > mgr.timeouts.first_data:
                    raise TimeoutError("no KV chunk came from the scheduler") from None
                if self.state != "pending":
                    raise TimeoutError("the transfer ended while prefill computed") from None
                if now - noted >= 0.99 * period:
                    self.record.wire_bytes += send_frame(conn, MsgType.WAITING, room)
                    noted = now
                continue
            idle_from = idle_from or wire_idle_from(conn)
            idle_s = time.monotonic() - max(asked, idle_from) if idle_from else 0.0
            return pages, last, aux, idle_s, waited

    def _send_pages(self, conn, pages: np.ndarray, first: int) -> int:
        pool = self.sender.kv_mgr.pool
        per_frame = rows_per_chunk(pool.bytes_per_row)
        for start in range(0, len(pages), per_frame):
            part = pages[start : start + per_frame]
            payload = [t.numpy() for t in pool.read(part)]
            if self.record.first_byte is None:
                self.record.first_byte = clock.now()
                tcp = tcp_state(conn)
                self.record.cwnd_bytes, self.record.ssthresh_bytes = tcp[:2]
                self._retransmitted, self._chrono = tcp.retransmits, tcp.chrono
            after_wait, self.after_wait = int(self.after_wait), False
            header = KvChunkHeader(first + start, len(part), crc32(payload), after_wait).encode()
            self.record.wire_bytes += send_frame(
                conn, MsgType.KV_CHUNK, self.sender.room, header, *payload
            )
            self.record.kv_bytes += sum(p.nbytes for p in payload)
            self.record.pages += len(part)
        return first + len(pages)

    def _end_state(self, conn) -> None:
        """The connection's TCP state now, into the record (see ``Done``)."""
        tcp = tcp_state(conn)
        self.record.cwnd_end_bytes, self.record.ssthresh_end_bytes = tcp[:2]
        self.record.retransmits = tcp.retransmits - self._retransmitted
        if self.record.first_byte is not None:
            spent = tcp.chrono.since(self._chrono)
            self.record.busy_s, self.record.rwnd_limited_s, self.record.sndbuf_limited_s = spent

    def _finish_record(self, status: str, reason: str | None, write: bool = True) -> None:
        record = self.record
        if record is None or record.end is not None:
            return
        record.end, record.status, record.reason = clock.now(), status, reason
        if write:
            self.sender.kv_mgr.log.write(record)


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
        self.expected = legs_expected(bootstrap_room)
        self.early = starts_early(bootstrap_room)  # compute before the decode asks
        self._state = KVPoll.Bootstrapping
        self._reason: str | None = None
        self._created = time.monotonic()
        self._first_claim: float | None = None
        self._legs: list[_Leg] = []
        self._num_pages: int | None = None
        self._aux_index: int | None = None
        self._prefix_pages = 0
        self._sent: list = []  # every queued chunk, replayed to a leg that joins late
        self.computed: float | None = None  # when the last chunk was queued (prefill done)
        self._lock = threading.Lock()

    # -- state ----------------------------------------------------------------------
    def poll(self) -> KVPoll:
        if self._state in (KVPoll.Success, KVPoll.Failed):
            return self._state
        self._claim_legs()
        if not self._legs and time.monotonic() - self._created > self.kv_mgr.timeouts.bootstrap:
            self._fail(
                f"decode never requested room {self.room} within "
                f"{self.kv_mgr.timeouts.bootstrap:.0f} s"
            )
        elif self._state == KVPoll.Bootstrapping:
            if self._legs or self.early:
                self._state = KVPoll.WaitingForInput
        elif self._num_pages is not None and len(self._legs) == self.expected:
            states = {leg.state for leg in self._legs}
            if "pending" not in states:
                if "success" in states:
                    self._state = KVPoll.Success
                else:
                    self._fail("; ".join(leg.reason or "failed" for leg in self._legs))
        return self._state

    def _claim_legs(self) -> None:
        while len(self._legs) < self.expected:
            incoming = self.kv_mgr.claim(self.room)
            if incoming is None:
                break
            leg = _Leg(self, incoming)
            with self._lock:  # a leg joining after init() gets what was sent so far
                for item in self._sent:
                    leg.queue.put(item)
                self._legs.append(leg)
            self._first_claim = self._first_claim or time.monotonic()
            if self._num_pages is not None:
                leg.start(self._num_pages, self._prefix_pages)
        waited = time.monotonic() - (self._first_claim or time.monotonic())
        if len(self._legs) < self.expected and waited > self.kv_mgr.timeouts.late_leg:
            reason = (
                f"room {self.room}: the second destination did not ask within "
                f"{self.kv_mgr.timeouts.late_leg:.0f} s; sent to the first only"
            )
            logger.warning(reason)
            self.kv_mgr.close_room(self.room, reason)
            self.expected = len(self._legs)

    def poll_pp_consensus(self) -> KVPoll:
        return self.poll()

    def _fail(self, reason: str) -> None:
        self._state, self._reason = KVPoll.Failed, reason
        logger.warning("tcp KV transfer room %d failed: %s", self.room, reason)
        for leg in self._legs:
            leg.fail(reason)

    def failure_exception(self):
        raise KVTransferError(self._reason or "KV transfer failed")

    # -- SGLang's sender surface ----------------------------------------------------
    def pop_decode_prefix_len(self) -> int:
        if self.expected > 1 or self.early or not self._legs:
            return 0  # dual path, early start: offer every page; each leg skips what it has
        return self._legs[0].request.decode_prefix_len

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        if not self._legs and not self.early:
            self._fail("init() before decode's transfer request arrived")
            return
        self._num_pages, self._aux_index = num_kv_indices, aux_index
        self._prefix_pages = self.pop_decode_prefix_len() // self.kv_mgr.page_size
        for leg in self._legs:
            leg.start(num_kv_indices, self._prefix_pages)

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
        item = (np.array(kv_indices, dtype=np.int64, copy=True), last, aux)
        if last:
            self.computed = clock.now()
        with self._lock:
            self._sent.append(item)
            legs = list(self._legs)
        for leg in legs:
            leg.queue.put(item)

    def get_transfer_metric(self) -> KVTransferMetric:
        r = self._legs[0].record if self._legs else None
        if r is None or r.end is None:
            return KVTransferMetric()
        return KVTransferMetric(transfer_latency_s=r.end - r.start, transfer_total_bytes=r.kv_bytes)

    def abort(self) -> None:
        self._fail("aborted on the prefill server")

    def clear(self) -> None:
        with self._lock:
            closing = [leg for leg in self._legs if not leg.released]
            for leg in closing:
                leg.released = True
        for leg in closing:
            leg.incoming.conn.close()
