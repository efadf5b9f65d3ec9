"""The router's index of the servers' transfer logs (files written here stand in for a
server's): lines are read as they grow, a torn or foreign line is skipped, a room is
forgotten once joined."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest

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


def _p_md_route(tmp_path, md_host: str):
    """A P->MD route whose servers' transfer logs are files in ``tmp_path``."""
    from protocol.names import Pipeline, Role
    from testbed.router.config import ServerEntry
    from testbed.router.policies import Route

    logs = {side: tmp_path / f"{side}.jsonl" for side in ("p", "md")}
    prefill = ServerEntry(
        name="p", url="http://p", role=Role.PREFILL, host="p", transfer_log=logs["p"]
    )
    md = ServerEntry(
        name="md",
        url="http://md",
        role=Role.MAIN_DECODE,
        site="B",
        host=md_host,
        transfer_log=logs["md"],
    )
    return logs, Route(Pipeline.P_MD, "test", md, prefill=prefill, main_decode=md)


def test_a_transfer_cut_short_gives_the_record_no_transfer_time(tmp_path):
    """Its bytes and its reason are kept, but a part of a transfer is not what the WAN
    prediction is measured against."""
    from protocol.records import RequestRecord

    logs, route = _p_md_route(tmp_path, md_host="md")
    logs["p"].write_text("")
    logs["md"].write_text(
        line(1, kv_bytes=8, wire_bytes=9, status="success")
        + line(2, kv_bytes=8, wire_bytes=9, status="failed", reason="aborted on decode")
    )
    index = TransferIndex(list(logs.values()))
    done, cut = (
        RequestRecord(request_id=str(r), system="pdd", endpoint="/generate", arrival=0.0, room=r)
        for r in (1, 2)
    )
    for record in (done, cut):
        asyncio.run(index.join(route, record))
    assert done.kv_transfer_s == 0.5 and done.kv_link == "wan"
    assert cut.kv_transfer_s is None and cut.kv_bytes == 8 and cut.kv_link == "wan"
    assert "aborted on decode" in cut.error


@pytest.mark.parametrize(
    ("md_host", "peer"), [("10.0.2.1", "10.0.2.1:40756"), ("localhost", "127.0.0.1:40756")]
)
def test_the_record_counts_the_senders_retransmissions_to_its_decoder(tmp_path, md_host, peer):
    """The receiver has the sender's count as of the Done frame; the sender's own line,
    written after decode's Ack, has the losses of the last windows too. Only the line to
    the record's decoder counts (a dual-path room also sends to relay decode), its host
    named by address or, in an inventory, by a hostname."""
    from protocol.records import RequestRecord

    logs, route = _p_md_route(tmp_path, md_host=md_host)

    def sent(peer: str, retransmits: int) -> str:
        r = TransferRecord(
            room=1,
            side="prefill",
            peer=peer,
            start=1.0,
            end=2.1,
            first_byte=1.4,
            status="success",
            retransmits=retransmits,
        )
        return json.dumps(asdict(r)) + "\n"

    logs["p"].write_text(sent(peer, 163) + sent("10.0.1.2:40111", 999))
    logs["md"].write_text(line(1, kv_bytes=8, wire_bytes=9, status="success", retransmits=0))
    record = RequestRecord(request_id="1", system="pdd", endpoint="/generate", arrival=0.0, room=1)
    asyncio.run(TransferIndex(list(logs.values())).join(route, record))
    assert record.kv_retransmits == 163


def test_prefills_stamp_comes_from_the_receivers_line_before_the_senders_is_written(tmp_path):
    """The sender writes its line once its connection settled after decode's Ack (up to
    2 s later); the record, joined when the receiver's line is in, still has when P's
    first chunk left: the Done frame carried it. An older receiver's line without it
    leaves the stamp to the sender's line."""
    from protocol.records import RequestRecord

    logs, route = _p_md_route(tmp_path, md_host="md")

    def joined() -> RequestRecord:
        record = RequestRecord(
            request_id="1", system="pdd", endpoint="/generate", arrival=0.0, room=1
        )
        asyncio.run(TransferIndex(list(logs.values())).join(route, record))
        return record

    logs["p"].write_text("")
    logs["md"].write_text(line(1, status="success", sender_first_byte=1.25))
    assert joined().prefill_first_byte == 1.25
    logs["md"].write_text(line(1, status="success"))
    assert joined().prefill_first_byte is None  # nothing says when P sent
    sender = TransferRecord(room=1, side="prefill", peer="md:1", start=1.0, first_byte=1.3)
    logs["p"].write_text(json.dumps(asdict(sender)) + "\n")
    assert joined().prefill_first_byte == 1.3
