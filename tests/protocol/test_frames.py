"""The PDKV frame: the SGLang side's sync codec and the router's asyncio codec speak
the same bytes, and both refuse what is not a frame."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from protocol.frames import (
    HEADER,
    MAGIC,
    MAX_BODY,
    MsgType,
    ProtocolError,
    header,
    read_frame,
    recv_frame,
    send_frame,
    write_frame,
)
from protocol.handoff import Extended, Handoff, Ready


def test_async_writer_and_sync_reader_agree_both_ways():
    """A router (asyncio) and a main-decode listener (threads) on a real socket."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    seen: list = []

    def md_side():
        conn, _ = server.accept()
        with conn:
            kind, room, body = recv_frame(conn)
            seen.append((kind, room, Handoff.decode(bytes(body))))
            send_frame(conn, MsgType.READY, room, Ready(812, 800).encode())

    thread = threading.Thread(target=md_side)
    thread.start()

    async def router_side():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = await write_frame(writer, MsgType.HANDOFF, 77, Handoff((5, 6, 7), True).encode())
        kind, room, body = await read_frame(reader)
        writer.close()
        return sent, kind, room, Ready.decode(body)

    sent, kind, room, ready = asyncio.run(router_side())
    thread.join(5)
    server.close()
    assert sent == Handoff.wire_bytes(3) == HEADER.size + 1 + 12
    assert seen == [(MsgType.HANDOFF, 77, Handoff((5, 6, 7), True))]
    assert (kind, room, ready) == (MsgType.READY, 77, Ready(812, 800))


@pytest.mark.parametrize(
    "raw, message",
    [
        (HEADER.pack(b"HTTP", 1, MsgType.WATCH, 0, 1, 0), "bad magic"),
        (HEADER.pack(MAGIC, 9, MsgType.WATCH, 0, 1, 0), "version 9"),
        (HEADER.pack(MAGIC, 1, 200, 0, 1, 0), "unknown message type 200"),
        (HEADER.pack(MAGIC, 1, MsgType.KV_CHUNK, 0, 1, MAX_BODY + 1), "exceeds"),
    ],
)
def test_both_readers_refuse_what_is_not_a_frame(raw, message):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        with pytest.raises(ProtocolError, match=message):
            recv_frame(b)

    async def read_async():
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        await read_frame(reader)

    with pytest.raises(ProtocolError, match=message):
        asyncio.run(read_async())


def test_extended_round_trips_and_header_is_twenty_bytes():
    ext = Extended(63, 62, 1234, 0.25, True)
    assert Extended.decode(ext.encode()) == ext
    assert len(header(MsgType.EXTENDED, 1, 0)) == HEADER.size == 20
