"""The router's index of the servers' transfer logs (files written here stand in for a
server's): lines are read as they grow, a torn or foreign line is skipped, a room is
forgotten once joined."""

from __future__ import annotations

import json
from dataclasses import asdict

from protocol.records import TransferRecord
from testbed.router.transfers import TransferIndex


def line(room: int, side: str = "decode", **kw) -> str:
    r = TransferRecord(room=room, side=side, peer="p", start=1.0, end=2.0, first_byte=1.5, **kw)
    return json.dumps(asdict(r)) + "\n"


def test_lines_are_read_as_they_grow_bad_ones_skipped_and_rooms_forgotten(tmp_path):
    log = tmp_path / "transfers.jsonl"
    seen = []
    index = TransferIndex([log], on_line=lambda path, side, rec: seen.append((side, rec.room)))
    assert index.peek(1, log) is None  # no file yet
    log.write_text(line(1) + "{torn\n" + '"a string"\n' + line(2, kv_bytes=5)[:20])
    assert index.peek(1, log).room == 1 and index.peek(2, log) is None  # half a line: later
    with open(log, "a") as f:
        f.write(line(2, kv_bytes=5)[20:] + line(2, side="prefill"))
    assert index.peek(2, log).kv_bytes == 5 and len(index.sent(2, log)) == 1
    assert seen == [("decode", 1), ("decode", 2), ("prefill", 2)]
    index.forget(2)
    assert index.peek(2, log) is None and index.sent(2, log) == []
    assert index.peek(1, log) is not None
