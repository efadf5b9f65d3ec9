"""Where each request's first-token time went, how well the router predicted the WAN,
and what its routing cost against an oracle — per system, from the records alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from protocol.metrics import PERCENTILES, TtftPart, percentile
from protocol.names import Pipeline
from reports.run_data import RunData


def _num(column: pd.Series) -> pd.Series:
    return pd.to_numeric(column, errors="coerce")


def parts(records: pd.DataFrame) -> pd.DataFrame:
    """One row per finished request: its TTFT and the parts that add up to it (along
    the first token's path; a request whose logs lack a stamp has the rest in the
    part that ends at the next stamp it has)."""
    ok = records[(records["status"] == "ok") & records["first_token"].notna()]
    if ok.empty or "dispatched" not in ok:
        return pd.DataFrame()
    arrival, dispatched, first = (
        _num(ok["arrival"]),
        _num(ok["dispatched"]),
        _num(ok["first_token"]),
    )
    prefill, held = _num(ok["prefill_first_byte"]), _num(ok["kv_end"])
    transferred = prefill.notna() & held.notna()
    # P computed the prompt's later chunks while the wire idled (hetero: 2-3 s of a
    # P->MD turn's KV part): prefill's, not the KV's
    wait = _num(ok.get("kv_sender_wait_s", pd.Series(0.0, index=ok.index))).fillna(0.0)
    computed = (prefill + wait).clip(upper=held)
    # ... unless P had computed the prompt before it: its KV waited for decode to ask
    done = _num(ok.get("prefill_computed", pd.Series(np.nan, index=ok.index)))
    ready = done.clip(lower=dispatched, upper=computed).fillna(computed)
    out = pd.DataFrame({"pipeline": ok["pipeline"], "ttft_s": first - arrival})
    out[TtftPart.QUEUE] = dispatched - arrival
    out[TtftPart.PREFILL] = (ready - dispatched).where(transferred)
    out[TtftPart.ASK] = (computed - ready).where(transferred)
    out[TtftPart.KV] = (held - computed).where(transferred)
    out[TtftPart.FIRST_DECODE] = (first - held).where(transferred)
    out[TtftPart.SERVER] = (first - dispatched).where(~transferred)
    return out


def breakdown(run: RunData) -> pd.DataFrame:
    """Per system and percentile (P50/P90/P99 of TTFT): the mean parts of the requests
    nearest that percentile (those within 2.5 percentile points, at least one)."""
    rows = []
    for name, s in run.systems.items():
        p = parts(s.records)
        if p.empty:
            continue
        rank = p["ttft_s"].rank(pct=True) * 100
        for q in PERCENTILES:
            near = p[(rank - q).abs() <= 2.5]
            if near.empty:
                near = p.iloc[[int((rank - q).abs().argmin())]]
            row = {
                "system": name,
                "percentile": f"P{q}",
                "requests": len(near),
                "ttft_s": near["ttft_s"].mean(),
            }
            for part in TtftPart:
                row[part.value] = near[part.value].mean() if near[part.value].notna().any() else 0.0
            rows.append(row)
    return pd.DataFrame(rows)


SPAN = ("predicted_kv_span_s", "kv_span_s")  # P's first KV byte out to MD's last in
FIRST_TO_LAST = ("predicted_wan_s", "kv_transfer_s")  # MD's first KV byte in to its last


def prediction_error(run: RunData) -> pd.DataFrame:
    """Per system: the router's predicted WAN time of each request's KV against the
    measured one (only transfers that moved bytes). ``measure``: what is scored — the
    KV's span on the line (``span``: the sender's first KV byte out to the receiver's
    last in, less the sender's wait for prefill between chunks; what a P->MD request
    waits for past prefill, and what the issue's "predicted WAN finish" is), or, for
    runs older than the span's columns, the receiver's first-to-last-byte time
    (``first_to_last``), whose start is the first byte's own draw of the line's jitter
    (hetero: ±61 ms on 0.1-0.3 s transfers). ``first_to_last_p50`` / ``_p95``: that
    time's error beside it.

    ``lone_spread_p90_p10``: transfers of the same size that had the line to
    themselves (sizes seen at least three times), each measured time over its size's
    median, P90/P10 — how much transfers the router cannot tell apart vary (random
    loss, tail-loss timeouts, the servers' CPU): a floor under the error that no
    prediction from size and backlog can go below.

    ``retransmitted_share``: transfers whose sender retransmitted (a random loss costs
    about a round trip no prediction foresees); ``error_p95_no_retransmit``: the error
    P95 over the others. ``error_p50_ms`` / ``error_p95_ms``: the same error in
    milliseconds (a 140 KB transfer takes 15-50 ms on default, where a few ms of the
    hosts' scheduling are tens of percent).

    Where the model's inputs were wrong: ``bytes_miss_share``, transfers whose bytes
    were over 10% off what crossed (the router's mirror of MD's cache), and
    ``window_miss_share``, transfers whose connection started with a window over 1.5x
    off the model's (decode took another pooled connection, or the model's view of
    that one was stale);
    ``error_p95_inputs_right``: the P95 over transfers with neither and no
    retransmission — what the line model itself misses."""
    rows = []
    for name, s in run.systems.items():
        r = s.records
        if "predicted_wan_s" not in r:
            continue
        both = r[(r["kv_link"] == "wan") & r["predicted_wan_s"].notna() & (r["kv_transfer_s"] > 0)]
        if both.empty:
            continue
        spans = all(c in both for c in SPAN) and both[list(SPAN)].notna().all(axis=None)
        predicted, measured = SPAN if spans else FIRST_TO_LAST
        first_to_last = (both["predicted_wan_s"] - both["kv_transfer_s"]).abs() / both[
            "kv_transfer_s"
        ]
        miss_s = (both[predicted] - both[measured]).abs()
        err = miss_s / both[measured]
        queued = both.get("wan_queued_bytes", pd.Series(0, index=both.index)).fillna(0)
        lone = both[queued == 0]
        by_size = lone.groupby("kv_bytes")[measured]
        relative = (lone[measured] / by_size.transform("median"))[by_size.transform("count") >= 3]
        spread = (
            percentile(relative, 90) / percentile(relative, 10) if len(relative) >= 5 else np.nan
        )
        resent = both.get("kv_retransmits", pd.Series(np.nan, index=both.index))
        clean = err[resent == 0]
        bytes_miss = _off(both, "wan_own_bytes", "kv_bytes", 1.1)
        window_miss = _off(both, "wan_cwnd_bytes", "kv_cwnd_bytes", 1.5)
        right = err[(resent == 0) & (bytes_miss != 1) & (window_miss != 1)]  # unknown: not wrong
        rows.append(
            {
                "system": name,
                "transfers": len(both),
                "measure": "span" if spans else "first_to_last",
                "error_p50": percentile(err, 50),
                "error_p95": percentile(err, 95),
                "first_to_last_p50": percentile(first_to_last, 50),
                "first_to_last_p95": percentile(first_to_last, 95),
                "error_p50_ms": percentile(miss_s, 50) * 1000,
                "error_p95_ms": percentile(miss_s, 95) * 1000,
                "predicted_mean_s": both[predicted].mean(),
                "measured_mean_s": both[measured].mean(),
                "queued_mb_mean": both.get("wan_queued_bytes", pd.Series(dtype=float)).mean() / 1e6,
                "lone_spread_p90_p10": spread,
                "retransmitted_share": (resent > 0).sum() / resent.notna().sum()
                if resent.notna().any()
                else np.nan,
                "error_p95_no_retransmit": percentile(clean, 95) if len(clean) else np.nan,
                "bytes_miss_share": bytes_miss.mean(),
                "window_miss_share": window_miss.mean(),
                "error_p95_inputs_right": percentile(right, 95) if len(right) else np.nan,
            }
        )
    return pd.DataFrame(rows)


def _off(rows: pd.DataFrame, predicted: str, measured: str, factor: float) -> pd.Series:
    """Per row: whether ``predicted`` was over ``factor`` times off ``measured`` either
    way: 1.0 or 0.0, NaN where either is unknown (e.g. runs older than the column)."""
    if predicted not in rows or measured not in rows:
        return pd.Series(np.nan, index=rows.index)
    p, m = _num(rows[predicted]), _num(rows[measured])
    off = (np.fmax(p, m) > factor * np.fmin(p, m)).astype(float)
    return off.where((p > 0) & (m > 0))


def regret(run: RunData) -> pd.DataFrame:
    """Per relaying system: the TTFT its routing lost against an oracle that knew the
    measured times. A request sent P->MD could have had relay decode's first token
    (its own prefill, then the system's median LAN transfer and first relay step); a
    relayed one could have had main decode's (its own prefill and measured WAN
    transfer, then the median first step of P->MD requests). Regret = TTFT minus the
    better of the two, never below zero."""
    rows = []
    for name, s in run.systems.items():
        p = parts(s.records)
        if p.empty:
            continue
        direct, relayed = p[p["pipeline"] == Pipeline.P_MD], p[p["pipeline"] == Pipeline.P_RLD_MD]
        if direct.empty and relayed.empty:
            continue
        stamps = s.records.loc[p.index]
        wan = _num(stamps["wan_end"]) - _num(stamps["prefill_first_byte"])  # P -> MD, measured
        before = p[TtftPart.QUEUE] + p[TtftPart.PREFILL]
        relay_step = relayed[TtftPart.KV].median() + relayed[TtftPart.FIRST_DECODE].median()
        md_step = direct[TtftPart.FIRST_DECODE].median()
        alternative = pd.concat(
            [
                before[direct.index] + relay_step,  # NaN where no request was relayed
                before[relayed.index] + wan[relayed.index] + md_step,
            ]
        )
        lost = (p["ttft_s"] - np.fmin(p["ttft_s"], alternative)).dropna()
        rows.append(
            {
                "system": name,
                "requests": len(lost),
                "regret_mean_s": lost.mean(),
                "regret_p90_s": percentile(lost, 90),
                "share_with_regret": float((lost > 0).mean()) if len(lost) else np.nan,
            }
        )
    return pd.DataFrame(rows)
