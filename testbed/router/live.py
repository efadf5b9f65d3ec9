"""Live figures of a router (``GET /pdd/stats``), kept as each record is written:
requests per pipeline and status, KV bytes over the WAN, and the client-visible
stream gaps at handoffs (the most recent, for percentiles)."""

from __future__ import annotations

from collections import Counter, deque

from protocol.metrics import percentile
from protocol.records import RequestRecord


class LiveStats:
    def __init__(self, recent: int = 1000) -> None:
        self.pipelines: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.wan_bytes = 0
        self.gaps: deque[float] = deque(maxlen=recent)

    def add(self, record: RequestRecord) -> None:
        self.statuses[record.status] += 1
        if record.pipeline:
            self.pipelines[str(record.pipeline)] += 1
        if record.kv_link == "wan" and record.kv_wire_bytes:
            self.wan_bytes += record.kv_wire_bytes
        if record.handoff_s is not None:
            self.gaps.append(record.handoff_s)

    def as_dict(self) -> dict:
        gaps = list(self.gaps)
        return {
            "requests": sum(self.statuses.values()),
            "pipelines": dict(self.pipelines),
            "statuses": dict(self.statuses),
            "wan_kv_wire_bytes": self.wan_bytes,
            "handoffs": len(gaps),
            "handoff_gap_p50_s": percentile(gaps, 50) if gaps else None,
            "handoff_gap_p90_s": percentile(gaps, 90) if gaps else None,
        }
