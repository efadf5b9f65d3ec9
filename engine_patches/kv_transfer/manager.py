"""The tcp backend's manager (one per scheduler) and its bootstrap-server placeholder.

Lifecycle (prefill mode): constructed by SGLang with the pool's ``KVArgs`` → starts a
listener thread on ``--disaggregation-bootstrap-port`` (in the scheduler process,
where the KV pool lives) → each accepted connection delivers one
``TransferRequest``, parked by room until that room's sender claims it (or expires)
→ the sender owns the connection from then on. A dual-path room parks two requests
(one per destination); a room whose sender gave up waiting for its second
destination is *closed*, and a request arriving for it later is refused at once.
Decode mode runs no thread; its receivers check connections out of its pool
(:mod:`engine_patches.kv_transfer.conn_pool`) or open new ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass

from sglang.srt.disaggregation.base.conn import BaseKVBootstrapServer, BaseKVManager

from engine_patches.kv_transfer.conn_pool import ConnPool
from engine_patches.kv_transfer.line_share import LineShare
from engine_patches.kv_transfer.pool import BufferSet, layout_digest
from protocol import tls
from protocol.env import Env, kv_timeout
from protocol.frames import (
    MsgType,
    ProtocolError,
    recv_frame,
    send_frame,
)
from protocol.kv import IDLE_TIMEOUT_S, LATE_LEG_S, POOL_REUSE_S, TransferRequest
from protocol.records import JsonlWriter
from protocol.tcp import configure_socket, enable_pacing

logger = logging.getLogger("pdd.kv_transfer")
MAX_CONNECTIONS = 512  # requests being read or parked on the prefill listener


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``idle``: no progress on a flowing transfer (a cut WAN ends here; a
    KV chunk is read in batches, so a transfer that stops a few bytes into a batch is
    found stalled after one to two of these: ``protocol.frames.recv_exact``)."""

    connect: float = 10.0
    bootstrap: float = 300.0  # prefill waits this long for decode's request
    first_data: float = 300.0  # decode waits this long for prefill to compute
    idle: float = IDLE_TIMEOUT_S
    late_leg: float = LATE_LEG_S  # dual path: how long after the first the second may join
    pool_reuse: float = POOL_REUSE_S  # decode reuses a pooled connection idle less than this

    @classmethod
    def from_env(cls) -> Timeouts:
        def get(name: str, default: float) -> float:
            return float(os.environ.get(kv_timeout(name), default))

        return cls(**{f: get(f, getattr(cls, f)) for f in cls.__dataclass_fields__})


@dataclass
class Incoming:
    """A decode server's request for one room, parked until the sender claims it."""

    conn: socket.socket
    peer: str
    request: TransferRequest
    arrived: float


class _SingleRankPrefills:
    """What the decode scheduler asks about a prefill: always one rank, dp size 1."""

    @dataclass(frozen=True)
    class Info:
        dp_size: int = 1
        follow_bootstrap_room: bool = True

    def get(self, addr, default=None):
        return self.Info()


class TcpKVManager(BaseKVManager):
    enable_all_cp_ranks_for_transfer = False

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False, **_):
        from sglang.srt.disaggregation.utils import DisaggregationMode

        unsupported = [str(t) for t in getattr(args, "state_types", []) or []]
        if unsupported:
            raise NotImplementedError(
                f"the tcp KV transfer backend moves full-attention KV pages only; "
                f"this model also needs state buffers {unsupported}"
            )
        self.kv_args = args
        self.mode = disaggregation_mode
        self.server_args = server_args
        self.page_size = args.page_size
        self.pool = BufferSet(args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens)
        self.aux = BufferSet(args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens)
        self.layout = layout_digest(list(args.kv_item_lens), args.page_size)
        self.timeouts = Timeouts.from_env()
        self.tls = (
            tls.server_context() if disaggregation_mode == DisaggregationMode.PREFILL else None
        )
        self.tls_client = tls.client_context()
        self.log = JsonlWriter(os.environ.get(Env.KV_TRANSFER_LOG))
        self.pacing = os.environ.get(Env.KV_PACING) == "1"  # servers.kv_pacing
        prefill = disaggregation_mode == DisaggregationMode.PREFILL
        self.line = LineShare.from_env() if prefill else None  # servers.kv_line_share
        self.prefill_info_table = _SingleRankPrefills()
        self._incoming: dict[int, list[Incoming]] = {}
        self._closed: dict[int, tuple[str, float]] = {}  # room → (reason, when)
        self.conns = ConnPool(self.timeouts.pool_reuse, self.log)  # decode's, to prefills
        self._lock = threading.Lock()
        if disaggregation_mode == DisaggregationMode.PREFILL:
            host = getattr(server_args, "host", "0.0.0.0")
            port = server_args.disaggregation_bootstrap_port
            self._listener = socket.create_server((host, port), reuse_port=False, backlog=128)
            threading.Thread(target=self._accept_loop, name="pdd-kv-accept", daemon=True).start()
            logger.info("tcp KV transfer: prefill listening on %s:%d", host, port)

    # -- SGLang's manager surface ---------------------------------------------------
    def register_to_bootstrap(self) -> None:
        """Nothing to register: decode connects to the bootstrap address directly."""

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        return True

    def clear_deferred_abort_state(self, bootstrap_room: int) -> None:
        pass

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool:
        return True

    # -- prefill side ---------------------------------------------------------------
    def claim(self, room: int) -> Incoming | None:
        """A parked request for ``room``, if a decode server has sent one (removes it)."""
        with self._lock:
            parked = self._incoming.get(room)
            if not parked:
                return None
            incoming = parked.pop(0)
            if not parked:
                del self._incoming[room]
            return incoming

    def close_room(self, room: int, reason: str) -> None:
        """Refuse requests for ``room`` from now on (and any parked one)."""
        with self._lock:
            self._closed[room] = (reason, time.monotonic())
            late = self._incoming.pop(room, [])
        for incoming in late:
            _refuse(incoming.conn, room, reason)
        self._expire_parked()  # pooled connections make accepts rare: expire here too

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._listener.accept()
            except OSError:
                return
            if self._open_connections() >= MAX_CONNECTIONS:
                logger.warning(
                    "tcp KV transfer: %d connections open, refusing %s", MAX_CONNECTIONS, addr
                )
                conn.close()
                continue
            threading.Thread(
                target=self._read_request,
                args=(conn, f"{addr[0]}:{addr[1]}", None, True),
                name="pdd-kv-request",
                daemon=True,
            ).start()
            self._expire_parked()

    def _open_connections(self) -> int:
        """Connections being read or parked (the threads reading requests count too)."""
        with self._lock:
            parked = sum(len(v) for v in self._incoming.values())
        reading = sum(1 for t in threading.enumerate() if t.name == "pdd-kv-request")
        return parked + reading

    def reuse_connection(self, conn: socket.socket, peer: str) -> None:
        """Prefill: after a finished transfer, wait on the same connection for the next."""
        threading.Thread(
            target=self._read_request,
            args=(conn, peer, 2 * self.timeouts.pool_reuse),  # then prefill closes it
            name="pdd-kv-request",
            daemon=True,
        ).start()

    def _read_request(
        self, conn: socket.socket, peer: str, wait_s: float | None = None, fresh: bool = False
    ) -> None:
        try:
            conn.settimeout(wait_s or self.timeouts.connect)
            configure_socket(conn, self.timeouts.idle)
            if fresh and self.pacing:
                enable_pacing(conn)
            if fresh and self.tls is not None:  # a new connection: TLS first (servers.tls)
                conn = self.tls.wrap_socket(conn, server_side=True)
            try:
                kind, room, body = recv_frame(conn)
            except (TimeoutError, ConnectionError):
                if wait_s is not None:  # an idle pooled connection ending is normal
                    conn.close()
                    return
                raise
            if kind != MsgType.TRANSFER_REQUEST:
                raise ProtocolError(f"expected a transfer request, got {kind.name}")
            request = TransferRequest.decode(bytes(body))
            if request.layout_digest != self.layout:
                reason = "KV layout differs between prefill and decode (same model and page size?)"
                send_frame(conn, MsgType.FAILURE, room, reason.encode())
                conn.close()
                logger.error("room %d from %s: %s", room, peer, reason)
                return
        except Exception as exc:  # anything malformed: refused, the listener lives on
            logger.warning("tcp KV transfer: bad request from %s: %r", peer, exc)
            conn.close()
            return
        with self._lock:
            closed = self._closed.get(room)
            if closed is None:
                # A decode server that retried (its pooled connection had died) left
                # a closed request behind: drop it. Another destination adds one.
                parked = self._incoming.setdefault(room, [])
                stale = [i for i in parked if not _still_open(i.conn)]
                parked[:] = [i for i in parked if i not in stale]
                parked.append(Incoming(conn, peer, request, time.monotonic()))
        if closed is not None:
            _refuse(conn, room, closed[0])
            return
        for incoming in stale:
            incoming.conn.close()

    def _expire_parked(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = []
            for room, parked in list(self._incoming.items()):
                expired += [i for i in parked if now - i.arrived > self.timeouts.bootstrap]
                parked[:] = [i for i in parked if now - i.arrived <= self.timeouts.bootstrap]
                if not parked:
                    del self._incoming[room]
            for room, (_, when) in list(self._closed.items()):
                if now - when > self.timeouts.bootstrap:
                    del self._closed[room]
        for incoming in expired:
            incoming.conn.close()


def _refuse(conn: socket.socket, room: int, reason: str) -> None:
    with contextlib.suppress(OSError):
        send_frame(conn, MsgType.FAILURE, room, reason.encode())
    conn.close()


def _still_open(sock: socket.socket) -> bool:
    """An idle pooled connection has nothing to read and no pending error; one that
    the peer closed, or that keepalive gave up on (a cut WAN), has."""
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return False
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable
    except (OSError, ValueError):
        return False


class TcpKVBootstrapServer(BaseKVBootstrapServer):
    """A placeholder: the prefill scheduler's manager itself listens on the bootstrap port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def close(self) -> None:
        pass

    def poll(self):
        return None
