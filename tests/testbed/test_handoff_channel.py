"""The router's handoff channel counts the batches main decode has not yet extended
(``Loads.extending``, which the switch of every room on that main decode reads).

Main decode's listener is stood in for by a loopback server that speaks the same
frames (WATCH → READY, HANDOFF → EXTENDED for a catch-up batch, nothing for the final
one); the real listener answers the real channel in tests/testbed/test_pdd.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from protocol.frames import MsgType, read_frame, write_frame
from protocol.handoff import Extended, Handoff, Ready
from testbed.router.handoff_channel import HandoffChannel, HandoffError


async def _listener(reader, writer) -> None:
    """Main decode's side: READY at once, EXTENDED after each catch-up batch."""
    try:
        while True:
            kind, room, body = await read_frame(reader)
            if kind == MsgType.WATCH:
                await write_frame(writer, MsgType.READY, room, Ready(8, 0).encode())
            elif kind == MsgType.HANDOFF and not Handoff.decode(body).final:
                answer = Extended(len(Handoff.decode(body).tokens), 3, 7, 0.01, False)
                await write_frame(writer, MsgType.EXTENDED, room, answer.encode())
    except asyncio.IncompleteReadError:
        writer.close()


def test_unextended_batches_count_until_extended_seen_or_closed():
    async def walk() -> list[int]:
        server = await asyncio.start_server(_listener, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        extending: Counter[str] = Counter()
        other = HandoffChannel("127.0.0.1", port, 2, extending, "md1")
        channel = HandoffChannel("127.0.0.1", port, 1, extending, "md1")
        seen = []
        try:
            await channel.watch()
            await other.watch()
            await channel.handoff([5, 6], final=False)  # a catch-up batch
            seen.append(extending["md1"])
            await channel.extended()  # MD answered: extended
            seen.append(extending["md1"])
            await channel.handoff([7], final=True)  # the final batch: no answer
            await other.handoff([9], final=True)
            seen.append(extending["md1"])
            channel.extend_seen()  # its room's stream shows MD decoding past it
            channel.extend_seen()  # idempotent
            seen.append(extending["md1"])
            other.close()  # a room released before MD extended its batch
            seen.append(extending["md1"])
        finally:
            channel.close()
            server.close()
        return seen

    assert asyncio.run(walk()) == [1, 0, 2, 1, 0]


def test_a_batch_before_the_channel_is_open_is_refused_and_not_counted():
    """The relayed pipeline does not send before the channel is open (handoff_decision);
    should anything try, it gets a HandoffError, not a write to no connection, and
    no extend is counted on MD."""
    extending: Counter[str] = Counter()
    channel = HandoffChannel("127.0.0.1", 1, 3, extending, "md1")
    assert not channel.open
    with pytest.raises(HandoffError, match="not connected"):
        asyncio.run(channel.handoff([5], final=True))
    assert extending["md1"] == 0 and channel.pending == 0
