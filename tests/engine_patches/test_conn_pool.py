"""Decode's pool of KV connections (engine_patches.kv_transfer.conn_pool) over socket
pairs, without SGLang: which idle connection a transfer gets, which are dropped, and
the pool lines the router mirrors the pool from."""

from __future__ import annotations

import select
import socket

from engine_patches.kv_transfer.conn_pool import ConnPool, _name
from protocol.frames import MsgType, send_frame
from protocol.kv import Window
from protocol.records import TRANSFER_LOG_SIDES, JsonlWriter, PoolRecord, from_dict, read_jsonl


def _pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    """Connected TCP pairs on loopback (each end has its own ``ip:port``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    out = []
    for _ in range(n):
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        out.append((a, b))
    listener.close()
    return out


def _lines(path) -> list[PoolRecord]:
    return [from_dict(TRANSFER_LOG_SIDES[d["side"]], d) for d in read_jsonl(path)]


def test_decode_reuses_its_warmest_idle_connection_and_drops_stale_and_closed_ones(tmp_path):
    """The idle connection whose sender reported the largest window goes first, a closed
    one is skipped, one idle past reuse_s is closed, and an empty pool says None (decode
    then connects anew). The sender's Window frame re-ranks the pool."""
    pool = ConnPool(reuse_s=30.0)
    pairs = _pairs(4)
    cold, warm, closed, stale = (a for a, _ in pairs)
    pool.checkin("p:1", cold, window=14_480, room=1)
    pool.checkin("p:1", warm, window=900_000, room=2)
    pool.checkin("p:1", closed, window=2_000_000, room=3)
    pool.checkin("p:1", stale, window=5_000_000, room=4)
    pairs[2][1].close()  # its peer went away while it idled
    pool._idle["p:1"][3].since -= 31.0  # idle past reuse_s
    assert pool.checkout("p:1") is warm
    assert stale.fileno() == -1 and closed.fileno() == -1  # both closed, not reused
    assert pool.checkout("p:1") is cold
    assert pool.checkout("p:1") is None
    # The sender's Window frame (after the Ack: losses of the last windows counted)
    # re-ranks the pool; a connection carrying anything else is not reused.
    shrunk, grown, odd = _pairs(3)
    pool.checkin("p:1", shrunk[0], window=900_000)
    pool.checkin("p:1", grown[0], window=300_000)
    pool.checkin("p:1", odd[0], window=2_000_000)
    send_frame(shrunk[1], MsgType.WINDOW, 1, Window(400_000, 400_000).encode())
    send_frame(grown[1], MsgType.WINDOW, 2, Window(600_000).encode())
    send_frame(odd[1], MsgType.ACK, 3)
    assert pool.checkout("p:1") is grown[0]
    assert odd[0].fileno() == -1
    assert pool.checkout("p:1") is shrunk[0]
    assert shrunk[0].gettimeout() is None  # its timeout as it was
    for a, b in [*pairs, shrunk, grown, odd]:
        a.close()
        b.close()


def test_every_checkout_and_checkin_is_a_pool_line_with_what_stays_idle(tmp_path):
    """What the router's WAN model mirrors: each change names the connection (its decode
    end, as prefill's log names its peer), the window decode ranks it by (0: a new
    connection), and every connection idle after the change with its window and room."""
    log = tmp_path / "transfers.jsonl"
    pool = ConnPool(reuse_s=30.0, log=JsonlWriter(log))
    (a, a_far), (b, b_far) = _pairs(2)
    pool.opened("p:1", 10, a)  # room 10 found the pool empty
    pool.checkin("p:1", a, 200_000, 150_000, room=10)
    pool.checkin("p:1", b, 150_000, 0, room=11)
    send_frame(a_far, MsgType.WINDOW, 10, Window(120_000, 100_000).encode())
    select.select([a], [], [], 5)  # arrived (decode reads it at the checkout)
    assert pool.checkout("p:1", room=12) is b  # a's Window frame ranks it below b
    opened, back_a, back_b, taken = _lines(log)

    assert (opened.event, opened.room, opened.conn, opened.cwnd_bytes) == (
        "checkout",
        10,
        _name(a),
        0,
    )
    assert opened.idle == [] and opened.peer == "p:1"
    assert (back_a.event, back_a.conn, back_a.cwnd_bytes, back_a.ssthresh_bytes) == (
        "checkin",
        _name(a),
        200_000,
        150_000,
    )
    assert [i.conn for i in back_b.idle_conns] == [_name(a), _name(b)]
    assert (taken.event, taken.room, taken.conn, taken.cwnd_bytes) == (
        "checkout",
        12,
        _name(b),
        150_000,
    )
    (left,) = taken.idle_conns  # a stays, with the window its Window frame told
    assert (left.conn, left.cwnd_bytes, left.ssthresh_bytes, left.room) == (
        _name(a),
        120_000,
        100_000,
        10,
    )
    assert left.idle_s >= 0 and taken.time >= back_b.time
    assert _name(a) == "{}:{}".format(*a_far.getpeername())  # prefill's name for it
    for s in (a, a_far, b, b_far):
        s.close()
