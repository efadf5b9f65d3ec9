"""A scaled-down `make bench-bathtub`: two hit ratios on a paced colocated server.

What a user would notice: at 90% hit a request's uncached tail is one prefill chunk
instead of four, so the paced server completes requests faster; sweep.html carries the
bathtub plot (measured beside modelled) and its table.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from protocol.metrics import TtftPart
from reports.hetero import measured_bathtub
from reports.run_data import load_run
from testbed.bench.run import run_bench
from testbed.scenario import Scenario
from tests.conftest import ttft_parts_that_add_up

pytestmark = [pytest.mark.sglang, pytest.mark.netns]


def test_scaled_down_bathtub_sweep(tmp_path):
    base = Scenario.load("bathtub").model_dump()
    base["workload"]["generator"].update(sessions=4)
    base["sweep"] = {"workload.generator.fixed_hit": [0.0, 0.9]}
    base["network"]["check_s"] = 1
    scenario = Scenario.model_validate(base)

    run_dir = run_bench(scenario, tmp_path, Console(file=io.StringIO()))

    html = (run_dir / "sweep.html").read_text()
    assert 'id="bathtub"' in html and 'alt="bathtub"' in html
    points = json.loads((run_dir / "sweep.json").read_text())["points"]
    runs = {p: load_run(run_dir / p) for p in points}
    frame = measured_bathtub(runs).set_index("point")
    low, high = frame.loc["fixed_hit-0.0"], frame.loc["fixed_hit-0.9"]
    assert low["requests"] == high["requests"] == 4
    assert low["hit"] < 0.05 and high["hit"] > 0.6  # the first request of each misses
    assert high["throughput_rps"] > 1.5 * low["throughput_rps"]

    # The server paced chunked passes: at no hit, every 2K-token prompt took 4 chunks.
    pacing = runs["fixed_hit-0.0"].systems["colocated"].pacing
    prefill = pacing[pacing["mode"].isin(["prefill", "extend"]) & (pacing["new_tokens"] >= 256)]
    assert len(prefill) >= 4 * 4 and prefill["new_tokens"].max() <= 512
    emulation = json.loads((run_dir / "fixed_hit-0.0" / "emulation.json").read_text())
    assert emulation["dilation"] == 20 and emulation["kv_scaling"] == "wan_rate"
    report = (run_dir / "fixed_hit-0.0" / "report.html").read_text()
    assert "Emulation mode" in report and "pacing" in report.lower()

    # Where a colocated request's first token went: no KV part, parts add up to TTFT.
    split = ttft_parts_that_add_up(runs["fixed_hit-0.9"].systems["colocated"].records, "colocated")
    assert len(split) == 4 and split[TtftPart.KV].isna().all(), split


def test_calibration_picks_the_dilation_the_run_then_uses(tmp_path):
    """A paced run with emulation.calibrate: a slice of the load first, on the scenario's
    first system, then the run at the k ``settle`` chose from it. One round (each round
    is a deployment of its own; when a second round runs, and at which k, is the rule
    ``settle`` applies, tested round by round in test_calibrate)."""
    import math

    from testbed.bench.calibrate import settle

    base = Scenario.load("bathtub").model_dump()
    base["workload"]["generator"].update(sessions=2, fixed_hit=0.5)
    base["emulation"].update(calibrate=True, calibration_requests=2, calibration_rounds=1)
    base.pop("sweep", None)
    base["network"]["check_s"] = 1
    scenario = Scenario.model_validate(base)

    run_dir = run_bench(scenario, tmp_path, Console(file=io.StringIO()))

    emulation = json.loads((run_dir / "emulation.json").read_text())
    calibration = emulation["calibration"]
    assert calibration["system"] == "colocated" and calibration["by_pass"]
    assert calibration["needed"] > 0 and 0 <= calibration["miss_share"] <= 1
    assert emulation["dilation"] == calibration["dilation"]
    rounds = calibration["rounds"]
    assert len(rounds) == 1 and rounds[0]["tried"] == scenario.emulation.dilation
    # the slice proposes its need x the margin
    assert rounds[0]["proposal"] == max(1, math.ceil(rounds[0]["needed"] * 1.2))
    decision = settle(rounds, tolerance=0.15, max_rounds=1, miss_share=0.025)
    assert (calibration["dilation"], calibration["decision"]) == (decision.k, decision.why)
    assert (run_dir / "calibration" / "round-1" / "colocated" / "records.parquet").exists()
    run = load_run(run_dir)  # the calibration slice is not one of the run's systems
    assert list(run.systems) == ["colocated"] and len(run.systems["colocated"].records) == 2
    assert "Dilation calibrated" in (run_dir / "report.html").read_text()
