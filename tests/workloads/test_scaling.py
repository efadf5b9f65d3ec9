"""Scaling a real trace to this machine keeps its prefix sharing: hit ratios before and
after agree (the context cap aside), and a scale that would split blocks is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.analysis import hit_ratios
from workloads.readers import read_trace
from workloads.scaling import Scaling, scale_trace

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_fast25" / "synthetic_trace.jsonl"


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared traces not found at {TRACES}")
def test_scaled_mooncake_keeps_every_hit_ratio():
    trace = read_trace(MOONCAKE)
    scaled = scale_trace(trace, Scaling(length_scale=1 / 32, output_scale=0.25, time_scale=4))
    assert scaled.block_tokens == 16 and len(scaled.requests) == len(trace.requests)
    before, after = hit_ratios(trace, unit="blocks"), hit_ratios(scaled, unit="blocks")
    np.testing.assert_array_equal(before, after)  # the same blocks are shared
    tokens_before, tokens_after = hit_ratios(trace), hit_ratios(scaled)
    assert abs(tokens_before.mean() - tokens_after.mean()) < 0.005
    assert np.abs(tokens_before - tokens_after).max() < 0.05  # the last block's rounding
    first, last = trace.requests[-1], scaled.requests[-1]
    assert last.arrival_s == pytest.approx(first.arrival_s * 4)
    assert last.output_length == max(1, round(first.output_length * 0.25))
    assert scaled.metadata["length_scale"] == 1 / 32


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared traces not found at {TRACES}")
def test_the_context_cap_cuts_only_the_requests_above_it():
    trace = read_trace(MOONCAKE)
    scaled = scale_trace(trace, Scaling(length_scale=1 / 32, max_context_tokens=2048))
    long = [i for i, r in enumerate(trace.requests) if len(r.hash_ids) > 2048 // 16]
    assert long and scaled.metadata["capped_requests"] == len(long)
    assert max(r.input_length for r in scaled.requests) <= 2048
    uncapped = hit_ratios(scale_trace(trace, Scaling(length_scale=1 / 32)), unit="blocks")
    capped = hit_ratios(scaled, unit="blocks")
    # arrival order is the readers' order here; only capped requests (and those whose
    # hits ran into a capped request's missing blocks) may differ
    assert (uncapped == capped).mean() > 0.95


def test_a_scale_that_splits_blocks_is_a_clear_error():
    from workloads.trace import Request, Trace

    trace = Trace("t", 512, [Request("r", "s", 0, (1, 2), 1000, 10)])
    with pytest.raises(ValueError, match="whole tokens"):
        scale_trace(trace, Scaling(length_scale=0.3))
    with pytest.raises(ValueError, match="positive"):
        Scaling(time_scale=float("nan"))
