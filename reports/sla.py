"""SLA attainment and SLA goodput: requests per second that met the SLA.

A request meets the SLA when it completed, its TTFT is within ``ttft_s`` and its
inter-token latency (the ``itl_percentile`` of its own gaps) is within ``itl_s``.
SLA goodput = met requests / the run's span (first arrival to last finish).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from protocol.records import RequestRecord


class SLA(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_s: float = Field(..., gt=0, description="Time to first token bound (s).")
    itl_s: float = Field(..., gt=0, description="Inter-token latency bound (s).")
    itl_percentile: float = Field(90, ge=0, le=100, description="Percentile of a request's gaps.")
    attainment: float = Field(0.9, gt=0, le=1, description="Share of requests that must meet it.")

    def met(self, r: RequestRecord) -> bool:
        if r.status != "ok" or r.ttft is None or r.ttft > self.ttft_s:
            return False
        gaps = np.diff(r.token_times)
        return len(gaps) == 0 or float(np.percentile(gaps, self.itl_percentile)) <= self.itl_s


def span_s(records: Iterable[RequestRecord]) -> float:
    records = list(records)
    finished = [r.finish for r in records if r.finish is not None]
    if not records or not finished:
        return 0.0
    return max(finished) - min(r.arrival for r in records)


def attainment(records: list[RequestRecord], sla: SLA) -> float:
    return sum(sla.met(r) for r in records) / len(records) if records else 0.0


def sla_goodput(records: list[RequestRecord], sla: SLA) -> float:
    """Requests per second that met the SLA over the run's span."""
    span = span_s(records)
    return sum(sla.met(r) for r in records) / span if span > 0 else 0.0
