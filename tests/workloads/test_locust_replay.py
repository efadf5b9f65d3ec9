"""Real Locust replays a generated trace through the real router into a real SGLang server."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from protocol.metrics import Metric
from testbed.router.config import RouterConfig, ServerEntry
from testbed.workload_cli import LOCUSTFILE
from workloads.generator import AgenticConfig, generate
from workloads.trace import Trace

pytestmark = pytest.mark.sglang


@pytest.fixture
def router(colocated, tmp_path):
    config = RouterConfig(
        system="colocated",
        policy="colocated",
        records=tmp_path / "records.jsonl",
        host="127.0.0.1",
        port=30451,
        servers=[ServerEntry(name="c", url=colocated.spec.url, role="colocated", host="127.0.0.1")],
    )
    path = tmp_path / "router.json"
    path.write_text(config.model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "testbed.router", str(path)])
    try:
        for _ in range(100):
            try:
                if httpx.get("http://127.0.0.1:30451/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield config
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_locust(users: int, trace, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """Headless Locust with the project's locustfile against the test router."""
    argv = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        "120s",
        "--host",
        "http://127.0.0.1:30451",
        "--trace",
        str(trace),
        "--records",
        str(tmp_path / "client.jsonl"),
        "--only-summary",
        "--stop-timeout",
        "10",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_closed_loop_sessions_through_locust(router, tmp_path):
    config = AgenticConfig(
        sessions=3,
        turns=(3, 3),
        seed=2,
        anomalous_share=0.0,
        length_scale=0.25,
        time_scale=0.1,
        output_tokens=(8, 16),
    )
    trace = generate(config)
    trace.to_jsonl(tmp_path / "trace.jsonl")
    done = run_locust(2, tmp_path / "trace.jsonl", tmp_path, "--csv", str(tmp_path / "locust"))
    assert done.returncode == 0, done.stderr[-3000:]

    rows = list(csv.DictReader((tmp_path / "locust_stats.csv").read_text().splitlines()))
    types = {r["Type"] for r in rows}
    for metric in (Metric.TTFT, Metric.ITL, Metric.E2E, Metric.OUTPUT_TOKENS):
        assert metric.value in types, types
    ttft = next(r for r in rows if r["Type"] == Metric.TTFT.value)
    assert int(ttft["Request Count"]) == len(trace.requests) and int(ttft["Failure Count"]) == 0
    # Requests count once in the Aggregated row; ITL has a sample per token gap.
    total = next(r for r in rows if r["Name"] == "Aggregated")
    assert int(total["Request Count"]) == len(trace.requests)
    itl = next(r for r in rows if r["Type"] == Metric.ITL.value)
    gaps = sum(r.output_length - 1 for r in trace.requests)
    assert int(itl["Request Count"]) == gaps

    records = [json.loads(line) for line in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert len(records) == len(trace.requests)
    by_session = {}
    for r in records:
        assert r["status"] == "ok" and r["output_tokens"] == r["expected_output_tokens"]
        by_session.setdefault(r["session_id"], []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: r["turn"])
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur["sent"] >= prev["finish"]  # closed loop: after the previous turn
            assert cur["prompt_tokens"] > prev["prompt_tokens"] + prev["output_tokens"] - 1
    # The router saw the same requests and the server's prefix cache at work.
    routed = [json.loads(line) for line in router.records.read_text().splitlines()]
    assert len(routed) == len(records)
    assert any(r["turn"] and r["cached_tokens_prefill"] for r in routed)


def test_open_loop_replays_arrival_times(router, tmp_path):
    trace = generate(
        AgenticConfig(
            sessions=1,
            turns=(1, 1),
            seed=3,
            anomalous_share=0.0,
            length_scale=0.25,
            output_tokens=(8, 8),
        )
    )
    # Three independent requests arriving 0, 1 and 2 s into the run.
    reqs = [
        replace(trace.requests[0], request_id=f"o{i}", session_id=f"o{i}", arrival_s=float(i))
        for i in range(3)
    ]
    Trace("open", trace.block_tokens, reqs).to_jsonl(tmp_path / "open.jsonl")
    done = run_locust(1, tmp_path / "open.jsonl", tmp_path, "--mode", "open")
    assert done.returncode == 0, done.stderr[-3000:]
    records = sorted(
        (json.loads(line) for line in (tmp_path / "client.jsonl").read_text().splitlines()),
        key=lambda r: r["sent"],
    )
    assert [r["session_id"] for r in records] == ["o0", "o1", "o2"]
    gaps = [b["sent"] - a["sent"] for a, b in zip(records, records[1:], strict=False)]
    assert all(0.8 <= g <= 1.5 for g in gaps), gaps  # sent on the arrival clock


def test_a_missing_or_bad_trace_stops_locust_with_a_clear_error(tmp_path):
    """No server needed: Locust must refuse at the start, not replay nothing."""
    for trace, words in (("", "--trace is required"), (tmp_path / "none.jsonl", "none.jsonl")):
        argv = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "30s",
            "--host",
            "http://127.0.0.1:9",
            "--trace",
            str(trace),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and words in done.stderr, done.stderr[-2000:]


def test_a_master_and_two_workers_replay_every_request_exactly_once(router, tmp_path):
    """Locust's own distributed mode: each worker replays its shard of the sessions;
    the merged records hold every request once, and TTFT agrees with one process."""
    from statistics import median

    from workloads.shards import merge_shards

    trace = generate(
        AgenticConfig(
            sessions=6, turns=(2, 3), seed=4, anomalous_share=0.0, length_scale=0.25,
            time_scale=0.1, output_tokens=(8, 12),
        )
    )  # fmt: skip
    trace.to_jsonl(tmp_path / "trace.jsonl")
    records = tmp_path / "client.jsonl"
    port = 5599
    common = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    master = subprocess.Popen(
        [*common, "--headless", "--master", "--expect-workers", "2", "--master-bind-port",
         str(port), "-u", "4", "-r", "4", "-t", "120s", "--host", "http://127.0.0.1:30451",
         "--trace", str(tmp_path / "trace.jsonl"), "--records", str(records),
         "--only-summary", "--stop-timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    workers = [
        subprocess.Popen(
            [*common, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(2)
    ]
    try:
        _, err = master.communicate(timeout=300)
        assert master.returncode == 0, err[-3000:]
    finally:
        for w in [master, *workers]:
            if w.poll() is None:
                w.terminate()
            w.wait(30)
    assert merge_shards(records, 2) == len(trace.requests)
    merged = [json.loads(x) for x in records.read_text().splitlines()]
    assert sorted(r["request_id"].rsplit("-", 1)[0] for r in merged) == sorted(
        r.request_id for r in trace.requests
    )  # every request exactly once
    assert all(r["status"] == "ok" for r in merged)
    shards = {r["session_id"]: [] for r in merged}
    for part in (tmp_path / "client-w0.jsonl", tmp_path / "client-w1.jsonl"):
        lines = part.read_text().splitlines()
        assert lines, "each worker replayed a share"
        for x in lines:
            shards[json.loads(x)["session_id"]].append(part.name)
    assert all(len(set(v)) == 1 for v in shards.values())  # a session never spans workers

    single = run_locust(4, tmp_path / "trace.jsonl", tmp_path / "one", "--records",
                        str(tmp_path / "one.jsonl"))  # fmt: skip
    assert single.returncode == 0, single.stderr[-2000:]
    one = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]

    def ttft(rows):
        return median(r["first_token"] - r["sent"] for r in rows)

    # The same load either way: the medians agree within noise on a shared machine.
    assert ttft(merged) <= 3 * ttft(one) + 0.2 and ttft(one) <= 3 * ttft(merged) + 0.2


def test_the_web_ui_has_a_pdd_tab_with_the_routers_live_figures(router, tmp_path):
    """Locust's web UI (its extension point): a PDD tab whose table is the router's
    live /pdd/stats, served with Locust's own statistics."""
    trace = generate(
        AgenticConfig(
            sessions=2, turns=(2, 2), seed=6, anomalous_share=0.0, length_scale=0.25,
            time_scale=0.1, output_tokens=(8, 8),
        )
    )  # fmt: skip
    trace.to_jsonl(tmp_path / "trace.jsonl")
    web = 8391
    proc = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--autostart", "-u", "2",
         "-r", "2", "-t", "60s", "--web-port", str(web), "--web-host", "127.0.0.1",
         "--host", "http://127.0.0.1:30451", "--trace", str(tmp_path / "trace.jsonl")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        page = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                stats = httpx.get(f"http://127.0.0.1:{web}/stats/requests", timeout=5).json()
                (pdd,) = [x for x in stats.get("extended_stats", []) if x["key"] == "pdd"]
                figures = {row["figure"]: row["value"] for row in pdd["data"]}
                if figures.get("requests the router finished") not in (None, "0", "None"):
                    page = figures
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1.0)
        assert page is not None, "no PDD figures in the web UI's statistics"
        assert "colocated" in page["requests per pipeline"]
        index = httpx.get(f"http://127.0.0.1:{web}/", timeout=5).text
        assert '"PDD"' in index or "PDD" in index  # the tab is declared to the UI
        # The trace is done: the runner stops (not quits), and a second test from the
        # UI's HTTP API replays it again from a fresh state.
        ui = f"http://127.0.0.1:{web}"
        deadline = time.monotonic() + 120
        while httpx.get(f"{ui}/stats/requests", timeout=5).json()["state"] != "stopped":
            assert time.monotonic() < deadline, "the first test never stopped"
            time.sleep(1.0)
        first = _e2e_count(ui)
        assert first == len(trace.requests)
        r = httpx.post(f"{ui}/swarm", data={"user_count": 2, "spawn_rate": 2}, timeout=10)
        assert r.status_code == 200 and r.json().get("success"), r.text
        deadline = time.monotonic() + 120
        while _e2e_count(ui) < len(trace.requests):
            assert time.monotonic() < deadline, "the second test did not replay the trace"
            time.sleep(1.0)
    finally:
        proc.terminate()
        proc.wait(30)


def _e2e_count(ui: str) -> int:
    """Requests of the current test (Locust resets its statistics when a test starts)."""
    stats = httpx.get(f"{ui}/stats/requests", timeout=5).json()["stats"]
    return sum(row["num_requests"] for row in stats if row.get("method") == "e2e_s")
