"""Inter-token gaps split by whether WAN KV was landing on the streaming decode server,
from records alone (no servers): the records stand in for what a router would write."""

from __future__ import annotations

import pandas as pd
import pytest

from protocol.records import RequestRecord
from reports.itl import while_kv_lands
from reports.run_data import RunData, SystemRun


def rec(i, pipeline, tokens, server="md1", wan=None, relay_stopped=None) -> dict:
    r = RequestRecord(
        f"r{i}",
        "pdd",
        "/generate",
        arrival=0.0,
        first_token=tokens[0],
        finish=tokens[-1],
        token_times=tokens,
        pipeline=pipeline,
        decode_server=server,
        relay_stopped=relay_stopped,
        wan_first_byte=wan[0] if wan else None,
        wan_end=wan[1] if wan else None,
        status="ok",
    )
    return r.__dict__


def test_gaps_while_kv_lands_on_the_same_server_are_told_apart():
    records = pd.DataFrame(
        [
            # streams on md1 at 10 ms, then 100 ms gaps while r1's KV lands (5.0-5.5 s)
            rec(0, "P->MD", [4.90, 4.91, 4.92, 5.02, 5.12, 5.22, 5.6, 5.61]),
            rec(1, "P->MD", [6.0, 6.01], wan=(5.0, 5.5)),
            # KV landing on another server does not count against md1's streams
            rec(2, "P->MD", [9.0, 9.01], server="md2", wan=(8.0, 8.5)),
            rec(3, "P->MD", [8.1, 8.11, 8.12]),
            # a relayed request: relay decode's gaps (before it stopped) are left out
            rec(4, "P->RLD->MD", [5.1, 5.4, 5.7, 5.71], relay_stopped=5.65),
        ]
    )
    run = RunData(path=None, scenario={}, systems={"pdd": SystemRun("pdd", records, {})})
    row = while_kv_lands(run).iloc[0]
    # r0's gaps ending 5.02, 5.12, 5.22, 5.6 overlap r1's landing; r4 adds none
    assert row["gaps_while_kv_lands"] == 4
    assert row["gaps_otherwise"] == 3 + 1 + 1 + 2 + 1  # r0, r1, r2, r3, r4 after the stop
    assert row["itl_p50_ms_while_kv_lands"] == pytest.approx(100, abs=1)
    assert row["itl_p50_ms_otherwise"] == pytest.approx(10, abs=1)


def test_a_system_without_wan_transfers_has_every_gap_outside():
    records = pd.DataFrame([rec(0, "colocated", [1.0, 1.02, 1.04])])
    run = RunData(path=None, scenario={}, systems={"colocated": SystemRun("c", records, {})})
    row = while_kv_lands(run).iloc[0]
    assert row["gaps_while_kv_lands"] == 0 and pd.isna(row["itl_p50_ms_while_kv_lands"])
    assert row["gaps_otherwise"] == 2
