"""Metric names, defined once: Locust event names, record columns and report labels."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import numpy as np


class Metric(StrEnum):
    """A measured quantity; the value is the column / event name, ``label`` the report's."""

    TTFT = "ttft_s"
    ITL = "itl_s"
    E2E = "e2e_s"
    OUTPUT_TOKENS = "output_tokens"
    PROMPT_TOKENS = "prompt_tokens"
    CACHED_TOKENS = "cached_tokens"

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {
    Metric.TTFT: "time to first token",
    Metric.ITL: "inter-token latency",
    Metric.E2E: "end-to-end latency",
    Metric.OUTPUT_TOKENS: "output tokens",
    Metric.PROMPT_TOKENS: "prompt tokens",
    Metric.CACHED_TOKENS: "cached prompt tokens",
}

PERCENTILES = (50, 90, 99)


def percentile(values: Iterable[float], p: float) -> float:
    """Linear-interpolation percentile (numpy's default); NaN for no values."""
    values = list(values)
    return float(np.percentile(values, p)) if values else float("nan")


class TtftPart(StrEnum):
    """Where a request's first-token time went; the parts add up to its TTFT.

    Each is the gap between two stamps of one clock (router, servers and their logs
    share the host's wall clock), along the path the first token took.
    """

    QUEUE = "queue_s"  # arrival → dispatched: the router, incl. the previous turn's alignment
    # dispatched → P's first KV byte, and the wire's idle while P computed the prompt's
    # later chunks (the sender's wait): prefill's wait and compute
    PREFILL = "prefill_s"
    # ... past P's compute, its KV waited for decode to ask (a P->MD request decode held
    # back for a prefix on its way, or queued; the ask's way across)
    ASK = "kv_ask_s"
    KV = "kv_s"  # ... → the first token's decoder holds the KV (less that idle)
    FIRST_DECODE = "first_decode_s"  # KV held → first token at the router
    SERVER = "server_s"  # colocated: dispatched → first token (wait, prefill, decode)

    @property
    def label(self) -> str:
        return _PART_LABELS[self]


_PART_LABELS = {
    TtftPart.QUEUE: "router queue",
    TtftPart.PREFILL: "prefill wait + compute",
    TtftPart.ASK: "KV waits for decode to ask",
    TtftPart.KV: "KV transfer to the first decoder",
    TtftPart.FIRST_DECODE: "first decode step + stream",
    TtftPart.SERVER: "colocated server",
}
