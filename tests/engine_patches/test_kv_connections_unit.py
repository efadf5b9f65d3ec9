"""The tcp KV transfer backend's connections without SGLang servers: prefill's sender
legs (early start, waits for prefill, the success/clear race), over socket pairs
(decode's pool of idle connections: test_conn_pool.py)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import torch

from engine_patches.kv_transfer.pool import BufferSet
from protocol.frames import MsgType, recv_frame, send_frame
from protocol.kv import Done, KvChunkHeader, TransferRequest


class _StandInManager:
    """Stands in for TcpKVManager's prefill side (no SGLang, no listener): a pool, the
    parked decode requests by room, and the transfer log."""

    def __init__(self, pool, bootstrap_s: float = 30.0, idle_s: float = 5.0) -> None:
        from engine_patches.kv_transfer.manager import Timeouts

        self.pool, self.page_size, self.aux = pool, 1, None
        self.line = None  # servers.kv_line_share off
        self.timeouts = Timeouts(bootstrap=bootstrap_s, idle=idle_s, first_data=5.0)
        self.parked: dict[int, list] = {}
        self.logged: list = []
        self.log = type("Log", (), {"write": lambda _, record: self.logged.append(record)})()

    def claim(self, room):
        parked = self.parked.get(room)
        return parked.pop(0) if parked else None

    def reuse_connection(self, conn, peer):
        conn.close()

    def close_room(self, room, reason):
        pass


def _wait_for(sender, states, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sender.poll() in states:
            return sender.poll()
        time.sleep(0.01)
    return sender.poll()


def test_an_early_start_room_sends_what_prefill_computed_before_decode_asked():
    """PDD's P->MD: prefill does not wait for main decode's transfer request (it crosses
    the WAN). Every chunk sent before the request came is replayed to it, and only the
    pages decode lacks cross; a plain room still waits for its decode."""
    import threading

    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.manager import Incoming
    from engine_patches.kv_transfer.sender import TcpKVSender
    from protocol.rooms import new_room

    src = [torch.arange(64, dtype=torch.float32).reshape(16, 4) + 100 * i for i in range(2)]
    item = 4 * 4
    pool = BufferSet([t.data_ptr() for t in src], [t.nbytes for t in src], [item] * 2)
    mgr = _StandInManager(pool)

    plain = TcpKVSender(mgr, "p:1", new_room())
    assert plain.poll() == KVPoll.Bootstrapping  # SGLang's way: wait for the decode

    room = new_room(early_start=True)
    sender = TcpKVSender(mgr, "p:1", room)
    assert sender.poll() == KVPoll.WaitingForInput  # computes at once
    assert sender.pop_decode_prefix_len() == 0  # offers every page
    sender.init(6)
    sender.send(np.array([3, 4]))  # the cached prefix, then the computed pages
    sender.send(np.array([8, 9, 10, 11]), state_indices=[])

    prefill_end, decode_end = socket.socketpair()
    request = TransferRequest(2, -1, 0, np.array([0, 1, 2, 3], np.int32))  # holds 2 pages
    mgr.parked[room] = [Incoming(prefill_end, "md:1", request, 0.0)]
    got: dict = {}

    def decode() -> None:
        pages = []
        while True:
            kind, _, body = recv_frame(decode_end)
            if kind == MsgType.KV_CHUNK:
                head = KvChunkHeader.decode(memoryview(body))
                pages.append((head.first, head.count, bytes(body[KvChunkHeader.size :])))
            elif kind == MsgType.DONE:
                got["done"], got["pages"] = Done.decode(bytes(body)), pages
                send_frame(decode_end, MsgType.ACK, room)
                return

    reader = threading.Thread(target=decode)
    reader.start()
    assert _wait_for(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    reader.join(5)
    assert got["done"].total_pages == 4
    rows = np.array([8, 9, 10, 11])  # pages 0-1 (3, 4) decode already held
    expected = b"".join(t.numpy().tobytes() for t in pool.read(rows))
    assert b"".join(p for *_, p in got["pages"]) == expected
    assert [r.status for r in mgr.logged] == ["success"]
    decode_end.close()


def test_an_early_start_room_no_decode_asks_for_fails_after_the_bootstrap_timeout():
    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.sender import TcpKVSender
    from protocol.rooms import new_room

    mgr = _StandInManager(pool=None, bootstrap_s=0.05)
    sender = TcpKVSender(mgr, "p:1", new_room(early_start=True))
    assert sender.poll() == KVPoll.WaitingForInput
    sender.init(2)
    assert _wait_for(sender, {KVPoll.Failed}, timeout_s=2) == KVPoll.Failed
    with pytest.raises(Exception, match="never requested room"):
        sender.failure_exception()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (the sender reads the kernel's TCP state)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        one = socket.create_connection(listener.getsockname())
        other, _ = listener.accept()
    return one, other


def _three_page_room(idle_s: float = 5.0, line=None):
    """A plain room of three pages whose decode request is parked: (room, its sender
    after init, decode's end of the connection, over loopback TCP)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.manager import Incoming
    from engine_patches.kv_transfer.sender import TcpKVSender
    from protocol.rooms import new_room

    src = [torch.zeros(16, 4) for _ in range(2)]
    pool = BufferSet([t.data_ptr() for t in src], [t.nbytes for t in src], [16] * 2)
    mgr = _StandInManager(pool, idle_s=idle_s)
    mgr.line = line
    room = new_room()
    prefill_end, decode_end = _tcp_pair()
    request = TransferRequest(0, -1, 0, np.array([0, 1, 2], np.int32))
    mgr.parked[room] = [Incoming(prefill_end, "d:1", request, 0.0)]
    sender = TcpKVSender(mgr, "p:1", room)
    assert sender.poll() == KVPoll.WaitingForInput
    sender.init(3)
    return room, sender, decode_end


def test_the_senders_wait_for_prefill_between_chunks_is_not_counted_as_wire_time():
    """A chunk, then prefill computes for 0.3 s, then the last chunk: the Done frame tells
    the receiver how long the wire idled (from when the first chunk was sent and
    acknowledged), and the record's seconds leave it out."""
    import threading
    import time

    from sglang.srt.disaggregation.base.conn import KVPoll

    from protocol.records import TransferRecord
    from protocol.tcp import stamp_arrivals

    room, sender, decode_end = _three_page_room()
    stamp_arrivals(decode_end)
    done: list[Done] = []
    chunks: list[tuple[KvChunkHeader, float, float]] = []  # header, first and last in
    first: list[float] = []

    def decode() -> None:
        while True:
            kind, _, body = recv_frame(
                decode_end,
                on_header=lambda kind, at: first.append(at),
                on_body=lambda kind, at: first.append(at),
            )
            if kind == MsgType.KV_CHUNK:
                chunks.append((KvChunkHeader.decode(body), first[-2], first[-1]))
            if kind == MsgType.DONE:
                done.append(Done.decode(bytes(body)))
                send_frame(decode_end, MsgType.ACK, room)
                return

    reader = threading.Thread(target=decode)
    reader.start()
    sender.send(np.array([0]))
    time.sleep(0.3)  # prefill computing the rest
    sender.send(np.array([1, 2]), state_indices=[])
    assert _wait_for(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    reader.join(5)
    assert 0.25 <= done[0].sender_wait_s < 5
    # the chunk after the wait says so, and the receiver's stamps see the wire idle
    (one, _, one_in), (two, two_out, _) = chunks
    assert (one.after_wait, two.after_wait) == (0, 1)
    assert 0.25 <= two_out - one_in < 5
    record = TransferRecord(room, "decode", "p", start=0.0, first_byte=10.0, end=10.5)
    record.sender_wait_s = done[0].sender_wait_s
    assert record.seconds == pytest.approx(0.5 - done[0].sender_wait_s)
    decode_end.close()


def test_a_prefill_slower_than_the_idle_timeout_between_chunks_is_not_a_stall():
    """A long prompt's next chunk on a busy prefill can take longer than decode's idle
    timeout (a test_pdd AIPerf run: 8 s between two chunks against 5 s): the sender
    says it is waiting, so decode's reader, timing out after ``idle`` without a frame as
    the receiver does, never gives up on a transfer that is alive."""
    import threading
    import time

    from sglang.srt.disaggregation.base.conn import KVPoll

    idle = 0.2
    room, sender, decode_end = _three_page_room(idle_s=idle)
    kinds: list[MsgType] = []

    def decode() -> None:
        decode_end.settimeout(idle)  # a stall: no frame this long
        while True:
            kind, _, _ = recv_frame(decode_end)
            kinds.append(kind)
            if kind == MsgType.DONE:
                send_frame(decode_end, MsgType.ACK, room)
                return

    reader = threading.Thread(target=decode)
    reader.start()
    sender.send(np.array([0]))
    time.sleep(5 * idle)  # prefill computing the rest
    sender.send(np.array([1, 2]), state_indices=[])
    assert _wait_for(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    reader.join(5)
    assert kinds[-1] == MsgType.DONE  # the reader never timed out
    assert kinds.count(MsgType.WAITING) >= 5  # about one a third of the idle timeout
    decode_end.close()


def test_clear_right_after_success_leaves_the_connection_to_its_next_request():
    """SGLang polls Success and at once clear()s the sender, while the sender's thread
    is still writing its record before it hands the connection back for the next
    request. clear() must not close that connection (it did: the pooled connection's
    next request read a closed socket, EBADF, and decode lost its warmest connection).
    The stand-in's log write holds the sender at that point until clear() has run."""
    import threading

    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.manager import Incoming
    from engine_patches.kv_transfer.sender import TcpKVSender
    from protocol.rooms import new_room

    src = [torch.zeros(16, 4) for _ in range(2)]
    pool = BufferSet([t.data_ptr() for t in src], [t.nbytes for t in src], [16] * 2)
    mgr = _StandInManager(pool)
    cleared, reused = threading.Event(), []
    mgr.log = type("Log", (), {"write": lambda _, record: cleared.wait(5)})()
    mgr.reuse_connection = lambda conn, peer: reused.append(conn.fileno())
    room = new_room()
    prefill_end, decode_end = socket.socketpair()
    request = TransferRequest(0, -1, 0, np.array([0, 1], np.int32))
    mgr.parked[room] = [Incoming(prefill_end, "d:1", request, 0.0)]
    sender = TcpKVSender(mgr, "p:1", room)
    assert sender.poll() == KVPoll.WaitingForInput
    sender.init(2)

    def decode() -> None:
        while recv_frame(decode_end)[0] != MsgType.DONE:
            pass
        send_frame(decode_end, MsgType.ACK, room)

    reader = threading.Thread(target=decode)
    reader.start()
    sender.send(np.array([0, 1]), state_indices=[])
    assert _wait_for(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    sender.clear()  # what SGLang's prefill does on Success
    cleared.set()
    reader.join(5)
    deadline = time.monotonic() + 5
    while not reused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reused and reused[0] != -1  # handed back open
    send_frame(decode_end, MsgType.TRANSFER_REQUEST, room)  # the next request gets there
    assert recv_frame(prefill_end)[0] == MsgType.TRANSFER_REQUEST
    decode_end.close()
    prefill_end.close()


def test_a_leg_leaves_its_share_of_the_line_whenever_it_has_sent_all_it_was_given():
    """servers.kv_line_share: a leg to a peer across the line joins the share with its
    first chunk; once the kernel has sent it, while prefill computes the next, it leaves
    the line to the others; the next chunk joins it again, and once that, its aux and its
    Done are sent it leaves before decode's Ack (bytes sent went at its pace)."""
    import threading

    from sglang.srt.disaggregation.base.conn import KVPoll

    from engine_patches.kv_transfer.line_share import HEADROOM, LineShare

    line = LineShare(1e6, frozenset({"d"}))  # the stand-in leg's peer is "d:1"
    room, sender, decode_end = _three_page_room(line=line)
    members: list[int] = []  # the share's membership after each change
    reshare = line._reshare

    def noted() -> None:
        if not members or members[-1] != len(line.members):
            members.append(len(line.members))
        reshare()

    line._reshare = noted
    acked: list[int] = []

    def decode() -> None:
        while True:
            kind, _, _ = recv_frame(decode_end)
            if kind == MsgType.DONE:
                time.sleep(0.2)  # decode's Ack a while after the Done frame
                acked.append(len(line.members))
                send_frame(decode_end, MsgType.ACK, room)
                return

    def members_become(n: int) -> bool:  # within 3 s
        deadline = time.monotonic() + 3
        while len(line.members) != n and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(line.members) == n

    reader = threading.Thread(target=decode)
    reader.start()
    sender.send(np.array([0]))
    assert members_become(1) or members == [1, 0]  # joined with the first chunk
    assert members_become(0)  # its chunk sent, prefill computing: not a member
    assert sender.poll() not in (KVPoll.Success, KVPoll.Failed)
    sender.send(np.array([1, 2]), state_indices=[])
    assert _wait_for(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    reader.join(5)
    assert members == [1, 0, 1, 0]  # a member for each chunk, none in between
    assert acked == [0]  # its Done sent, it had left before decode acknowledged it
    assert sender._legs[0].record.paced_bytes_s == int(HEADROOM * 1e6)  # joined alone
    decode_end.close()
