"""Scaling a real trace to this machine keeps its prefix sharing: hit ratios before and
after agree (the context cap aside), and a scale that would split blocks is refused."""

from __future__ import annotations

import json
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


def test_a_window_leaves_out_sessions_begun_before_it_and_shares_only_within_itself():
    """Requests from the ``first``-th on, arrivals from the window's first: session a
    began before the window, so its second turn is left out whole; c's block 1 came with
    a's first turn, outside the window, so c hits nothing there."""
    from workloads.scaling import window
    from workloads.trace import Request, Trace

    requests = [
        Request("a0", "a", 0, (1,), 16, 1, arrival_s=5.0),
        Request("b0", "b", 0, (2,), 16, 1, arrival_s=6.0),
        Request("a1", "a", 1, (1, 3), 32, 1, arrival_s=7.0),
        Request("c0", "c", 0, (1, 4), 32, 1, arrival_s=8.0),
        Request("d0", "d", 0, (1, 4, 5), 48, 1, arrival_s=9.0),
    ]
    trace = Trace("t", 16, requests)
    assert window(trace, 0) is trace
    w = window(trace, 1)
    assert [r.request_id for r in w.requests] == ["b0", "c0", "d0"]
    assert [r.arrival_s for r in w.requests] == [0.0, 2.0, 3.0]
    assert w.metadata["first_request"] == 1 and w.metadata["window_left_out"] == 1
    assert list(hit_ratios(w, unit="blocks")) == pytest.approx([0, 0, 2 / 3])
    with pytest.raises(ValueError, match="has 5 requests"):
        window(trace, 5)


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared traces not found at {TRACES}")
def test_the_low_hit_scenario_replays_a_window_with_the_traces_own_hit_shape(tmp_path):
    """The trace's mean hit (42% of blocks) is reuse across thousands of requests: its
    first 120 share under a tenth. The scenario's window, materialized as the bench
    does, holds the trace's shape: mean within 5 points, as many with no hit within 5."""
    from testbed.scenario import Scenario
    from workloads.trace import Trace

    trace = read_trace(MOONCAKE)
    whole = hit_ratios(trace, unit="blocks")
    spec = Scenario.load("mooncake_lowhit").workload
    n = spec.max_requests
    opening = hit_ratios(Trace("t", trace.block_tokens, trace.requests[:n]), unit="blocks")
    assert opening.mean() < 0.1 < whole.mean() - 0.3
    replayed = Trace.from_jsonl(spec.materialize(tmp_path))
    assert replayed.metadata["first_request"] == spec.first_request > 0
    assert replayed.requests[0].arrival_s == 0 and replayed.block_tokens == 16
    window = hit_ratios(Trace("w", 16, replayed.requests[:n]), unit="blocks")
    assert abs(window.mean() - whole.mean()) < 0.05
    assert abs((window == 0).mean() - (whole == 0).mean()) < 0.05


def test_a_window_needs_a_trace_file():
    from pydantic import ValidationError

    from workloads.spec import WorkloadSpec

    with pytest.raises(ValidationError, match="window of a trace file"):
        WorkloadSpec(first_request=10)


def test_a_trace_of_another_format_replayed_as_it_is_becomes_the_testbeds_own(tmp_path):
    """Unscaled and whole, a Mooncake file reaches the bench and the planner (which read
    only the testbed's format) converted, its requests unchanged; before, they were
    handed the Mooncake file itself and refused it."""
    from workloads.spec import WorkloadSpec
    from workloads.trace import Trace

    lines = [
        {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 250, "input_length": 1000, "output_length": 4, "hash_ids": [1, 3]},
    ]
    src = tmp_path / "mooncake.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    path = WorkloadSpec(trace=src, mode="open").materialize(tmp_path / "run")
    assert path != src
    replayed, read = Trace.load(path), read_trace(src)
    assert replayed.block_tokens == read.block_tokens == 512
    assert replayed.requests == read.requests
