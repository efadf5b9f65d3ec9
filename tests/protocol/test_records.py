"""Records: one writer and one reader for every JSON-lines file the testbed keeps."""

from __future__ import annotations

import pytest

from protocol.env import Env, kv_timeout
from protocol.names import HandoffMode, Pipeline, Role
from protocol.records import (
    HandoffRecord,
    JsonlWriter,
    RequestRecord,
    TransferRecord,
    read_jsonl,
    read_records,
)


def test_written_records_read_back_equal(tmp_path):
    path = tmp_path / "logs" / "records.jsonl"
    writer = JsonlWriter(path)
    rec = RequestRecord(
        "r1",
        "pdd",
        "/generate",
        arrival=10.0,
        first_token=10.5,
        finish=11.0,
        token_times=[10.5, 10.7, 11.0],
        pipeline=Pipeline.P_RLD_MD,
    )
    writer.write(rec)
    (back,) = read_records(path)
    assert back == rec and back.ttft == 0.5 and back.e2e == 1.0
    assert back.itls == pytest.approx([0.2, 0.3])


def test_a_last_line_cut_short_is_skipped_and_a_bad_line_inside_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    JsonlWriter(path).write(TransferRecord(room=1, side="decode", peer="p", start=0.0))
    with open(path, "a") as f:
        f.write('{"room": 2, "side": "dec')  # a writer killed mid-line
    assert [d["room"] for d in read_jsonl(path)] == [1]
    path.write_text('{"room": 2\n[1]\n{"room": 3}\n')
    with pytest.warns(UserWarning, match="t.jsonl:1") as said:
        assert [d["room"] for d in read_jsonl(path)] == [3]
    assert any("t.jsonl:2" in str(w.message) for w in said)


def test_unknown_fields_are_left_out_and_transfer_times_derive(tmp_path):
    path = tmp_path / "x.jsonl"
    JsonlWriter(path).write(
        {
            "room": 5,
            "side": "decode",
            "peer": "p",
            "start": 1.0,
            "first_byte": 2.0,
            "end": 3.5,
            "status": "success",
            "from_a_newer_version": True,
        }
    )
    (t,) = read_records(path, TransferRecord)
    assert t.ok and t.seconds == 1.5
    h = HandoffRecord(5, 3, 3, 33, 0.01, 9, 9, True, 1, 1.0, 0.0, 1.1)
    assert h.side == "handoff"


def test_names_and_env_variables_are_defined_once():
    assert Role.RELAY_DECODE.launched_as is Role.DECODE and Role.PREFILL.launched_as is Role.PREFILL
    assert Role.MAIN_DECODE.short == "MD"
    assert HandoffMode.CATCH_UP.ended_on_md and not HandoffMode.NONE.ended_on_md
    assert Pipeline("P->RLD->MD") is Pipeline.P_RLD_MD
    assert kv_timeout("idle") is Env.KV_IDLE_TIMEOUT_S == "PDD_KV_IDLE_TIMEOUT_S"
