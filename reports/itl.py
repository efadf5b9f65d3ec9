"""Inter-token gaps split by what the streaming decode server was doing: receiving
another request's KV over the WAN, or not.

A decode server that receives KV over the WAN pays for it on its own core: the
receiving thread, the kernel's TCP work and, on a small box, the link emulator's
packets. Its forward passes then run slower and every stream it serves stutters. The
table shows that cost per system, so a reviewer can tell it from the network's own
jitter and from the decode server's other work (default run 120310: cross_site_pd's
streams had an inter-token P50 / P99 of 34 / 78 ms while KV landed on its decode
server, 29 / 42 ms otherwise; pdd's main decode 32 / 117 ms against 29 / 114 ms, so its
tail came from main decode's other passes, not from the KV it received).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from protocol.names import Pipeline
from reports.run_data import RunData


def _landing(records: pd.DataFrame) -> dict[str, list[tuple[float, float]]]:
    """Per decode server, the spans (first to last byte) its WAN KV transfers landed in."""
    spans: dict[str, list[tuple[float, float]]] = {}
    if "wan_first_byte" not in records or "wan_end" not in records:
        return spans
    wan = records[records["wan_first_byte"].notna() & records["wan_end"].notna()]
    for server, start, end in zip(
        wan["decode_server"], wan["wan_first_byte"], wan["wan_end"], strict=True
    ):
        if end > start:
            spans.setdefault(server, []).append((float(start), float(end)))
    return spans


def _main_decode_gaps(r) -> list[tuple[float, float]]:
    """(start, end) of each gap the request's decode server (main decode) streamed:
    all of them, or for a relayed request those after relay decode stopped."""
    times = list(r.token_times) if r.token_times is not None else []
    pairs = list(zip(times[:-1], times[1:], strict=False))
    if r.pipeline == Pipeline.P_RLD_MD:
        if r.relay_stopped is None or pd.isna(r.relay_stopped):
            return []
        pairs = [(a, b) for a, b in pairs if a >= r.relay_stopped]
    return pairs


def while_kv_lands(run: RunData) -> pd.DataFrame:
    """Per system, the inter-token gaps its decode server (main decode for pdd) streamed
    while a WAN KV transfer was landing on it, against those while none was (P50/P99,
    ms). Relay decode's gaps are left out: its KV comes over the LAN."""
    rows = []
    for name, s in run.systems.items():
        r = s.records
        if r.empty or "token_times" not in r:
            continue
        ok = r[r["status"] == "ok"]
        spans = _landing(ok)
        during: list[float] = []
        outside: list[float] = []
        for rec in ok.itertuples(index=False):
            mine = spans.get(rec.decode_server, [])
            for a, b in _main_decode_gaps(rec):
                hit = any(start < b and end > a for start, end in mine)
                (during if hit else outside).append(b - a)
        row = {"system": name}
        for label, gaps in (("while_kv_lands", during), ("otherwise", outside)):
            row[f"gaps_{label}"] = len(gaps)
            for p in (50, 99):
                row[f"itl_p{p}_ms_{label}"] = float(np.percentile(gaps, p)) * 1e3 if gaps else None
        rows.append(row)
    return pd.DataFrame(rows)
