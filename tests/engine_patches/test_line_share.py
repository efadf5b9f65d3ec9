"""Prefill's KV sends across the WAN share the line's rate
(engine_patches.kv_transfer.line_share), on real TCP sockets over loopback: the kernel
takes each share as the socket's pacing cap, and paces what it sends by it."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from engine_patches.kv_transfer.line_share import HEADROOM, LineShare
from protocol.env import Env
from protocol.tcp import pacing_cap


@pytest.fixture
def pairs():
    """Connected TCP sockets on loopback: (sender, receiver) pairs."""
    server = socket.create_server(("127.0.0.1", 0))
    made = []

    def pair():
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
        made.extend([sender, receiver])
        return sender, receiver

    yield pair
    for s in [*made, server]:
        s.close()


def test_senders_across_the_line_split_its_rate_and_the_rest_take_it_back(pairs):
    line = LineShare(10e6, frozenset({"10.77.2.10"}))
    (a, _), (b, _) = pairs(), pairs()
    line.join(a)
    assert pacing_cap(a) == pytest.approx(HEADROOM * 10e6, rel=1e-6)
    line.join(b)
    line.join(b)  # once, however often its chunks come
    assert pacing_cap(a) == pacing_cap(b) == pytest.approx(HEADROOM * 5e6, rel=1e-6)
    line.leave(a)
    assert pacing_cap(b) == pytest.approx(HEADROOM * 10e6, rel=1e-6)
    line.leave(a)  # twice: nothing more
    assert line.members == [b]
    assert line.crosses("10.77.2.10:41234") and not line.crosses("10.77.1.11:41234")


def test_the_kernel_sends_no_faster_than_the_share(pairs):
    """Two senders sharing 1 MB/s: each 0.45 MB/s, so 1.35 MB takes about three seconds
    (loopback would carry it in a millisecond)."""
    line = LineShare(1e6, frozenset({"127.0.0.1"}))
    (a, ra), (b, _) = pairs(), pairs()
    line.join(a)
    line.join(b)
    got = []

    def drain():
        n = 0
        while n < 1_350_000:
            n += len(ra.recv(1 << 16))
        got.append(time.monotonic())

    reader = threading.Thread(target=drain)
    reader.start()
    start = time.monotonic()
    a.sendall(b"k" * 1_350_000)
    reader.join(10)
    assert got and got[0] - start > 1.5


def test_the_share_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(Env.KV_LINE, raising=False)
    assert LineShare.from_env() is None
    monkeypatch.setenv(Env.KV_LINE, json.dumps({"rate_bytes_s": 2e6, "peers": ["10.77.2.10"]}))
    line = LineShare.from_env()
    assert line.rate_bytes_s == 2e6 and line.peers == {"10.77.2.10"}


def test_a_sender_leaves_the_share_once_the_kernel_has_sent_all_it_was_given(pairs):
    """Bytes sent left at the sender's pace, so a leg that has sent everything gives the
    line to the others at once, not a round trip later with its acknowledgement; bytes
    still in its socket would drain at its old pace beside the others', so it stays
    while any are there (here: a receiver that reads nothing, its window full)."""
    line = LineShare(50e6, frozenset({"127.0.0.1"}))
    (a, ra), (b, _) = pairs(), pairs()
    a.setblocking(False)
    try:  # more than the receive buffer and window take: the rest stays unsent
        while True:
            a.send(b"k" * 65536)
    except BlockingIOError:
        pass
    a.setblocking(True)
    line.join(a)
    line.join(b)
    assert not LineShare.all_sent(a)
    started = time.monotonic()
    assert not line.leave_once_sent(a)  # its bytes do not go: it stays, bounded
    assert a in line and time.monotonic() - started < 10
    ra.setblocking(False)
    reader_done = threading.Event()

    def drain():
        while not reader_done.is_set():
            try:
                if not ra.recv(1 << 20):
                    return
            except BlockingIOError:
                time.sleep(0.001)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        assert line.leave_once_sent(a)
        assert LineShare.all_sent(a) and line.members == [b]
        assert pacing_cap(b) == pytest.approx(HEADROOM * 50e6, rel=1e-6)  # the line is b's
    finally:
        reader_done.set()
        reader.join(5)
