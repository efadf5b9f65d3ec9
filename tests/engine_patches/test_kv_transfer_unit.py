"""The tcp KV transfer backend's pieces without SGLang servers: wire format, pool views,
and the three narrow hooks that make ``tcp`` a backend SGLang knows."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import torch

from engine_patches.kv_transfer.pool import BufferSet, layout_digest
from protocol.env import Env
from protocol.frames import HEADER, MsgType, ProtocolError, recv_frame, send_frame
from protocol.kv import Done, KvChunkHeader, TransferRequest
from protocol.tcp import Chrono, TcpState, quiet_for, settled_state, tcp_state


def test_transfer_request_round_trip():
    req = TransferRequest(1234, 7, layout_digest([2048] * 8, 1), np.array([5, 9, 2**30], np.int32))
    back = TransferRequest.decode(req.encode())
    assert (back.decode_prefix_len, back.aux_index, back.layout_digest) == (
        1234,
        7,
        req.layout_digest,
    )
    assert back.dst_pages.tolist() == [5, 9, 2**30]


def test_frames_cross_a_real_socket_and_bad_peers_are_refused():
    a, b = socket.socketpair()
    payload = np.arange(1000, dtype=np.float32)
    sent = send_frame(a, MsgType.KV_CHUNK, 42, KvChunkHeader(3, 4, 99).encode(), payload)
    assert sent == HEADER.size + KvChunkHeader.size + payload.nbytes
    kind, room, body = recv_frame(b)
    assert (kind, room) == (MsgType.KV_CHUNK, 42)
    assert KvChunkHeader.decode(body) == KvChunkHeader(3, 4, 99)
    assert np.frombuffer(body[KvChunkHeader.size :], np.float32).tolist() == payload.tolist()

    done = Done(4, 16000, 0.25, 14480, 3, 5, 6, 7, sender_first_byte=1764921600.25)
    send_frame(a, MsgType.DONE, 1, done.encode())
    assert Done.decode(bytes(recv_frame(b)[2])) == done

    a.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(ProtocolError, match="bad magic"):
        recv_frame(b)
    a.close()
    with pytest.raises(ConnectionResetError):
        recv_frame(b)


def test_tcp_state_reads_the_kernels_window_and_retransmissions():
    """A new loopback connection starts from Linux's initial window (10 segments) and
    has retransmitted nothing; a socket that is not TCP says nothing rather than fail."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        mss = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        assert tcp_state(client)[:3] == (10 * mss, 0, 0)  # no loss yet: no slow start threshold
        client.close()
        peer.close()
    a, b = socket.socketpair()
    assert tcp_state(a) == TcpState()
    a.close()
    b.close()


def test_a_transfers_end_window_is_read_while_the_connection_idles_not_under_new_data():
    """The sender's end window is read a moment after the transfer (the kernel may undo
    a spurious cut meanwhile), but only while the connection carries nothing new: a
    next transfer's data grows the window, and that is not this transfer's end."""
    import threading

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        idle = tcp_state(client)
        assert settled_state(client, within_s=0.1) == idle  # nothing moved it
        drain = threading.Thread(target=lambda: [peer.recv(1 << 20) for _ in range(64)])
        drain.start()
        sending = threading.Timer(0.1, lambda: client.sendall(b"x" * (8 << 20)))
        sending.start()
        assert settled_state(client, within_s=3.0) == idle  # stopped at the new data
        sending.join()
        assert tcp_state(client).cwnd_bytes > idle.cwnd_bytes  # the data did grow it
        client.close()
        drain.join(timeout=5)
        peer.close()
    a, b = socket.socketpair()
    assert settled_state(a, within_s=0.05) == TcpState()  # not TCP: nothing, and no error
    a.close()
    b.close()


def test_chrono_says_when_a_sender_was_held_back_by_the_receivers_window():
    """A receiver that reads slowly (its window full) holds the sender back: the kernel's
    rwnd-limited time grows, and the transfer's share of it is the difference of two
    readings. A socket that is not TCP says nothing rather than fail."""
    import threading
    import time

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        start = tcp_state(client).chrono
        sending = threading.Thread(target=lambda: client.sendall(b"x" * (4 << 20)))
        sending.start()
        time.sleep(0.5)  # nobody reads: the receiver's window closes
        got = 0
        while got < 4 << 20:
            got += len(peer.recv(1 << 20))
        sending.join()
        spent = tcp_state(client).chrono.since(start)
        assert spent.rwnd_limited_s > 0.3
        assert spent.busy_s >= 0 and spent.sndbuf_limited_s >= 0
        client.close()
        peer.close()
    a, b = socket.socketpair()
    assert tcp_state(a).chrono == Chrono()
    a.close()
    b.close()


def test_buffer_set_reads_and_writes_pages_of_every_buffer():
    page, layers = 2, 3
    src = [torch.randn(16, page, 4) for _ in range(layers)]
    dst = [torch.zeros(16, page, 4) for _ in range(layers)]
    item = page * 4 * 4

    def view(ts):
        return BufferSet([t.data_ptr() for t in ts], [t.nbytes for t in ts], [item] * len(ts))

    rows = np.array([3, 0, 7])
    payload = b"".join(t.numpy().tobytes() for t in view(src).read(rows))
    view(dst).write(np.array([1, 2, 5]), memoryview(payload))
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[[1, 2, 5]], s[[3, 0, 7]])
        assert d[[0, 3, 4, 6]].abs().sum() == 0  # nothing else written


def test_the_plugin_patches_sglang_only_in_servers_the_testbed_launches():
    """Installed into an SGLang environment, the project patches nothing until the
    testbed's switch is set (each side in a fresh interpreter)."""
    import os
    import subprocess
    import sys

    probe = (
        "from sglang.srt.plugins import load_plugins; load_plugins(); "
        "from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES as c; "
        "print('tcp' in c)"
    )
    env = {k: v for k, v in os.environ.items() if k != Env.PLUGIN}
    runs = {  # both at once: each is mostly SGLang's import
        expected: subprocess.Popen(
            [sys.executable, "-c", probe],
            env=env if switch is None else {**env, Env.PLUGIN: switch},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for switch, expected in ((None, "False"), ("1", "True"))
    }
    for expected, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert out.strip().splitlines()[-1] == expected, err[-2000:]


def test_tcp_is_registered_in_sglangs_three_closed_lists(monkeypatch):
    from sglang.srt.plugins import load_plugins

    monkeypatch.setenv(Env.PLUGIN, "1")
    load_plugins()
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES
    from sglang.srt.disaggregation import utils
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend

    from engine_patches.kv_transfer.receiver import TcpKVReceiver
    from engine_patches.kv_transfer.sender import TcpKVSender

    assert "tcp" in DISAGG_TRANSFER_BACKEND_CHOICES
    assert TransferBackend("tcp").value == "tcp"
    assert utils.get_kv_class(TransferBackend("tcp"), KVClassType.SENDER) is TcpKVSender
    assert utils.get_kv_class(TransferBackend("tcp"), KVClassType.RECEIVER) is TcpKVReceiver
    # Every other backend still resolves through SGLang's own code.
    from sglang.srt.disaggregation.fake import FakeKVReceiver

    assert utils.get_kv_class(TransferBackend("fake"), KVClassType.RECEIVER) is FakeKVReceiver


def test_idle_hook_targets_exist():
    """An SGLang upgrade that renames what the plugin hooks must fail here."""
    from sglang.srt.managers.scheduler import Scheduler

    assert callable(Scheduler.on_idle) and callable(Scheduler.is_fully_idle)


def test_the_receiver_measures_the_wires_idle_before_a_chunk_sent_after_a_wait():
    """Hetero run 014709: the sender's own count of its wait for prefill fell 0.18 s
    short on a 2.99 s idle (a round trip's draws of the dilated jitter), and missed one
    wait its kernel counted busy. The receiver times it from its arrival stamps, where
    the sender flags the chunk; an unflagged gap (a loss's retransmission) is the
    line's and stays in the transfer's time."""
    from engine_patches.kv_transfer.receiver import WireGaps

    gaps = WireGaps()
    for first, last, flagged in [(10.0, 10.5, False), (11.0, 11.2, False), (14.0, 14.3, True)]:
        gaps.head(first)
        gaps.end(last)
        seconds = gaps.chunk(flagged)
    assert seconds == pytest.approx(14.0 - 11.2)
    gaps.head(15.0)
    gaps.end(None)  # an unstamped read: nothing to measure the next gap from
    gaps.chunk(True)
    gaps.head(18.0)
    gaps.end(18.1)
    assert gaps.chunk(True) == pytest.approx(14.0 - 11.2 + 15.0 - 14.3)


def test_a_receiver_says_its_kv_is_still_coming_until_its_wire_goes_quiet():
    """Main decode stretches a hold while the KV it waits for still comes
    (``prefix_wait``): before any chunk prefill may still compute; after one, the
    kernel's time since data last arrived says whether the wire moves (a chunk is up
    to 8 MB, so the frames cannot say). Real loopback TCP; an arrived transfer is
    as good as in the cache (SGLang merges it next), a failed one never comes."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.receiver import TcpKVReceiver

    receiver = TcpKVReceiver(SimpleNamespace(), "127.0.0.1:1", 7)
    receiver.init()
    assert receiver.still_coming(0.0)  # asked, no chunk yet: prefill computes
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        receiver._sock, receiver._state, receiver.chunked = client, KVPoll.Transferring, True
        peer.sendall(b"x" * 1000)
        time.sleep(0.3)
        assert quiet_for(client) >= 0.25
        assert receiver.still_coming(5.0) and not receiver.still_coming(0.25)
        peer.sendall(b"y" * 1000)
        time.sleep(0.05)
        assert receiver.still_coming(0.25)  # data again: moving
        receiver._state = KVPoll.Success  # arrived: the prefix cache takes it next
        assert receiver.still_coming(0.0)
        receiver._state = KVPoll.Failed
        assert not receiver.still_coming(5.0)
        client.close()
        peer.close()
    a, b = socket.socketpair()
    assert quiet_for(a) is None  # not TCP: the kernel does not say
    a.close()
    b.close()
