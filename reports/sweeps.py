"""Across a sweep's points: repeated runs' means and 95% intervals (``--seeds``) and,
over an offered-rate sweep, each system's knee."""

from __future__ import annotations

import numpy as np
import pandas as pd

CONFIDENCE_METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "sla_goodput_rps", "bcr")


def confidence(frame: pd.DataFrame, metrics=CONFIDENCE_METRICS) -> pd.DataFrame:
    """Per system over repeated runs (a sweep's points that differ only in seed): the
    mean of each metric and its 95% confidence interval (Student's t)."""
    from scipy import stats

    rows = []
    for system, runs in frame.groupby("system", sort=False):
        row = {"system": system, "runs": len(runs)}
        for metric in metrics:
            values = runs[metric].dropna().astype(float)
            n = len(values)
            mean = float(values.mean()) if n else np.nan
            half = (
                float(stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n))
                if n > 1
                else np.nan
            )
            row[f"{metric}_mean"], row[f"{metric}_ci95"] = mean, half
        rows.append(row)
    return pd.DataFrame(rows)


def knee(frame: pd.DataFrame, rate: str = "rate_rps", share: float = 0.9) -> pd.DataFrame:
    """Per system in a sweep over the offered rate: the knee, the highest rate whose
    SLA goodput is still ``share`` of it (beyond it, more load buys little goodput)."""
    rows = []
    for system, points in frame.groupby("system", sort=False):
        points = points.sort_values(rate)
        kept = points[points["sla_goodput_rps"] >= share * points[rate]]
        rows.append(
            {
                "system": system,
                "knee_rps": float(kept[rate].max()) if not kept.empty else np.nan,
                "goodput_at_knee_rps": float(kept["sla_goodput_rps"].iloc[-1])
                if not kept.empty
                else np.nan,
                "max_goodput_rps": float(points["sla_goodput_rps"].max()),
            }
        )
    return pd.DataFrame(rows)
