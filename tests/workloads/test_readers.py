"""Each reader parses the real public traces in ../shared/traces and reproduces known counts
(the figures in each trace's SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.analysis import hit_ratios, stats
from workloads.readers import read_trace

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"

pytestmark = pytest.mark.skipif(not TRACES.exists(), reason=f"shared traces not found at {TRACES}")


def test_mooncake_counts_lengths_and_hit_ratios():
    trace = read_trace(TRACES / "mooncake_fast25" / "synthetic_trace.jsonl")
    assert len(trace.requests) == 3993 and trace.block_tokens == 512
    s = stats(trace)
    assert round(s.input_percentiles["mean"]) == 15325
    assert s.input_percentiles["p50"] == 11587
    assert round(s.output_percentiles["mean"]) == 149
    # SOURCE.md: mean 42.3% per request (65.1% token-weighted), 31.3% above 95%, 55% no hit.
    blocks = hit_ratios(trace, unit="blocks")
    assert blocks.mean() == pytest.approx(0.423, abs=0.001)
    assert (blocks > 0.95).mean() == pytest.approx(0.313, abs=0.001)
    assert s.hit_token_weighted == pytest.approx(0.651, abs=0.001)
    assert s.share_no_hit == pytest.approx(0.55, abs=0.005)


@pytest.mark.parametrize(
    "name, count, input_mean, output_mean",
    [("conv", 19366, 1155, 211), ("code", 8819, 2048, 28)],
)
def test_azure_counts_and_means(name, count, input_mean, output_mean):
    trace = read_trace(TRACES / "azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv")
    s = stats(trace)
    assert s.requests == count
    assert round(s.input_percentiles["mean"]) == input_mean
    assert round(s.output_percentiles["mean"]) == output_mean
    assert s.share_no_hit == 1.0  # no prefix information in this trace
    arrivals = np.array([r.arrival_s for r in trace.requests])
    assert arrivals[0] == 0 and (np.diff(arrivals) >= 0).all()


def test_tracelab_sessions_and_cached_prefixes():
    trace = read_trace(TRACES / "tracelab_example" / "round_trace.jsonl")
    sessions = trace.sessions()
    assert len(trace.requests) == 19
    assert sorted(len(turns) for turns in sessions.values()) == [9, 10]
    for turns in sessions.values():
        for prev, cur in zip(turns, turns[1:], strict=False):
            shared = 0
            for a, b in zip(prev.hash_ids, cur.hash_ids, strict=False):
                if a != b:
                    break
                shared += 1
            assert shared * trace.block_tokens <= cur.input_length
            assert cur.think_time_s is not None and cur.think_time_s >= 0
