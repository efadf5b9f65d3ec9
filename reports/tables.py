"""The report's numbers, computed from a RunData: one function per table, each a DataFrame.

Collection (RunData) is separate from rendering (reports.render): these functions are
the single place the arithmetic lives, so ``testbed report`` reproduces a run's tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from protocol.metrics import PERCENTILES, percentile
from protocol.records import RequestRecord
from reports.cost import CostTable, Hardware, bcr, relative_change
from reports.harness import harness
from reports.run_data import RunData
from reports.sla import SLA, attainment, sla_goodput, span_s
from reports.spread import per_request
from workloads.analysis import HIT_BINS, hit_bin

# PDD's published figures (PDD.md) and the systems each compares.
PAPER = [
    ("TTFT reduction", "pdd", "cross_site_pd", "ttft_p50_s", -0.515),
    ("TTFT P90 reduction", "pdd", "cross_site_pd", "ttft_p90_s", np.nan),
    ("TTFT P99 reduction", "pdd", "cross_site_pd", "ttft_p99_s", np.nan),
    ("SLA goodput gain", "pdd", "cross_site_pd", "sla_goodput_rps", 0.278),
    ("BCR gain", "pdd", "same_site_pd", "bcr", 0.375),
]


def _records(frame: pd.DataFrame) -> list[RequestRecord]:
    return [
        RequestRecord(**{k: (None if _isna(v) else v) for k, v in row.items()})
        for row in frame.to_dict("records")
    ]


def _isna(v) -> bool:
    return not isinstance(v, list | np.ndarray) and pd.isna(v)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"]


def latency(run: RunData) -> pd.DataFrame:
    rows = []
    for name, s in run.systems.items():
        ok = _ok(s.records)
        ttft, itl = (np.concatenate([*per_request(s.records, w), []]) for w in ("ttft", "itl"))
        e2e = (ok["finish"] - ok["arrival"]).dropna()
        row = {"system": name, "requests": len(s.records), "errors": len(s.records) - len(ok)}
        for label, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
            for p in PERCENTILES:
                row[f"{label}_p{p}_s"] = percentile(values, p)
        rows.append(row)
    return pd.DataFrame(rows)


def system_cost(s, table: CostTable) -> float:
    return Hardware(**s.cost).cost(table) if s.cost else np.nan


def goodput_bcr(run: RunData) -> pd.DataFrame:
    sla = SLA(**run.scenario["sla"])
    table = CostTable(**run.scenario["cost"]["table"])
    rows = []
    for name, s in run.systems.items():
        recs = _records(s.records)
        good = sla_goodput(recs, sla)
        cost = system_cost(s, table)
        rows.append(
            {
                "system": name,
                "span_s": span_s(recs),
                "sla_attainment": attainment(recs, sla),
                "sla_goodput_rps": good,
                "accelerators": s.cost.get("accelerators", {}),
                "wan_lines": s.cost.get("wan_lines", 0),
                "cost_per_hour": cost,
                "bcr": bcr(good, cost) if cost and not np.isnan(cost) else np.nan,
            }
        )
    return pd.DataFrame(rows)


def sla_met(run: RunData, name: str) -> tuple[np.ndarray, float]:
    """Whether each of system ``name``'s requests met the SLA, and the run's span: its
    SLA goodput is their sum over the span."""
    recs = _records(run.systems[name].records)
    sla = SLA(**run.scenario["sla"])
    return np.array([sla.met(r) for r in recs], dtype=float), span_s(recs)


def _wan_receives(s) -> pd.Series:
    """Transfer-log rows of KV received across the WAN: the decode side of servers in
    another site than prefill (pdd's relay decode receives over the LAN)."""
    t, servers = s.transfers, s.manifest.get("servers", [])
    near = {x["site"] for x in servers if x["role"] == "prefill"}
    far = {x["name"] for x in servers if x["site"] not in near}
    if t.empty or "server" not in t:
        return pd.Series(False, index=t.index)
    return (t["side"] == "decode") & t["server"].isin(far)


def wan_requests(s) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A system's requests whose KV crossed the WAN, with ``kv_bytes`` and ``held`` (the
    prefix the decode side already had) from the far receivers' transfer logs (pdd's
    settled transfers end after the request's record was written); and apart, those
    whose transfer was cut short (MD released, the WAN cut)."""
    ok, t = _ok(s.records), s.transfers
    if not t.empty and "server" in t:
        far = t[_wan_receives(s)].drop_duplicates("room", keep="last").set_index("room")
        wan = ok[ok["room"].isin(far.index)].copy()
        got = far.loc[wan["room"]]
        wan["kv_bytes"] = got["kv_bytes"].to_numpy()
        wan["held"] = got["decode_prefix_len"].to_numpy()
        wan["done"] = (got["status"] == "success").to_numpy()
    else:  # a run directory from before the logs were tagged with their server
        wan = ok[ok["kv_link"] == "wan"].copy()
        wan["held"], wan["done"] = wan["cached_tokens_decode"].fillna(0), True
    return wan[wan["done"]], wan[~wan["done"]]


def wan_bytes(run: RunData) -> pd.DataFrame:
    """KV bytes per request that crossed the WAN, against (1 − hit) × full KV."""
    rows = []
    for name, s in run.systems.items():
        wan, cut = wan_requests(s)
        if wan.empty and cut.empty:
            continue
        per_token = s.manifest.get("kv_bytes_per_token")
        full = wan["prompt_tokens"] * per_token
        minimum = (wan["prompt_tokens"] - wan["held"]) * per_token
        rows.append(
            {
                "system": name,
                "requests": len(wan),
                "kv_bytes_mean": wan["kv_bytes"].mean(),
                "minimum_mean": minimum.mean(),
                "full_kv_mean": full.mean(),
                "bytes_over_minimum": wan["kv_bytes"].sum() / max(minimum.sum(), 1),
                "saving_vs_full_kv": full.sum() / max(wan["kv_bytes"].sum(), 1),
                "cut_short": len(cut),
            }
        )
    return pd.DataFrame(rows)


def wan_utilisation(run: RunData, bucket_s: float = 1.0) -> pd.DataFrame:
    """Share of the WAN rate that KV transfers used, per second, per system."""
    rate = (run.scenario["network"]["wan"].get("rate_mbit") or 0) * 1e6 / 8
    rows = []
    for name, s in run.systems.items():
        t = s.transfers
        if t.empty or rate == 0:
            continue
        served = set(s.records["room"].dropna())  # not a warm-up's transfer
        t = t[
            _wan_receives(s) & t["first_byte"].notna() & t["end"].notna() & t["room"].isin(served)
        ]
        if t.empty:
            continue
        start = t["first_byte"].min()
        horizon = int(np.ceil((t["end"].max() - start) / bucket_s)) + 1
        used = np.zeros(horizon)
        for _, x in t.iterrows():
            a, b = x["first_byte"] - start, max(x["end"] - start, x["first_byte"] - start + 1e-6)
            for k in range(int(a // bucket_s), int(b // bucket_s) + 1):
                overlap = min(b, (k + 1) * bucket_s) - max(a, k * bucket_s)
                used[k] += x["wire_bytes"] * max(overlap, 0) / (b - a)
        rows += [
            {"system": name, "t_s": k * bucket_s, "utilisation": used[k] / (rate * bucket_s)}
            for k in range(horizon)
        ]
    return pd.DataFrame(rows)


def hit_distribution(run: RunData) -> pd.DataFrame:
    """Per-request prefix hit on the server that decoded it, in PDD's seven bins."""
    rows = []
    for name, s in run.systems.items():
        r = _ok(s.records)
        cached = (
            r["cached_tokens_decode"]
            .where(r["cached_tokens_decode"].notna(), r["cached_tokens_prefill"])
            .fillna(0)
        )
        hits = (cached / r["prompt_tokens"]).clip(0, 1)
        counts = pd.Series([hit_bin(h) for h in hits]).value_counts()
        row = {"system": name, "mean_hit": hits.mean()}
        row.update({f"{b}%": counts.get(b, 0) / max(len(hits), 1) for b in HIT_BINS})
        rows.append(row)
    return pd.DataFrame(rows)


def routing(run: RunData) -> pd.DataFrame:
    """Per system and pipeline: how many requests, and the routing input (predicted WAN
    time of the KV the decode side lacked) they were decided on."""
    rows = []
    for name, s in run.systems.items():
        r = s.records
        for pipe, part in r.groupby("pipeline"):
            wan_ms = part["predicted_wan_s"].dropna() * 1e3
            pinned = part["pipeline_reason"].fillna("").str.startswith("pinned").sum()
            rows.append(
                {
                    "system": name,
                    "pipeline": pipe,
                    "requests": len(part),
                    "share": len(part) / max(len(r), 1),
                    "predicted_wan_ms_p50": percentile(wan_ms, 50),
                    "predicted_wan_ms_max": wan_ms.max() if len(wan_ms) else np.nan,
                    "pinned": int(pinned),
                    "example_reason": part["pipeline_reason"].iloc[0],
                }
            )
    return pd.DataFrame(rows)


def relay_share(run: RunData) -> pd.DataFrame:
    rows = []
    for name, s in run.systems.items():
        out = s.records["output_tokens"].sum()
        eager = s.records["eager_tokens"].sum()
        if eager or s.records["handoff_tokens"].sum():
            rows.append(
                {
                    "system": name,
                    "output_tokens": out,
                    "eager_tokens": eager,
                    "relay_share": eager / max(out, 1),
                    "handoff_tokens_mean": s.records["handoff_tokens"].mean(),
                }
            )
    return pd.DataFrame(rows)


def handoffs(run: RunData) -> pd.DataFrame:
    """Per system and handoff mode: how many, how big, their bytes, the client's gap
    (last eager token → first main-decode token) and why relay decode was stopped
    (``RelayStop``); "none" = relay decode finished."""
    rows = []
    for name, s in run.systems.items():
        r = _ok(s.records)
        if "handoff_mode" not in r or r["handoff_mode"].isna().all():
            continue
        for mode, part in r[r["handoff_mode"].notna()].groupby("handoff_mode"):
            gap = part["handoff_s"].dropna()
            rows.append(
                {
                    "system": name,
                    "mode": mode,
                    "requests": len(part),
                    "eager_tokens_mean": part["eager_tokens"].mean(),
                    "handoff_tokens_mean": part["handoff_tokens"].mean(),
                    "handoff_tokens_max": part["handoff_tokens"].max(),
                    "batches_mean": part["handoff_batches"].mean(),
                    "bytes_per_token": part["handoff_bytes"].sum()
                    / max(part["handoff_tokens"].sum(), 1),
                    "gap_p50_s": percentile(gap, 50),
                    "gap_p90_s": percentile(gap, 90),
                    "mismatches": int(part["handoff_mismatch"].fillna(False).sum()),
                    "relay_stops": _counts(part.get("relay_stop_reason")),
                }
            )
    return pd.DataFrame(rows)


def _counts(column: pd.Series | None) -> str:
    """``"in-time 5, limit 2"``: how often each value occurs (runs before a column: "")."""
    if column is None:
        return ""
    return ", ".join(f"{k} {n}" for k, n in column.dropna().value_counts().items())


def paper_comparison(
    run: RunData, lat: pd.DataFrame, good: pd.DataFrame, wan: pd.DataFrame
) -> pd.DataFrame:
    merged = lat.merge(good, on="system", how="outer").set_index("system")
    rows = []
    for label, system, baseline, column, paper in PAPER:
        base = merged.at[baseline, column] if baseline in merged.index else np.nan
        if system in merged.index and base and not np.isnan(base):
            measured = relative_change(merged.at[system, column], base)
            note = "" if not np.isnan(paper) else "the paper gives one TTFT figure (above)"
        elif system in merged.index and baseline in merged.index:
            measured, note = np.nan, f"{baseline}'s {column} is {base}: no ratio"
        else:
            measured, note = np.nan, f"needs {system} and {baseline} in the run"
        rows.append(
            {
                "figure": label,
                "compares": f"{system} vs {baseline}",
                "paper": paper,
                "measured": measured,
                "note": note,
            }
        )
    best = wan["saving_vs_full_kv"].max() if not wan.empty else np.nan
    rows.append(
        {
            "figure": "WAN saving from the decode-side cache (full KV / bytes sent)",
            "compares": "cross-site systems",
            "paper": 10.0,
            "measured": best,
            "note": "paper: up to 10x at 90% mean hit",
        }
    )
    return pd.DataFrame(rows)


def shape_checks(lat: pd.DataFrame, wan: pd.DataFrame) -> pd.DataFrame:
    """The shapes a default run must show, stated as measured (never forced)."""
    by = lat.set_index("system")
    rows = []

    def row(claim, holds, detail):
        rows.append({"expected": claim, "holds": holds, "measured": detail})

    if {"cross_site_pd", "same_site_pd"} <= set(by.index):
        c, s = by.loc["cross_site_pd"], by.loc["same_site_pd"]
        row(
            "cross_site_pd's P90/P99 TTFT clearly worse than same_site_pd's",
            bool(c.ttft_p90_s > 1.2 * s.ttft_p90_s and c.ttft_p99_s > 1.2 * s.ttft_p99_s),
            f"P90 {c.ttft_p90_s:.2f} vs {s.ttft_p90_s:.2f} s; "
            f"P99 {c.ttft_p99_s:.2f} vs {s.ttft_p99_s:.2f} s",
        )
    if {"pdd", "same_site_pd"} <= set(by.index):
        p, s = by.loc["pdd"], by.loc["same_site_pd"]
        row(
            "pdd's tail TTFT back near same_site_pd's",
            bool(p.ttft_p99_s < 1.5 * s.ttft_p99_s),
            f"P99 {p.ttft_p99_s:.2f} vs {s.ttft_p99_s:.2f} s",
        )
    else:
        row("pdd's tail TTFT back near same_site_pd's", None, "no pdd system in this run")
    if not wan.empty:
        worst = wan["bytes_over_minimum"].max()
        row(
            "WAN bytes per request close to the (1 − hit) minimum",
            bool(worst < 1.05),
            f"bytes sent / minimum = {worst:.3f}",
        )
    return pd.DataFrame(rows)


def all_tables(run: RunData) -> dict[str, pd.DataFrame]:
    lat, good, wan = latency(run), goodput_bcr(run), wan_bytes(run)
    return {
        "latency": lat,
        "goodput_bcr": good,
        "wan_bytes": wan,
        "wan_utilisation": wan_utilisation(run),
        "hit_distribution": hit_distribution(run),
        "routing": routing(run),
        "relay_share": relay_share(run),
        "handoffs": handoffs(run),
        "paper": paper_comparison(run, lat, good, wan),
        "shape_checks": shape_checks(lat, wan),
    }


def sweep_table(points: dict[str, RunData], sweep: dict[str, list]) -> pd.DataFrame:
    """One row per sweep point and system: the swept values, TTFT, goodput, BCR, WAN."""
    rows = []
    for run in points.values():
        values = {}
        for dotted in sweep:
            node = run.scenario
            for key in dotted.split("."):
                node = node[key]
            values[dotted.rsplit(".", 1)[-1]] = node
        lat, good, wan = latency(run), goodput_bcr(run), wan_bytes(run)
        cols = ["harness_share_p50", "load_cpu_ms_per_request"]
        own = {h["system"]: {c: h[c] for c in cols} for _, h in harness(run).iterrows()}
        merged = lat.merge(good, on="system").merge(
            wan[["system", "kv_bytes_mean", "bytes_over_minimum"]]
            if not wan.empty
            else pd.DataFrame(columns=["system", "kv_bytes_mean", "bytes_over_minimum"]),
            on="system",
            how="left",
        )
        for _, r in merged.iterrows():
            rows.append(
                {
                    **values,
                    "system": r["system"],
                    "requests": r["requests"],
                    "errors": r["errors"],
                    "ttft_p50_s": r["ttft_p50_s"],
                    "ttft_p90_s": r["ttft_p90_s"],
                    "ttft_p99_s": r["ttft_p99_s"],
                    "sla_goodput_rps": r["sla_goodput_rps"],
                    "bcr": r["bcr"],
                    "wan_kv_bytes_mean": r["kv_bytes_mean"],
                    **own.get(r["system"], {}),
                }
            )
    return pd.DataFrame(rows)
