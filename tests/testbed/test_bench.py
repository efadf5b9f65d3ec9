"""A scaled-down `make bench`: cross-site PD and PDD under Locust, a few requests, the
full report; PDD's streams token-exact against cross-site PD's for every request; and
`testbed report` rebuilding the same tables from the run directory alone."""

from __future__ import annotations

import io
import subprocess
import sys

import pandas as pd
import pytest
from rich.console import Console

from protocol.metrics import TtftPart
from reports.harness import harness
from reports.run_data import load_run
from reports.tables import all_tables
from testbed.bench.run import run_bench
from testbed.scenario import Scenario
from tests.conftest import ttft_parts_that_add_up

pytestmark = [pytest.mark.sglang, pytest.mark.netns]

SECTIONS = [
    "checks",
    "ttft",
    "itl",
    "goodput",
    "wan",
    "hits",
    "routing",
    "relay",
    "paper",
    "emulation",
    "links",
    "harness",
]


def test_small_bench_writes_a_complete_report_that_regenerates(tmp_path):
    base = Scenario.load("default").model_dump()
    base["workload"]["generator"].update(
        sessions=2, turns=[2, 2], anomalous_share=0.0, output_tokens=[8, 16]
    )
    # colocated's records (no KV part in its TTFT) are checked in test_bathtub_bench
    base["systems"] = ["same_site_pd", "cross_site_pd", "pdd"]
    base["network"]["check_s"] = 1  # the link check's iperf3 runs (the report has them)
    scenario = Scenario.model_validate(base)

    run_dir = run_bench(scenario, tmp_path, Console(file=io.StringIO()))

    html = (run_dir / "report.html").read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html, section
    assert "<img" in html and "No KV crossed the WAN" not in html
    for system in scenario.systems:
        assert (run_dir / system / "records.parquet").exists()
        assert (run_dir / system / "manifest.json").exists()
        assert (run_dir / system / "locust_stats.csv").exists()
    run = load_run(run_dir)
    own = harness(run).set_index("system")  # Locust's CPU and share of TTFT, per system
    assert (own["locust_processes"] == 1).all() and (own["load_cpu_ms_per_request"] > 0).all()
    assert own["harness_share_p50"].between(0, 1).all()
    lat = all_tables(run)["latency"].set_index("system")
    assert (lat["requests"] == 4).all() and (lat["errors"] == 0).all()
    assert (run.systems["cross_site_pd"].records["kv_link"] == "wan").all()
    assert "No relay-decode system" not in html and "No handoffs" not in html
    # The same trace turn (session and turn in the request id) got the same tokens.
    outputs = {
        name: {r.request_id.split("-")[0]: list(r.output_ids) for r in s.records.itertuples()}
        for name, s in run.systems.items()
    }
    assert outputs["pdd"] == outputs["cross_site_pd"]
    assert all(len(ids) > 0 for ids in outputs["pdd"].values())
    pdd = run.systems["pdd"].records
    assert set(pdd["pipeline"]) <= {"P->MD", "P->RLD->MD", "RLD-only"}
    assert (pdd["eager_tokens"] > 0).any()  # relay decode streamed under load
    to_md = pdd[pdd["pipeline"].isin(["P->MD", "P->RLD->MD"])]
    assert to_md["predicted_wan_s"].notna().all()  # each KV to MD carries its prediction
    # ... and its span, from P's first byte out: one way (10 ms, ±1 ms jitter) more than
    # the receiver's first to last byte, predicted (the line's way across) and measured
    # (the sender's stamp came in the Done frame; every cross_site_pd KV crossed)
    way = to_md["predicted_kv_span_s"] - to_md["predicted_wan_s"]
    assert way.between(0.008, 0.1).all(), way
    cross = run.systems["cross_site_pd"].records
    assert ((cross["kv_span_s"] - cross["kv_transfer_s"]) > 0.008).all(), cross["kv_span_s"]
    for name, s in run.systems.items():  # where each first token's time went
        split = ttft_parts_that_add_up(s.records, name)
        why = split.join(s.records[["request_id", "pipeline", "fallback"]])
        assert split[TtftPart.SERVER].isna().all(), (name, why)  # stamps joined from logs
    manifest = run.systems["pdd"].manifest
    assert all(s["argv"][:2] == ["taskset", "-c"] for s in manifest["servers"])  # pinned

    before = all_tables(run)
    (run_dir / "report.html").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "report.html").exists()
    after = all_tables(load_run(run_dir))
    for name, frame in before.items():
        pd.testing.assert_frame_equal(frame, after[name], check_dtype=False)
