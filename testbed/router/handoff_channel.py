"""The router's connection to main decode's handoff listener, for one room.

Lifecycle: ``watch`` connects and sends WATCH → MD answers READY once it holds the
prompt's KV (the request is parked there) → ``handoff`` sends token-id batches, each
answered by EXTENDED (``extended``) → the final batch hands the request over →
``close``; closing before the final batch releases MD's parked request.

Each batch is an extend pass on MD that pauses its whole decode batch, so the channel
counts its batches MD has not yet extended in ``extending`` (per main decode, shared by
the router's channels): the switch of another room does not stop relay decode while
MD is about to pause. A batch counts until EXTENDED (catch-up), until its room's stream
shows MD decoding past it (``extend_seen``: the final batch), or until ``close``.
Each catch-up batch's time from its send to its EXTENDED goes to ``on_extended``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from protocol import clock, tls
from protocol.frames import MsgType, read_frame, write_frame
from protocol.handoff import Extended, Handoff, Ready


class HandoffError(RuntimeError):
    pass


class HandoffChannel:
    def __init__(
        self,
        host: str,
        port: int,
        room: int,
        extending: Counter | None = None,
        md: str = "",
        on_extended: Callable[[float], None] | None = None,
    ) -> None:
        self.host, self.port, self.room = host, port, room
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.bytes_sent = 0
        self.extending = Counter() if extending is None else extending
        self.md = md  # main decode's name, the key in ``extending``
        self.pending = 0  # this room's batches MD has not extended yet
        self.on_extended = on_extended  # seconds from a batch's send to its EXTENDED
        self.sent_at = 0.0  # the last batch's send

    async def watch(self) -> Ready:
        """Connect, WATCH, and wait until MD holds the prompt's KV."""
        ctx = tls.client_context()  # servers.tls: MD's certificate is the deployment's
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None
        )
        await self._send(MsgType.WATCH, b"")
        return Ready.decode(await self._expect(MsgType.READY))

    @property
    def open(self) -> bool:
        """Connected to MD's handoff listener (``watch`` got that far): batches can go."""
        return self.writer is not None

    async def handoff(self, tokens: list[int], final: bool) -> int:
        """Send one handoff batch; returns its bytes on the wire."""
        self._count(1)  # before the send yields: other rooms' switches see the pause now
        self.sent_at = clock.now()
        try:
            return await self._send(MsgType.HANDOFF, Handoff(tuple(tokens), final).encode())
        except BaseException:
            self._count(-1)  # not sent: MD has nothing to extend
            raise

    async def extended(self) -> Extended:
        answer = Extended.decode(await self._expect(MsgType.EXTENDED))
        self._count(-1)
        if self.on_extended is not None:
            self.on_extended(clock.now() - self.sent_at)
        return answer

    def extend_seen(self) -> None:
        """MD's stream shows it decoding past every batch sent (the final one included)."""
        self._count(-self.pending)

    def _count(self, n: int) -> None:
        self.pending += n
        self.extending[self.md] += n

    async def _send(self, kind: MsgType, body: bytes) -> int:
        if self.writer is None:
            raise HandoffError("not connected to main decode's handoff listener")
        sent = await write_frame(self.writer, kind, self.room, body)
        self.bytes_sent += sent
        return sent

    async def _expect(self, kind: MsgType) -> bytes:
        got, _, body = await read_frame(self.reader)
        if got != kind:
            raise HandoffError(f"expected {kind.name} from main decode, got {got.name}")
        return body

    def close(self) -> None:
        self.extend_seen()
        if self.writer is not None:
            self.writer.close()
