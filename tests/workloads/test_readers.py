"""Each reader parses the real public traces in ../shared/traces and reproduces known counts
(the figures in each trace's SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.analysis import hit_ratios, stats
from workloads.readers import read_trace
from workloads.trace import TraceError

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


MOONCAKE_OK = '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}'
PDD_HEAD = '{"trace": {"name": "t", "block_tokens": 512, "schema_version": 1}}'
PDD_OK = (
    '{"request_id": "a", "session_id": "s", "turn": 0, "hash_ids": [1], '
    '"input_length": 100, "output_length": 5}'
)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("empty.jsonl", "", "empty file"),
        ("blank.jsonl", "\n\n", "empty file"),
        ("garbage.jsonl", "hello\n", "not JSON"),
        ("list.jsonl", "[1, 2]\n", "not a JSON object"),
        ("header-only.jsonl", PDD_HEAD + "\n", "no requests"),
        ("null-hash.jsonl", MOONCAKE_OK.replace("[1, 2]", "null") + "\n", ":1: hash_ids"),
        ("str-time.jsonl", MOONCAKE_OK.replace('"timestamp": 0', '"timestamp": "now"'), ":1:"),
        ("nan-time.jsonl", MOONCAKE_OK.replace('"timestamp": 0', '"timestamp": NaN'), "finite"),
        (
            "neg-out.jsonl",
            MOONCAKE_OK.replace('"output_length": 10', '"output_length": -4'),
            "within 0..",
        ),
        ("frac-in.jsonl", MOONCAKE_OK.replace("600", "60.5"), "integer"),
        ("beyond-blocks.jsonl", MOONCAKE_OK.replace("600", "1025"), "2 blocks of 512"),
        ("pdd-beyond.jsonl", PDD_HEAD + "\n" + PDD_OK.replace("100", "513"), "1 blocks of 512"),
        ("missing.jsonl", '{"timestamp": 0, "hash_ids": [1]}\n', "missing field"),
        ("bad-line3.jsonl", MOONCAKE_OK + "\n" + MOONCAKE_OK + "\n{oops\n", ":3:"),
        ("pdd-neg-turn.jsonl", PDD_HEAD + "\n" + PDD_OK.replace('"turn": 0', '"turn": -1'), ":2:"),
        ("pdd-extra.jsonl", PDD_HEAD + "\n" + PDD_OK.replace("{", '{"colour": 1, ', 1), "unknown"),
        (
            "pdd-inf-think.jsonl",
            PDD_HEAD + "\n" + PDD_OK[:-1] + ', "think_time_s": Infinity}',
            "finite",
        ),
        ("pdd-block0.jsonl", PDD_HEAD.replace("512", "0") + "\n" + PDD_OK, "block_tokens"),
        (  # hung the planner
            "pdd-block-huge.jsonl",
            PDD_HEAD.replace("512", "1000000000000") + "\n" + PDD_OK,
            "block_tokens must be an integer within",
        ),
        (
            "pdd-input-huge.jsonl",
            PDD_HEAD + "\n" + PDD_OK.replace('"input_length": 100', '"input_length": 100000000000'),
            "at most 10,000,000",
        ),
        (
            "pdd-schema.jsonl",
            PDD_HEAD.replace('"schema_version": 1', '"schema_version": 9'),
            "schema",
        ),
        (
            "azure.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,abc,3\n",
            ":2:",
        ),
        ("azure-cols.csv", "TIME,Tokens\n1,2\n", "missing column"),
        (
            "azure-huge.csv",  # its block list exhausted memory
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,100000000000,3\n",
            ":2: ContextTokens must be within",
        ),
        ("azure-empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        (
            "tracelab.jsonl",
            '{"input_tokens_total": "many", "session_id": "s", "round_index": 0, '
            '"prefix_tokens": 0, "output_tokens": 3}\n',
            ":1:",
        ),
        (
            "tracelab-huge.jsonl",
            '{"input_tokens_total": 1e12, "session_id": "s", "round_index": 0, '
            '"prefix_tokens": 0, "output_tokens": 3}\n',
            ":1: input_tokens_total must be within",
        ),
    ],
)
def test_malformed_traces_are_clear_errors_naming_file_and_line(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert words in str(err.value) and name in str(err.value)


def test_trace_stats_on_a_malformed_trace_exits_2_without_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from testbed.cli import app

    path = tmp_path / "bad.jsonl"
    path.write_text(MOONCAKE_OK.replace("[1, 2]", "null") + "\n")
    result = CliRunner().invoke(app, ["trace", "stats", str(path)])
    assert result.exit_code == 2 and "hash_ids" in result.output
    assert "Traceback" not in result.output
    good = tmp_path / "good.jsonl"
    good.write_text(MOONCAKE_OK + "\n")
    result = CliRunner().invoke(app, ["trace", "stats", str(good), "--cache-blocks", "-1"])
    assert result.exit_code == 2 and "cache-blocks" in result.output
