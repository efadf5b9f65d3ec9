"""The servers' transfer logs, read as they grow, by bootstrap room.

Each line is a :data:`protocol.records.TRANSFER_LOG_SIDES` record: a transfer's
sender side (prefill, one per destination), its receiver side (decode), or a handoff
main decode applied. ``join`` puts them into a request's record (KV bytes, the TTFT's
parts), and the router's WAN line learns from the lines as they appear (``on_line``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.records import (
    TRANSFER_LOG_SIDES,
    HandoffRecord,
    RequestRecord,
    TransferRecord,
    from_dict,
)

if TYPE_CHECKING:
    from testbed.router.policies import Route

KEEP = 20_000  # log lines kept per side for lookup; the oldest go first
logger = logging.getLogger("pdd.router")


class TransferIndex:
    def __init__(self, paths: list[Path], on_line=None) -> None:
        self._offsets = {Path(p): 0 for p in paths}
        # (log, room, side) → records in the order written (a dual-path room has two
        # sender lines in prefill's log; a catch-up handoff several handoff lines)
        self._lines: OrderedDict[tuple[Path, int, str], list] = OrderedDict()
        self._by_room: dict[int, set[tuple[Path, int, str]]] = {}  # for forget
        self._on_line = on_line  # called with (log, side, record) as each line is read

    def refresh(self) -> None:
        """Read what the logs gained since the last call."""
        for path, offset in self._offsets.items():
            try:
                with open(path) as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind("\n") + 1]
            self._offsets[path] = offset + len(complete.encode())
            for line in complete.splitlines():
                try:
                    data = json.loads(line)
                    side = data.get("side")
                    if side not in TRANSFER_LOG_SIDES:
                        continue
                    record = from_dict(TRANSFER_LOG_SIDES[side], data)
                except (ValueError, TypeError, AttributeError) as exc:  # a torn line
                    logger.warning("%s: skipping a bad transfer-log line: %r", path, exc)
                    continue
                key = (path, record.room, side)
                self._lines.setdefault(key, []).append(record)
                self._by_room.setdefault(record.room, set()).add(key)
                if self._on_line is not None:
                    self._on_line(path, side, record)
        while len(self._lines) > KEEP:
            key, _ = self._lines.popitem(last=False)
            self._unindex(key)

    async def lookup(self, room: int, log: Path, wait_s: float = 1.0) -> TransferRecord | None:
        """The receiver's record for ``room`` in ``log``; waits briefly for it."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            found = self.peek(room, log)
            if found is not None or asyncio.get_running_loop().time() >= deadline:
                return found
            await asyncio.sleep(0.05)

    def peek(self, room: int, log: Path) -> TransferRecord | None:
        """The receiver's record for ``room`` in ``log`` if it is written yet."""
        self.refresh()
        lines = self._lines.get((Path(log), room, "decode"))
        return lines[-1] if lines else None

    def sent(self, room: int, log: Path) -> list[TransferRecord]:
        """The sender's records for ``room`` in a prefill server's ``log``."""
        self.refresh()
        return list(self._lines.get((Path(log), room, "prefill"), []))

    def handoffs(self, room: int, log: Path) -> list[HandoffRecord]:
        self.refresh()
        return list(self._lines.get((Path(log), room, "handoff"), []))

    def forget(self, room: int) -> None:
        for key in self._by_room.pop(room, ()):
            self._lines.pop(key, None)

    def _unindex(self, key: tuple[Path, int, str]) -> None:
        keys = self._by_room.get(key[1])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_room[key[1]]

    async def join(self, route: Route, record: RequestRecord) -> None:
        """The servers' logs into the record: the KV that crossed to the server that
        decodes to the end (for P->RLD->MD: main decode, over the WAN, even if relay
        decode finished the request), and the stamps that split the TTFT."""
        if record.room is None:
            return
        server, room = route.kv_server, record.room
        if server.transfer_log is None:
            return
        wait_s = 0.5 if record.status == "ok" else 0.1
        transfer = await self.lookup(room, server.transfer_log, wait_s)
        self._join_stamps(route, record, transfer)
        sender = self._sender_to(route, server, room)
        self.forget(room)
        if transfer is None:
            return
        record.kv_bytes, record.kv_wire_bytes = transfer.kv_bytes, transfer.wire_bytes
        record.cached_tokens_decode = transfer.decode_prefix_len
        # A transfer cut short (aborted on decode once relay decode finished the request,
        # a cut WAN) moved part of what was predicted: its time is no measured transfer
        # time (mooncake run: 8 of 117 such, prediction error P95 468% with, 188% without).
        record.kv_transfer_s = transfer.seconds if transfer.ok else None
        record.kv_span_s = transfer.span_s if transfer.ok else None
        record.kv_cwnd_bytes, record.kv_retransmits = transfer.cwnd_bytes, transfer.retransmits
        if sender is not None:
            record.kv_retransmits = max(transfer.retransmits, sender.retransmits)
        record.kv_link = "lan" if route.prefill.site == server.site else "wan"
        if record.kv_link == "wan":
            record.wan_first_byte, record.wan_end = transfer.first_byte, transfer.end
        if not transfer.ok and record.fallback:
            record.fallback = f"{record.fallback}; KV transfer: {transfer.reason}"[:500]
        elif not transfer.ok and record.status == "ok":
            record.status, record.error = "upstream_error", f"KV transfer failed: {transfer.reason}"

    def _sender_to(self, route: Route, server, room: int) -> TransferRecord | None:
        """The prefill sender's line for ``room`` to ``server`` (a dual-path room also
        sends to relay decode). The receiver has the sender's retransmissions as of its
        Done frame, with the last windows still in flight; the sender's own line, written
        after decode's Ack, has them all (hetero run 111130: 0 in the Done frame, 163 and
        270 in the sender's line, where a 2.9 MB window burst into the rate limiter's
        queue and 1.7 MB took 16 s)."""
        if route.prefill is None or route.prefill.transfer_log is None:
            return None
        lines = self.sent(room, route.prefill.transfer_log)
        addresses = _addresses(server.host)
        to_server = [t for t in lines if t.peer.rsplit(":", 1)[0].strip("[]") in addresses]
        return to_server[-1] if to_server else None

    def _join_stamps(
        self, route: Route, record: RequestRecord, transfer: TransferRecord | None
    ) -> None:
        """When P sent its first KV byte and had computed the prompt, when the first
        token's decoder held the KV, and when MD extended the final handoff."""
        room, logs = record.room, self
        first = route.stream_from.transfer_log
        held = logs.peek(room, first) if first is not None else None
        # P's stamp from its own lines, or from a receiver's (the Done frame carries it):
        # the sender writes its line only once its connection settled after the Ack
        log = route.prefill.transfer_log
        lines = logs.sent(room, log) if log is not None else []
        sent = [t.sender_first_byte for t in (held, transfer) if t is not None]
        sent += [t.first_byte for t in lines]
        record.prefill_first_byte = min((t for t in sent if t), default=None)
        computed = [t.computed for t in (held, transfer, *lines) if t is not None]
        record.prefill_computed = min((t for t in computed if t), default=None)
        if held is not None and held.ok:
            record.kv_first_byte, record.kv_end = held.first_byte, held.end
            record.kv_sender_wait_s = held.sender_wait_s
        if route.main_decode is not None and route.main_decode.transfer_log is not None:
            final = [h for h in logs.handoffs(room, route.main_decode.transfer_log) if h.final]
            record.handoff_extended = final[-1].extended_at if final else None


@functools.lru_cache(maxsize=64)
def _addresses(host: str) -> frozenset[str]:
    """A server's addresses, as a sender's log names its peer: an inventory may give a
    hostname (resolved once; unresolvable, it matches no line and the record keeps the
    receiver's count)."""
    try:
        return frozenset({host} | {info[4][0] for info in socket.getaddrinfo(host, None)})
    except OSError:
        return frozenset({host})
