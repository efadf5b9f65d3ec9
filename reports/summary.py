"""A run's results as data: ``summary.json`` and ``summary.csv`` beside the report.

Schema (version 1). ``summary.json``::

    {"schema_version": 1, "run_dir": ..., "scenario": NAME, "git_commit": ...,
     "systems": [ROW, ...]}

and ``summary.csv`` holds the same rows, one per system, a column per field (the
``errors`` mapping flattened to ``errors_<status>`` columns). A ROW has:

- ``system``; ``requests`` (every record); ``ok``; ``errors``: {status: count} for
  every status other than ``ok`` (rejected, client_cancelled, upstream_error, error);
- for each of ``ttft``, ``itl`` (every gap between a request's tokens), ``tpot`` (per
  request: (end - first token) / (output tokens - 1)) and ``e2e``, in seconds:
  ``<m>_mean_s``, ``<m>_std_s``, ``<m>_p50_s``, ``<m>_p90_s``, ``<m>_p99_s``
  (successful requests only; null when there are none);
- ``span_s`` (first arrival to last finish), ``requests_per_s``, ``output_tokens_per_s``;
- ``sla_attainment`` (share of requests meeting the scenario's SLA),
  ``sla_goodput_rps`` (requests meeting it per second), ``cost_per_hour``, ``bcr``;
- ``wan_kv_bytes`` (KV bytes that crossed the WAN, from the records);
- ``harness_share_p50`` (median share of the client's TTFT that the load generator and
  the client→router hop add) and ``load_cpu_ms_per_request`` (Locust's CPU per
  request), both null when the run has no client timing or CPU accounting.

The JSON Schema is ``reports/summary.schema.json`` (from :class:`Summary`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, create_model

from protocol.metrics import percentile
from protocol.records import write_atomic
from reports.harness import harness
from reports.run_data import RunData
from reports.tables import goodput_bcr

SCHEMA_VERSION = 1
METRICS = ("ttft", "itl", "tpot", "e2e")
SCHEMA_FILE = Path(__file__).resolve().parent / "summary.schema.json"  # Summary's schema


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    system: str
    requests: int = Field(ge=0)
    ok: int = Field(ge=0)
    errors: dict[str, int]
    span_s: float = Field(ge=0)
    requests_per_s: float | None
    output_tokens_per_s: float | None
    sla_attainment: float | None
    sla_goodput_rps: float | None
    cost_per_hour: float | None
    bcr: float | None
    wan_kv_bytes: int = Field(ge=0)
    harness_share_p50: float | None = None
    load_cpu_ms_per_request: float | None = None


# One row per system: the fields above and <metric>_<stat>_s for every metric and stat.
SummaryRow = create_model(
    "SummaryRow",
    __base__=_Row,
    **{
        f"{m}_{stat}_s": (float | None, ...)
        for m in METRICS
        for stat in ("mean", "std", "p50", "p90", "p99")
    },
)


class Summary(BaseModel):
    """``summary.json``, version 1 (``summary.schema.json`` is this model's schema)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_dir: str
    scenario: str | None
    git_commit: str | None
    systems: list[SummaryRow]
    left_out: dict[str, str] = Field(
        default_factory=dict,
        description="Systems of the scenario without results (failed, cut short, not run): why.",
    )


def json_schema() -> dict:
    return Summary.model_json_schema()


def rows(run: RunData) -> list[dict]:
    money = goodput_bcr(run).set_index("system") if run.systems else pd.DataFrame()
    own = harness(run).set_index("system") if run.systems else pd.DataFrame()
    out = []
    for name, s in run.systems.items():
        r = s.records
        ok = r[r["status"] == "ok"]
        status = r["status"].value_counts().to_dict()
        row = {
            "system": name,
            "requests": len(r),
            "ok": int(status.pop("ok", 0)),
            "errors": {k: int(v) for k, v in sorted(status.items())},
        }
        for metric, values in _metrics(ok).items():
            v = np.asarray(values, float)
            row[f"{metric}_mean_s"] = float(v.mean()) if len(v) else None
            row[f"{metric}_std_s"] = float(v.std()) if len(v) else None
            for p in (50, 90, 99):
                row[f"{metric}_p{p}_s"] = percentile(v, p) if len(v) else None
        m = money.loc[name] if name in money.index else {}
        span = float(m.get("span_s", 0) or 0)
        row["span_s"] = span
        row["requests_per_s"] = len(ok) / span if span > 0 else None
        row["output_tokens_per_s"] = float(ok["output_tokens"].sum()) / span if span > 0 else None
        for key in ("sla_attainment", "sla_goodput_rps", "cost_per_hour", "bcr"):
            row[key] = _number(m.get(key))
        wan = r[r.get("kv_link", pd.Series(index=r.index, dtype=object)) == "wan"]
        row["wan_kv_bytes"] = int(wan["kv_bytes"].fillna(0).sum()) if not wan.empty else 0
        h = own.loc[name] if name in own.index else {}
        row["harness_share_p50"] = _number(h.get("harness_share_p50"))
        row["load_cpu_ms_per_request"] = _number(h.get("load_cpu_ms_per_request"))
        out.append(row)
    return out


def _metrics(ok: pd.DataFrame) -> dict[str, list[float]]:
    ttft = (ok["first_token"] - ok["arrival"]).dropna().tolist()
    e2e = (ok["finish"] - ok["arrival"]).dropna().tolist()
    itl, tpot = [], []
    for times in ok["token_times"]:
        t = np.asarray(times, float)
        if len(t) > 1:
            itl += np.diff(t).tolist()
            tpot.append(float((t[-1] - t[0]) / (len(t) - 1)))
    return {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e": e2e}


def _number(value) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def write(run: RunData) -> tuple[Path, Path]:
    """summary.json and summary.csv in the run's directory."""
    data = rows(run)
    first = next(iter(run.systems.values()), None)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "run_dir": str(run.path),
        "scenario": run.scenario.get("name"),
        "git_commit": first.manifest.get("git_commit") if first else None,
        "systems": data,
        "left_out": run.left_out,
    }
    json_path, csv_path = Path(run.path) / "summary.json", Path(run.path) / "summary.csv"
    Summary.model_validate(doc)  # the schema is a promise: never write what breaks it
    write_atomic(json_path, json.dumps(doc, indent=2))
    flat = [
        {**{k: v for k, v in row.items() if k != "errors"}}
        | {f"errors_{k}": v for k, v in row["errors"].items()}
        for row in data
    ]
    frame = pd.DataFrame(flat)
    errors = [c for c in frame.columns if c.startswith("errors_")]
    frame[errors] = frame[errors].fillna(0).astype(int)  # no such error: 0
    write_atomic(csv_path, frame.to_csv(index=False))
    return json_path, csv_path
