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

import bisect

import numpy as np
import pandas as pd

from reports.run_data import RunData

RELAYED = "P->RLD->MD"


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
    return {k: sorted(v) for k, v in spans.items()}


def _overlaps(spans: list[tuple[float, float]], starts: list[float], a: float, b: float) -> bool:
    """Whether any span (sorted by start) overlaps the open interval (a, b)."""
    i = bisect.bisect_left(starts, b)  # spans starting before b
    return any(end > a for _, end in spans[max(0, i - 64) : i])


def _main_decode_gaps(r) -> list[tuple[float, float]]:
    """(start, end) of each gap the request's decode server (main decode) streamed:
    all of them, or for a relayed request those after relay decode stopped."""
    times = list(r.token_times) if r.token_times is not None else []
    pairs = list(zip(times[:-1], times[1:], strict=False))
    if getattr(r, "pipeline", None) == RELAYED:
        stopped = getattr(r, "relay_stopped", None)
        if stopped is None or pd.isna(stopped):
            return []
        pairs = [(a, b) for a, b in pairs if a >= stopped]
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
        ok = r[r["status"] == "ok"] if "status" in r else r
        spans = _landing(ok)
        starts = {k: [a for a, _ in v] for k, v in spans.items()}
        during: list[float] = []
        outside: list[float] = []
        for rec in ok.itertuples(index=False):
            mine = spans.get(rec.decode_server, [])
            for a, b in _main_decode_gaps(rec):
                hit = bool(mine) and _overlaps(mine, starts[rec.decode_server], a, b)
                (during if hit else outside).append(b - a)
        row = {"system": name}
        for label, gaps in (("while_kv_lands", during), ("otherwise", outside)):
            row[f"gaps_{label}"] = len(gaps)
            for p in (50, 99):
                row[f"itl_p{p}_ms_{label}"] = float(np.percentile(gaps, p)) * 1e3 if gaps else None
        rows.append(row)
    return pd.DataFrame(rows)
