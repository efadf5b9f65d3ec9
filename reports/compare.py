"""Two or more runs side by side (``testbed compare RUN_A RUN_B ...``): per system and
metric, each run's value and the change against the first run."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from protocol.records import write_atomic

METRICS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "e2e_p50_s",
    "requests_per_s",
    "sla_attainment",
    "sla_goodput_rps",
    "bcr",
    "wan_kv_bytes",
)


def summary_of(run_dir: Path) -> dict:
    """A run's summary.json (made from its records if the run predates it)."""
    path = Path(run_dir) / "summary.json"
    if path.exists():
        return json.loads(path.read_text())
    from reports import summary
    from reports.run_data import load_run

    summary.write(load_run(run_dir))
    return json.loads(path.read_text())


def compare(run_dirs: list[Path], metrics=METRICS) -> pd.DataFrame:
    """One row per (system, metric) present in the first run: every run's value and,
    for each later run, its change relative to the first (None where undefined)."""
    if len(run_dirs) < 2:
        raise ValueError("compare needs at least two runs")
    summaries = [summary_of(d) for d in run_dirs]
    labels = _labels(run_dirs)
    by_run = [{row["system"]: row for row in s["systems"]} for s in summaries]
    rows = []
    for system in by_run[0]:
        for metric in metrics:
            row = {"system": system, "metric": metric}
            values = [runs.get(system, {}).get(metric) for runs in by_run]
            for label, value in zip(labels, values, strict=True):
                row[label] = value
            base = values[0]
            for label, value in zip(labels[1:], values[1:], strict=True):
                ok = base not in (None, 0) and value is not None
                row[f"change {label}"] = (value - base) / abs(base) if ok else None
            rows.append(row)
    return pd.DataFrame(rows)


def _labels(run_dirs: list[Path]) -> list[str]:
    names = [Path(d).name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{i}:{n}" for i, n in enumerate(names)]


def write_html(frame: pd.DataFrame, run_dirs: list[Path], out: Path) -> Path:
    runs = "".join(f"<li>{html.escape(str(d))}</li>" for d in run_dirs)
    table = frame.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="")
    page = (
        "<!doctype html><meta charset='utf-8'><title>pdd-testbed: run comparison</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}</style>"
        f"<h1>Run comparison</h1><p>Changes are relative to the first run.</p><ol>{runs}</ol>"
        f"{table}"
    )
    write_atomic(out, page)
    return out
