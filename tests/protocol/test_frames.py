"""The PDKV frame: the SGLang side's sync codec and the router's asyncio codec speak
the same bytes, and both refuse what is not a frame."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest

from protocol import clock
from protocol.frames import (
    BATCH_MIN_BYTES,
    HEADER,
    MAGIC,
    MAX_BODY,
    TAG_BYTES,
    VERSION,
    MsgType,
    ProtocolError,
    frame_size,
    header,
    read_frame,
    recv_exact,
    recv_frame,
    send_frame,
    set_frame_key,
    tag,
    write_frame,
)
from protocol.handoff import Extended, Handoff, Ready


@pytest.fixture(autouse=True)
def no_key_unless_asked():
    """Frames untagged, whatever an earlier test in this process left behind."""
    set_frame_key(None)


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
        (HEADER.pack(MAGIC, VERSION - 1, MsgType.WATCH, 0, 1, 0), f"version {VERSION - 1}"),
        (HEADER.pack(MAGIC, VERSION, 200, 0, 1, 0), "unknown message type 200"),
        (HEADER.pack(MAGIC, VERSION, MsgType.KV_CHUNK, 0, 1, MAX_BODY + 1), "exceeds"),
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


@pytest.fixture
def keyed():
    """This process holds a deployment's frame key for the test, none afterwards."""
    set_frame_key(bytes(range(32)))
    yield
    set_frame_key(None)


def _pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    return a, b


def test_with_a_key_every_frame_carries_a_tag_that_verifies_both_codecs(keyed):
    a, b = _pair()
    payload = memoryview(bytes(range(256)) * 64)
    sent = send_frame(a, MsgType.KV_CHUNK, 9, b"head", payload)
    assert sent == HEADER.size + 4 + payload.nbytes + TAG_BYTES == frame_size(4 + payload.nbytes)
    kind, room, body = recv_frame(b)
    assert (kind, room, bytes(body)) == (MsgType.KV_CHUNK, 9, b"head" + bytes(payload))

    async def roundtrip():
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await write_frame(writer, MsgType.WATCH, 5, b"")
        got = await read_frame(reader)
        writer.close()
        server.close()
        return got

    async def echo(reader, writer):
        kind, room, body = await read_frame(reader)
        await write_frame(writer, MsgType.READY, room, Ready(3, 1).encode())
        writer.close()

    assert asyncio.run(roundtrip())[:2] == (MsgType.READY, 5)


def test_a_tampered_body_a_forged_tag_or_a_missing_tag_is_refused(keyed):
    a, b = _pair()
    good = header(MsgType.HANDOFF, 1, 5) + b"\x01abcd"
    a.sendall(good + bytes(TAG_BYTES))  # a tag not made with the key
    with pytest.raises(ProtocolError, match="failed authentication"):
        recv_frame(b)
    a, b = _pair()
    head = header(MsgType.HANDOFF, 1, 5)
    a.sendall(head + b"\x01abce" + tag(head, b"\x01abcd"))  # one byte changed in flight
    with pytest.raises(ProtocolError, match="failed authentication"):
        recv_frame(b)
    a, b = _pair()
    a.sendall(HEADER.pack(MAGIC, VERSION, MsgType.WATCH, 0, 1, 0))  # from a peer without the key
    with pytest.raises(ProtocolError, match="no frame key"):
        recv_frame(b)


def test_a_keyless_side_refuses_tagged_frames_rather_than_misreading_them():
    set_frame_key(bytes(32))
    head = header(MsgType.WATCH, 1, 0)
    raw = head + tag(head, b"")
    set_frame_key(None)
    a, b = _pair()
    a.sendall(raw)
    with pytest.raises(ProtocolError, match="this side has no frame key"):
        recv_frame(b)


class _CountingSocket:
    """A real socket that counts its reads (recv_into): how often the reader woke."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.reads = sock, 0

    def recv_into(self, view, n):
        self.reads += 1
        return self.sock.recv_into(view, n)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def _pair() -> tuple[socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    reader, _ = server.accept()
    server.close()
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sender, reader


def test_a_large_frame_arriving_segment_by_segment_wakes_its_reader_in_batches():
    """A KV chunk comes in WAN-sized segments; the decode server's reading thread
    should not wake (and take the interpreter's lock from the scheduler) for each.
    Read a segment at a time, this frame took 726 reads."""
    sender, reader = _pair()
    body = bytes(range(256)) * 4096  # 1 MiB
    segments = range(0, len(body), 1448)

    def trickle():
        send_frame(sender, MsgType.KV_CHUNK, 5, b"")  # a small frame first
        frame = header(MsgType.KV_CHUNK, 6, len(body)) + body
        sender.sendall(frame[: HEADER.size])
        for start in segments:
            sender.sendall(frame[HEADER.size + start : HEADER.size + start + 1448])
            time.sleep(0.0002)
        send_frame(sender, MsgType.ACK, 7)  # a small frame after: no mark left behind

    try:
        reader.settimeout(10)
        counted = _CountingSocket(reader)
        thread = threading.Thread(target=trickle)
        thread.start()
        assert recv_frame(counted)[:2] == (MsgType.KV_CHUNK, 5)
        counted.reads = 0
        kind, room, got = recv_frame(counted)
        assert (kind, room, bytes(got)) == (MsgType.KV_CHUNK, 6, body)
        assert counted.reads < len(segments) / 4, f"{counted.reads} reads for {len(segments)}"
        assert recv_frame(counted)[:2] == (MsgType.ACK, 7)
        assert reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        thread.join()
    finally:
        sender.close()
        reader.close()


def test_a_large_read_that_trickles_finishes_and_one_that_stalls_times_out():
    """Bytes arriving slower than a batch a timeout are progress, not a stall (they
    are read once the timeout passes); no byte at all within a timeout is a stall."""
    sender, reader = _pair()
    n = BATCH_MIN_BYTES * 2
    try:
        reader.settimeout(0.3)

        def trickle():
            for _ in range(4):
                sender.sendall(b"x" * 100)
                time.sleep(0.2)
            sender.sendall(b"y" * (n - 400))

        thread = threading.Thread(target=trickle)
        thread.start()
        assert bytes(recv_exact(reader, n)) == b"x" * 400 + b"y" * (n - 400)
        thread.join()
        sender.sendall(b"z" * 100)  # then nothing: the read times out, the mark reset
        with pytest.raises(TimeoutError):
            recv_exact(reader, n)
        assert reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        sender.close()
        reader.close()


def test_a_paced_kv_socket_has_the_kernels_pacing_on_and_still_carries_frames():
    """servers.kv_pacing: prefill's accepted KV connections get a finite (uncapping)
    SO_MAX_PACING_RATE, which turns on the kernel's TCP pacing; frames flow as before."""
    import socket
    import struct

    from protocol.tcp import SO_MAX_PACING_RATE, enable_pacing

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            rate = server.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8)
            assert struct.unpack("=Q", rate)[0] == 2**64 - 1  # the default: no pacing
            enable_pacing(server)
            rate = server.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8)
            assert struct.unpack("=Q", rate)[0] == 2**63
            send_frame(server, MsgType.KV_CHUNK, 7, b"x" * 100_000)
            kind, room, body = recv_frame(client)
            assert (kind, room, len(body)) == (MsgType.KV_CHUNK, 7, 100_000)


def test_a_connection_is_idle_once_all_it_sent_is_acknowledged_and_says_since_when():
    """What the KV sender counts as the wire's idle time while it waits for prefill:
    only once none of its bytes is queued or in flight (counting the whole wait, the
    chunk before's own time on the wire was lost), and from when the last of them
    reached the peer (on loopback: about when it was read and acknowledged)."""
    from protocol.tcp import idle_since

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            client.setblocking(False)
            sent = 0
            with contextlib.suppress(BlockingIOError):  # until the peer's buffer is full
                while sent < 64 << 20:
                    sent += client.send(b"x" * 65536)
            assert idle_since(client) is None  # unread: bytes queued and unacknowledged
            got = 0
            server.settimeout(5)
            while got < sent:
                got += len(server.recv(1 << 20))
            time.sleep(0.3)
            idle = idle_since(client)
            assert idle is not None and 0.25 <= idle <= 2.0, idle
    a, b = socket.socketpair()  # not TCP: the kernel does not say
    with a, b:
        assert idle_since(a) is None


def test_idle_starts_a_round_trip_before_the_last_ack_when_that_is_after_the_last_send(
    monkeypatch,
):
    """The kernel's tcp_info here is a stand-in (a loopback connection has no queue
    to wait in): a connection whose last segment left 1 s ago but waited in the line's
    bottleneck queue, its ack back 0.2 s ago over a 0.1 s minimum round trip. The peer
    got that segment about 0.25 s ago and the next byte needs another 0.05 s, so the
    wire has idled 0.3 s, not the 1 s since the send."""
    from protocol import tcp

    info = tcp._TCP_INFO.unpack(bytes(tcp._TCP_INFO.size))  # zeros, but for the three

    def fake_info(sock, last_sent_ms, last_ack_ms, min_rtt_us):
        got = list(info)
        got[tcp._LAST_DATA_SENT], got[tcp._LAST_ACK_RECV] = last_sent_ms, last_ack_ms
        got[tcp._MIN_RTT] = min_rtt_us
        return tuple(got)

    monkeypatch.setattr(tcp.fcntl, "ioctl", lambda *a: b"\0" * 4)  # nothing queued
    monkeypatch.setattr(tcp, "_info", lambda sock: fake_info(sock, 1000, 200, 100_000))
    assert tcp.idle_since(None) == pytest.approx(0.3)
    # an ack long before the last send (a pure ack of older bytes): the send decides
    monkeypatch.setattr(tcp, "_info", lambda sock: fake_info(sock, 150, 900, 20_000))
    assert tcp.idle_since(None) == pytest.approx(0.15)


@pytest.mark.parametrize("stamped", [True, False])
def test_a_frame_header_says_when_it_arrived_not_when_it_was_read(stamped):
    """The KV receiver's first and last byte: a decode server's thread may read a frame
    long after it arrived. With the kernel's arrival stamps the header reports the
    arrival; without them (the fallback, e.g. TLS) the time it was read."""
    from protocol.tcp import stamp_arrivals

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            if stamped:
                stamp_arrivals(server)
                time.sleep(0.1)  # the kernel turns stamping on in deferred work
            send_frame(client, MsgType.DONE, 3, b"done")
            sent = clock.now()
            time.sleep(0.3)  # the reader is busy elsewhere
            seen = []
            kind, room, body = recv_frame(server, on_header=lambda k, at: seen.append((k, at)))
            read = clock.now()
    assert (kind, room, bytes(body)) == (MsgType.DONE, 3, b"done")
    [(k, arrived)] = seen
    assert k == MsgType.DONE
    if stamped:
        assert sent - 0.05 <= arrived <= sent + 0.05, arrived - sent
    else:
        assert read - 0.05 <= arrived <= read, read - arrived
