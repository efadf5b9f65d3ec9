"""TTFT parts, prediction error and routing regret from records alone (no servers):
the records stand in for what a router would have written."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from protocol.metrics import TtftPart
from protocol.records import RequestRecord
from reports import ttft
from reports.run_data import RunData, SystemRun


def rec(i, pipeline, first, prefill=None, held=None, **kw) -> dict:
    r = RequestRecord(
        f"r{i}",
        "pdd",
        "/generate",
        arrival=100.0,
        dispatched=100.01,
        prefill_first_byte=prefill,
        kv_end=held,
        first_token=first,
        finish=first + 1,
        pipeline=pipeline,
        **kw,
    )
    return r.__dict__


def test_parts_add_up_along_the_first_tokens_path():
    frame = pd.DataFrame(
        [
            rec(0, "P->MD", 100.5, prefill=100.1, held=100.4),
            rec(1, "colocated", 100.3),
        ]
    )
    p = ttft.parts(frame)
    assert p.loc[0, TtftPart.QUEUE] == pytest.approx(0.01)
    assert p.loc[0, TtftPart.PREFILL] == pytest.approx(0.09)
    assert p.loc[0, TtftPart.KV] == pytest.approx(0.3)
    assert p.loc[0, TtftPart.FIRST_DECODE] == pytest.approx(0.1)
    assert pd.isna(p.loc[0, TtftPart.SERVER]) and pd.isna(p.loc[1, TtftPart.KV])
    assert p.loc[1, TtftPart.SERVER] == pytest.approx(0.29)
    sums = p[[x.value for x in TtftPart]].sum(axis=1)
    assert (sums - p["ttft_s"]).abs().max() < 1e-9


def test_prediction_error_and_regret_tables():
    records = pd.DataFrame(
        [
            # P->MD whose WAN transfer took 2 s: relaying would have given 100.2 + LAN
            rec(
                0,
                "P->MD",
                102.3,
                prefill=100.1,
                held=102.2,
                kv_link="wan",
                predicted_wan_s=1.0,
                kv_transfer_s=2.0,
                wan_end=102.2,
            ),
            # relayed: first token from relay decode at 100.25
            rec(
                1,
                "P->RLD->MD",
                100.25,
                prefill=100.1,
                held=100.15,
                kv_link="wan",
                predicted_wan_s=0.5,
                kv_transfer_s=0.5,
                wan_end=100.6,
            ),
        ]
    )
    run = RunData(path=None, scenario={}, systems={"pdd": SystemRun("pdd", records, {})})
    err = ttft.prediction_error(run).iloc[0]
    assert err["transfers"] == 2 and err["error_p50"] == pytest.approx(0.25)
    assert err["error_p50_ms"] == pytest.approx(500)  # 1 s and 0 s off: the median of the two
    reg = ttft.regret(run).iloc[0]
    # r0: 2.3 s against 0.1 + (0.05 LAN + 0.1 first step) = 0.25 s → 2.05 s lost; r1: none
    assert reg["requests"] == 2 and reg["share_with_regret"] == 0.5
    assert reg["regret_mean_s"] == pytest.approx(2.05 / 2, abs=0.01)


def test_the_spread_of_same_size_lone_transfers_bounds_what_prediction_can_do():
    def wan(i, seconds, nbytes=270_336, queued=0):
        return rec(
            i,
            "P->MD",
            101.0,
            kv_link="wan",
            predicted_wan_s=0.1,
            kv_transfer_s=seconds,
            kv_bytes=nbytes,
            wan_queued_bytes=queued,
        )

    # Five lone transfers of one size: four at 0.1 s, one hit by a tail-loss timeout.
    same = [wan(i, s) for i, s in enumerate((0.1, 0.1, 0.1, 0.1, 0.3))]
    others = [wan(5, 2.0, nbytes=10_000_000), wan(6, 9.0, queued=5_000_000)]  # not compared
    run = RunData(
        path=None,
        scenario={},
        systems={"pdd": SystemRun("pdd", pd.DataFrame(same + others), {})},
    )
    err = ttft.prediction_error(run).iloc[0]
    assert err["transfers"] == 7
    assert err["lone_spread_p90_p10"] == pytest.approx(np.percentile([1, 1, 1, 1, 3], 90))


def test_the_error_table_says_which_transfers_the_model_had_wrong_inputs_for():
    """A transfer predicted for more bytes than crossed (the mirror of MD's cache
    missed a finished exchange) or on a connection other than the one decode took (its
    window 1.5x off) is counted apart; the P95 over the rest is the line model's own."""

    def wan(i, predicted, measured, own=100_000, moved=100_000, cwnd=500_000, sent=500_000):
        return rec(
            i,
            "P->MD",
            101.0,
            kv_link="wan",
            predicted_wan_s=predicted,
            kv_transfer_s=measured,
            wan_own_bytes=own,
            kv_bytes=moved,
            wan_cwnd_bytes=cwnd,
            kv_cwnd_bytes=sent,
            kv_retransmits=0,
        )

    records = [
        wan(0, 1.0, 0.1, own=1_000_000),  # predicted for ten times the bytes
        wan(1, 0.1, 0.3, cwnd=800_000, sent=100_000),  # another connection's window
        wan(2, 0.1, 0.1),
        wan(3, 0.11, 0.1),
        wan(4, 0.1, 0.1, own=105_000, cwnd=600_000),  # within 10% / 1.5x: right
    ]
    run = RunData(
        path=None, scenario={}, systems={"pdd": SystemRun("pdd", pd.DataFrame(records), {})}
    )
    err = ttft.prediction_error(run).iloc[0]
    assert err["bytes_miss_share"] == pytest.approx(0.2)
    assert err["window_miss_share"] == pytest.approx(0.2)
    assert err["error_p95"] > 2 and 0.05 < err["error_p95_inputs_right"] <= 0.1
    older = pd.DataFrame(records).drop(columns=["wan_cwnd_bytes"])  # a run before the column
    run = RunData(path=None, scenario={}, systems={"pdd": SystemRun("pdd", older, {})})
    err = ttft.prediction_error(run).iloc[0]
    assert pd.isna(err["window_miss_share"]) and err["bytes_miss_share"] == pytest.approx(0.2)


def test_the_span_is_scored_where_records_have_it_and_first_to_last_beside_it():
    """The KV's span (P's first byte out to MD's last in) is what the error scores; the
    receiver's first-to-last time, whose start is one draw of the line's jitter, is
    shown beside it. Runs older than the span's columns are scored on first-to-last."""

    def transfer(i, predicted, measured, **span) -> dict:
        return rec(
            i, "P->MD", 102.0, prefill=100.1, held=101.9, kv_link="wan",
            predicted_wan_s=predicted, kv_transfer_s=measured, **span,
        )  # fmt: skip

    # the first byte's draw: 0.2 s first-to-last against 0.25 predicted (25% off) where
    # the span, 0.8 s out of the sender to in, was predicted 0.85 (6%)
    spans = [transfer(i, 0.25, 0.2, predicted_kv_span_s=0.85, kv_span_s=0.8) for i in range(3)]
    run = RunData(
        path=None, scenario={}, systems={"pdd": SystemRun("pdd", pd.DataFrame(spans), {})}
    )
    err = ttft.prediction_error(run).iloc[0]
    assert err["measure"] == "span" and err["error_p50"] == pytest.approx(0.0625)
    assert err["first_to_last_p50"] == pytest.approx(0.25)
    old = pd.DataFrame([transfer(i, 0.25, 0.2) for i in range(3)])
    run = RunData(path=None, scenario={}, systems={"pdd": SystemRun("pdd", old, {})})
    err = ttft.prediction_error(run).iloc[0]
    assert err["measure"] == "first_to_last" and err["error_p50"] == pytest.approx(0.25)


def test_prefills_later_chunks_count_as_prefill_not_as_kv():
    """A chunked prefill sends its first chunk's KV and then computes the rest while the
    wire idles (the sender's wait, in the Done frame): that time is prefill's (hetero:
    2-3 s of P->MD turns' KV part). The parts still add up."""
    frame = pd.DataFrame(
        [
            rec(0, "P->MD", 104.0, prefill=100.5, held=103.3, kv_sender_wait_s=2.5),
            rec(1, "P->MD", 101.0, prefill=100.5, held=100.8, kv_sender_wait_s=9.0),  # > held
        ]
    )
    p = ttft.parts(frame)
    assert p.loc[0, TtftPart.PREFILL] == pytest.approx(100.5 + 2.5 - 100.01)
    assert p.loc[0, TtftPart.KV] == pytest.approx(0.3)
    assert p.loc[1, TtftPart.KV] == 0.0  # never past the KV held
    sums = p[[x.value for x in TtftPart]].sum(axis=1, min_count=1)
    assert (sums - p["ttft_s"]).abs().max() < 1e-9


def test_kv_waiting_for_decode_to_ask_is_its_own_part():
    """P computes a P->MD request before decode asks for its KV; a decode that holds the
    request back (a prefix on its way) asks late, and P's first byte waits: that wait is
    not prefill's. Where P was still computing when decode asked, nothing waited."""
    frame = pd.DataFrame(
        [
            rec(0, "P->MD", 103.0, prefill=102.0, held=102.8, prefill_computed=100.3),
            rec(1, "P->MD", 101.0, prefill=100.2, held=100.8, prefill_computed=100.5),
            rec(2, "P->MD", 101.0, prefill=100.2, held=100.8),  # a log without the stamp
        ]
    )
    p = ttft.parts(frame)
    assert p.loc[0, TtftPart.PREFILL] == pytest.approx(100.3 - 100.01)
    assert p.loc[0, TtftPart.ASK] == pytest.approx(102.0 - 100.3)
    assert p.loc[0, TtftPart.KV] == pytest.approx(0.8)
    assert p.loc[1, TtftPart.ASK] == 0.0 and p.loc[2, TtftPart.ASK] == 0.0
    assert p.loc[1, TtftPart.PREFILL] == pytest.approx(100.2 - 100.01)
    sums = p[[x.value for x in TtftPart]].sum(axis=1, min_count=1)
    assert (sums - p["ttft_s"]).abs().max() < 1e-9
