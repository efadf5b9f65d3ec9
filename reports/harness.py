"""The harness's own part in a run: what the load generator and the client→router hop
add to each first token, and the load generator's CPU per request.

Per request, joined by request id:

- client TTFT: Locust's, from sending the request to its first token (``client.jsonl``);
- router TTFT: the router's record of it (arrival to first token sent on);
- harness share: (client − router) / client TTFT — the part of the TTFT a user of the
  testbed sees that its own load generation and the client↔router hop add. Target: at
  most 5% at the median (``HARNESS_SHARE_TARGET``).

Load CPU: the CPU seconds of every Locust process (master and workers, from
``cpu.json``) per request of the system.
"""

from __future__ import annotations

import pandas as pd

from protocol.metrics import percentile
from reports.run_data import RunData

HARNESS_SHARE_TARGET = 0.05


def shares(s) -> pd.Series:
    """Per request of one system: the harness's share of the client's TTFT."""
    client, records = s.client, s.records
    if client.empty or records.empty or "sent" not in client:
        return pd.Series(dtype=float)
    mine = records[["request_id", "arrival", "first_token"]]
    both = client[["request_id", "sent", "first_token"]].merge(
        mine, on="request_id", suffixes=("_client", "_router")
    )
    seen = both["first_token_client"] - both["sent"]
    routed = both["first_token_router"] - both["arrival"]
    share = (seen - routed) / seen
    return share[(seen > 0) & routed.notna()].reset_index(drop=True)


def load_cpu_s(s) -> tuple[float, int]:
    """(CPU seconds of the system's Locust processes, how many there were)."""
    rows = [r for r in s.cpu if str(r.get("process", "")).startswith("Locust")]
    return sum(float(r.get("cpu_s", 0)) for r in rows), len(rows)


def harness(run: RunData) -> pd.DataFrame:
    rows = []
    for name, s in run.systems.items():
        share = shares(s)
        cpu_s, procs = load_cpu_s(s)
        requests = len(s.records)
        rows.append(
            {
                "system": name,
                "locust_workers": (run.scenario.get("workload") or {}).get("workers", 0),
                "locust_processes": procs,
                "load_cpu_ms_per_request": 1000 * cpu_s / requests if requests and procs else None,
                "harness_share_p50": percentile(share, 50) if len(share) else None,
                "harness_share_p90": percentile(share, 90) if len(share) else None,
                "target_met": bool(percentile(share, 50) <= HARNESS_SHARE_TARGET)
                if len(share)
                else None,
            }
        )
    return pd.DataFrame(rows)
