"""The main-decode side of the handoff: parked requests and the extend forward.

Lifecycle of one PDD request on MD (its rid starts with ``PARK_PREFIX``)::

    PD decode request ─KV transfer succeeds─▶ parked (not in any batch; KV held, its
             prompt in the prefix cache: ``publish_prompt``)
      parked ─HANDOFF(t2..tk)─▶ one EXTEND forward over t1..t(k-1) ─▶ parked
             (catch-up: repeated per batch while relay decode keeps decoding)
      parked ─HANDOFF(final)─▶ extend ─▶ waiting queue ─▶ SGLang's PREBUILT merge:
             the request decodes from tk on, like any transferred request
      parked ─RELEASE / abort / park timeout─▶ finished as aborted, KV freed

Everything here runs on the scheduler thread (from the hooks in ``register``), so it
touches SGLang's pools and batches safely; the listener thread only queues frames.
Only one thing needs SGLang's internals: ``extend_parked`` builds a one-request
EXTEND batch over the KV already in the request's row, the way a later chunk of a
chunked prefill is built, runs it, and puts the request's bookkeeping back.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass

from protocol import clock, tls
from protocol.env import Env
from protocol.frames import (
    MsgType,
    ProtocolError,
    frame_size,
    recv_frame,
    send_frame,
)
from protocol.handoff import PARK_TIMEOUT_S, Extended, Handoff, Ready
from protocol.records import HandoffRecord, JsonlWriter
from protocol.rooms import PARK_PREFIX
from protocol.tcp import configure_socket

MAX_CONNECTIONS = 512  # open router channels (one per relayed request in flight)
FROM_ROUTER = {MsgType.WATCH, MsgType.HANDOFF, MsgType.RELEASE}
QUIET_MARGIN_S = 30.0  # a router may be silent a park timeout and this, no KV on its way

logger = logging.getLogger("pdd.handoff")


@dataclass
class Parked:
    req: object  # sglang Req
    since: float
    extend_forwards: int = 0
    watcher: socket.socket | None = None


class HandoffService:
    """One per decode scheduler: the listener, the parked requests, the commands."""

    def __init__(self, scheduler, port: int) -> None:
        self.scheduler = scheduler
        self.parked: dict[int, Parked] = {}
        self.watchers: dict[int, socket.socket] = {}  # WATCH came before the KV
        self.early: dict[int, list] = {}  # HANDOFFs that came before the KV (applied in order)
        self.commands: queue.Queue = queue.Queue()
        self.park_timeout = float(os.environ.get(Env.HANDOFF_PARK_TIMEOUT_S, PARK_TIMEOUT_S))
        self.log = JsonlWriter(os.environ.get(Env.KV_TRANSFER_LOG))  # beside the transfers
        host = getattr(scheduler.server_args, "host", "0.0.0.0")
        self.listener = socket.create_server((host, port), backlog=128)
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.tls = tls.server_context()
        threading.Thread(target=self._accept, name="pdd-handoff-accept", daemon=True).start()
        logger.info("handoff: main decode listening on %s:%d", host, port)

    # -- listener thread ----------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            if not self.connections.acquire(blocking=False):
                logger.warning("handoff: %d connections open, refusing %s", MAX_CONNECTIONS, peer)
                conn.close()
                continue
            configure_socket(conn, 30.0)
            conn.settimeout(self.park_timeout + QUIET_MARGIN_S)  # within a frame
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        rooms: set[int] = set()
        try:
            if self.tls is not None:  # servers.tls: the handshake, on this thread
                conn = self.tls.wrap_socket(conn, server_side=True)
            while True:
                self._next_frame(conn, rooms)
                kind, room, body = recv_frame(conn)
                if kind not in FROM_ROUTER:
                    raise ProtocolError(f"{kind.name} is not a message a router sends")
                if kind == MsgType.WATCH and body:
                    raise ProtocolError("a WATCH carries no body")
                if kind == MsgType.HANDOFF:
                    Handoff.decode(bytes(body))  # malformed: refused here, not in the scheduler
                rooms.add(room)
                self.commands.put((conn, kind, room, bytes(body), clock.now()))
        except Exception as exc:  # gone, silent or malformed: the connection ends
            if not isinstance(exc, OSError):
                logger.warning("handoff: closing a connection: %r", exc)
            # The router went away: its rooms' parked requests are of no use now.
            gone = b"router closed the connection"
            for room in rooms:
                self.commands.put((None, MsgType.RELEASE, room, gone, clock.now()))
            conn.close()
            self.connections.release()

    def _next_frame(self, conn, rooms: set[int]) -> None:
        """Wait for the router's next frame. Its channel is quiet while a room's KV is on
        its way, however long that takes (hetero run 20261205-002307: 166 s for one
        dual-path leg behind others; a fixed read timeout closed the channel and the
        room was released), and then at most a park timeout until the handoff. A peer
        silent past that with no KV on its way is gone (keepalive ends a dead one)."""
        quiet = self.park_timeout + QUIET_MARGIN_S
        since = time.monotonic()
        while not _readable(conn, min(quiet, 5.0)):
            if any(r in self.watchers or r in self.early for r in rooms):
                since = time.monotonic()  # the KV is on its way
            elif time.monotonic() - since > quiet:
                raise TimeoutError(f"the router was silent for {quiet:.0f} s")

    # -- scheduler thread ---------------------------------------------------------------
    def park(self, reqs: list) -> list:
        """From the transferred requests, keep PDD ones aside; return the others."""
        out = []
        for req in reqs:
            if not str(req.rid).startswith(PARK_PREFIX) or req.bootstrap_room is None:
                out.append(req)
                continue
            room = req.bootstrap_room
            publish_prompt(self.scheduler, req)
            parked = Parked(req, time.monotonic(), watcher=self.watchers.pop(room, None))
            self.parked[room] = parked
            if parked.watcher is not None:
                self._ready(room, parked)
            for command in self.early.pop(room, []):
                self.commands.put(command)
        return out

    def tick(self) -> None:
        """Carry out the commands that came, up to one extend forward: the commands
        after it wait for the next iteration, so the decode batch steps between two
        rooms' extends instead of waiting out both (a forward leaves a request parked
        or waiting, so the loop does not idle meanwhile)."""
        while True:
            try:
                conn, kind, room, body, received = self.commands.get_nowait()
            except queue.Empty:
                break
            try:
                if self._command(conn, kind, room, body, received):
                    break
            except Exception:  # one bad command must not take the scheduler down
                logger.exception("handoff: %s for room %d failed", kind.name, room)
                self._finish(room, "handoff failed on main decode")
        now = time.monotonic()
        for room, p in list(self.parked.items()):
            if now - p.since > self.park_timeout:
                self._finish(room, f"no handoff within {self.park_timeout:.0f} s")

    def abort(self, rid: str | None, abort_all: bool = False) -> None:
        for room, p in list(self.parked.items()):
            if abort_all or p.req.rid == rid:
                self._finish(room, "aborted")

    def _command(self, conn, kind: MsgType, room: int, body: bytes, received: float) -> bool:
        """Carry out one command; returns whether it ran an extend forward."""
        parked = self.parked.get(room)
        if kind == MsgType.WATCH:
            if parked is None:
                self.watchers[room] = conn
            else:
                parked.watcher = conn
                self._ready(room, parked)
        elif kind == MsgType.HANDOFF:
            if parked is None:  # the KV is still on its way: apply once it is held
                self.early.setdefault(room, []).append((conn, kind, room, body, received))
                return False
            frame = frame_size(len(body))
            return self._handoff(conn, room, parked, Handoff.decode(body), frame, received)
        elif kind == MsgType.RELEASE:
            self.watchers.pop(room, None)
            self.early.pop(room, None)
            if parked is not None:
                self._finish(room, body.decode(errors="replace") or "released by the router")
        else:
            raise ProtocolError(f"unexpected {kind.name} on the handoff port")
        return False

    def _ready(self, room: int, parked: Parked) -> None:
        req = parked.req
        ready = Ready(len(req.origin_input_ids), int(req.kv.cache_protected_len or 0))
        _reply(parked.watcher, MsgType.READY, room, ready.encode())

    def _handoff(
        self, conn, room: int, parked: Parked, msg: Handoff, frame_bytes: int, received: float
    ) -> bool:
        start = time.monotonic()
        started_at = clock.now()
        req = parked.req
        limit = req.sampling_params.max_new_tokens
        if limit is not None and len(req.output_ids) + len(msg.tokens) > limit:
            # Tokens MD already has, sent twice, would run the request past its end
            # and leave SGLang's release bookkeeping inconsistent: refuse them.
            raise ProtocolError(
                f"a handoff of {len(msg.tokens)} tokens to a request holding "
                f"{len(req.output_ids)} would pass its {limit}-token limit"
            )
        through_last = msg.final and predicts_safely(req, len(msg.tokens))
        next_token, extended = extend_parked(self.scheduler, req, list(msg.tokens), through_last)
        forward_s = time.monotonic() - start
        parked.extend_forwards += extended > 0
        parked.since = time.monotonic()
        # A catch-up batch leaves the last token pending, and the forward's prediction
        # should be that token; the final one takes it in, and its prediction is MD's
        # first own token (known to nobody yet).
        expected = -1 if through_last else int(req.output_ids[-1])
        if msg.final:
            if through_last and next_token >= 0:
                req.output_ids.append(next_token)  # streamed as the request joins the batch
            del self.parked[room]
            self.scheduler.waiting_queue.append(req)
        reply = Extended(len(msg.tokens), extended, next_token, forward_s, msg.final)
        _reply(conn, MsgType.EXTENDED, room, reply.encode())
        self.log.write(
            HandoffRecord(
                room=room,
                tokens=len(msg.tokens),
                extend_tokens=extended,
                frame_bytes=frame_bytes,
                forward_s=forward_s,
                next_token=next_token,
                expected_next=expected,
                final=msg.final,
                extend_forwards=parked.extend_forwards,
                received=received,
                queued_s=started_at - received,
                extended_at=clock.now(),
                time=clock.now(),
            )
        )
        return extended > 0

    def _finish(self, room: int, reason: str) -> None:
        """End a parked request as aborted; SGLang's normal path frees its KV."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        parked = self.parked.pop(room, None)
        if parked is None:
            return
        parked.req.to_finish = FINISH_ABORT(f"PDD handoff: {reason}")
        self.scheduler.waiting_queue.append(parked.req)


def _readable(conn: socket.socket, timeout_s: float) -> bool:
    if getattr(conn, "pending", None) is not None and conn.pending():
        return True  # TLS: a record already decrypted
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _reply(conn: socket.socket | None, kind: MsgType, room: int, body: bytes) -> None:
    if conn is None:
        return
    try:
        send_frame(conn, kind, room, body)
    except OSError as exc:
        logger.warning("handoff: reply %s for room %d lost: %s", kind.name, room, exc)


def predicts_safely(req, new_tokens: int) -> bool:
    """Whether the final extend may also predict the request's next token: only if that
    token cannot end the request (at least one more is to come, and no stop token or
    string could match it). A request that ended in its merge step would leave SGLang's
    release path with KV bookkeeping it does not expect."""
    params = req.sampling_params
    after = len(req.output_ids) + new_tokens + 1  # outputs once the prediction is in
    no_stop = params.ignore_eos and not params.stop_token_ids and not params.stop_strs
    return (
        bool(no_stop)
        and not getattr(params, "stop_regex_strs", None)
        and (params.max_new_tokens is None or after < params.max_new_tokens)
    )


def publish_prompt(scheduler, req) -> None:
    """Put a parked request's transferred prompt into decode's prefix cache, as SGLang's
    PREBUILT merge does for every other transferred request (it merges a parked one only
    after the final handoff): a request sharing the prompt then matches it, and prefill
    sends only the rest (:mod:`engine_patches.kv_transfer.prefix_wait`)."""
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    committed = req.kv.kv_committed_len
    if not committed or scheduler.tree_cache is None:
        return
    req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
    req.extend_end = committed
    checkpoint_kv_cache(req, scheduler.tree_cache)


def extend_parked(scheduler, req, new_tokens: list[int], through_last: bool = False):
    """Append ``new_tokens`` to a parked request and compute, in one EXTEND forward,
    the KV of every output token but the last (a catch-up batch: the last stays
    pending, as after any decode step) or of all of them (``through_last``: the final
    batch, whose forward then predicts the request's next token at once, saving the
    decode step that would otherwise come first). Returns (the forward's prediction,
    -1 if no forward ran; how many tokens it computed)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    req.output_ids.extend(new_tokens)
    committed = req.kv.kv_committed_len
    target = len(req.origin_input_ids) + len(req.output_ids) - (0 if through_last else 1)
    if target <= committed:
        return -1, 0
    saved = {
        name: getattr(req, name)
        for name in (
            "prefix_len",
            "extend_end",
            "cached_tokens",
            "cached_tokens_device",
            "cached_tokens_host",
            "cached_tokens_storage",
            "already_computed",
            "_cache_breakdown_computed",
            "return_logprob",
        )
    }
    try:
        req.prefix_len = committed  # the row already holds KV up to here
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
        req.extend_end = target
        req.return_logprob = False
        batch = ScheduleBatch.init_new(
            [req],
            scheduler.req_to_token_pool,
            scheduler.token_to_kv_pool_allocator,
            scheduler.tree_cache,
            scheduler.model_config,
            scheduler.enable_overlap,
            scheduler.spec_algorithm,
        )
        batch.prepare_for_extend()
        result = scheduler.run_batch(batch)
        next_token = int(result.next_token_ids.reshape(-1)[-1])
    finally:
        for name, value in saved.items():
            setattr(req, name, value)
    return next_token, target - committed


PORT = os.environ.get(Env.HANDOFF_PORT)  # read once: the plugin loads in each server process


def service_for(scheduler) -> HandoffService | None:
    """The scheduler's handoff service, started on its first loop iteration."""
    if not PORT:
        return None
    service = getattr(scheduler, "pdd_handoff", None)
    if service is None:
        service = scheduler.pdd_handoff = HandoffService(scheduler, int(PORT))
    return service
