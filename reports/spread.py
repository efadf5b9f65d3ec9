"""How far a run's ratios could move by chance: bootstrap intervals over requests.

A target such as "pdd's ITL P99 <= 2x same_site_pd's" is measured on one run of about
fifty requests a system, and the next run of the same setting lands elsewhere (on
default, pdd's ITL P99 ratio ran from 1.69x to 2.6x over four runs of 2026-12-05). So
beside each latency ratio the report gives the spread chance alone would give it:
each system's requests are resampled with replacement (a request's inter-token gaps
stay together: they share its batches and its server's load), the ratio of the two
percentiles is taken each time, and the 5th and 95th of those ratios are the interval.
A ratio whose interval straddles its target is not told apart from it by this run. SLA
goodput's ratio the same way, over whether each request met the SLA (two default runs
an hour apart: pdd over cross_site_pd x1.37, then x1.12), and the handoff gap's P90 over
the system's inter-token P50 (a run has three to five handoffs: its P90 is nearly the
largest gap; default went x1.5, then x2.4).
Seeded, so the same run always gives the same interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RESAMPLES = 1000
LEVEL = 0.90  # the interval's coverage: its ends are the 5th and 95th percentiles


def per_request(records: pd.DataFrame, what: str) -> list[np.ndarray]:
    """Each ok request's values: its TTFT (one value) or its inter-token gaps."""
    ok = records[records["status"] == "ok"]
    if what == "ttft":
        ttft = (ok["first_token"] - ok["arrival"]).dropna()
        return [np.array([v]) for v in ttft]
    if what == "itl":
        return [np.diff(np.asarray(t, float)) for t in ok["token_times"] if len(t) > 1]
    raise ValueError(f"unknown measure {what!r}: ttft or itl")


def ratio_interval(
    a: list[np.ndarray],
    b: list[np.ndarray],
    q: float,
    resamples: int = RESAMPLES,
    seed: int = 0,
    q_b: float | None = None,
) -> tuple[float, float] | None:
    """The bootstrap interval of percentile(a, q) / percentile(b, q_b or q), each list
    holding one array per request; None when either side has no values."""
    if not any(len(x) for x in a) or not any(len(x) for x in b):
        return None
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    for i in range(resamples):
        num, den = _resampled(a, q, rng), _resampled(b, q if q_b is None else q_b, rng)
        ratios[i] = num / den if den > 0 else np.inf
    return _ends(ratios)


def goodput_ratio_interval(
    a: tuple[np.ndarray, float],
    b: tuple[np.ndarray, float],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """The bootstrap interval of one SLA goodput over another: each side's requests
    (whether each met the SLA, and the run's span) resampled, the spans kept; None when
    either side has no requests or no span."""
    (a_met, a_span), (b_met, b_span) = a, b
    if not len(a_met) or not len(b_met) or a_span <= 0 or b_span <= 0:
        return None
    rng = np.random.default_rng(seed)
    num = a_met[rng.integers(0, len(a_met), (resamples, len(a_met)))].sum(axis=1) / a_span
    den = b_met[rng.integers(0, len(b_met), (resamples, len(b_met)))].sum(axis=1) / b_span
    ratios = np.divide(num, den, out=np.full(resamples, np.inf), where=den > 0)
    return _ends(ratios)


def _ends(ratios: np.ndarray) -> tuple[float, float]:
    """The interval's ends: the ratios' 5th and 95th percentiles (``LEVEL``)."""
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _resampled(requests: list[np.ndarray], q: float, rng: np.random.Generator) -> float:
    picked = rng.integers(0, len(requests), len(requests))
    values = np.concatenate([requests[i] for i in picked])
    # a draw of only empty requests (one-token outputs) has no gaps: redraw
    while not len(values):
        picked = rng.integers(0, len(requests), len(requests))
        values = np.concatenate([requests[i] for i in picked])
    return float(np.percentile(values, q))


def said(interval: tuple[float, float] | None) -> str:
    """The interval as the report writes it beside its ratio."""
    return f" [x{interval[0]:.2f}-x{interval[1]:.2f}]" if interval else ""
