"""bench-peers without servers: the tool's command line, the ratios over
same_site_pd, and the refusal of a time-dilated scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from testbed.bench import peers
from testbed.scenario import Scenario, ScenarioError


def test_bench_serving_runs_unchanged_with_the_shared_prefix_dataset_as_token_ids():
    load = peers.PeerLoad(groups=2, per_group=3, rate=0.5)
    argv = peers.bench_serving_argv("http://r:8000", Path("/m"), load, Path("/o.jsonl"))
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert argv[1:3] == ["-m", "sglang.bench_serving"]
    assert "--tokenize-prompt" in argv and flags["--dataset-name"] == "generated-shared-prefix"
    assert argv[argv.index("--num-prompts") + 1] == "6"
    assert argv[argv.index("--request-rate") + 1] == "0.5"


def test_each_system_is_read_over_same_site_pd():
    rows = [
        {"system": s, "median_itl_ms": itl, "p99_itl_ms": 2 * itl, "p99_ttft_ms": ttft}
        for s, itl, ttft in (("same_site_pd", 50, 1000), ("pdd", 60, 1500), ("x", 200, 0))
    ]
    out = {r["system"]: r for r in peers.with_ratios(rows)}
    assert out["pdd"]["median_itl_ms_x"] == 1.2 and out["pdd"]["p99_ttft_ms_x"] == 1.5
    assert out["x"]["p99_itl_ms_x"] == 4.0
    alone = peers.with_ratios(
        [{"system": "pdd", "median_itl_ms": 1, "p99_itl_ms": 1, "p99_ttft_ms": 1}]
    )
    assert alone[0]["median_itl_ms_x"] is None  # no baseline ran: no ratio, no guess


def test_a_time_dilated_scenario_is_refused_before_anything_starts(tmp_path):
    hetero = Scenario.load("hetero")
    with pytest.raises(ScenarioError, match="wall-clock"):
        peers.run_peers(hetero, tmp_path, Console(quiet=True))
    assert not list(tmp_path.iterdir())  # no run directory passed off as a result
