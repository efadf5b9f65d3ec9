"""Peers' load tools, unchanged, against the PDD router: AIPerf from its own venv,
``sglang.bench_serving`` (three backends), and ``testbed bench-peers`` joining
bench_serving's requests to the router's records."""

from __future__ import annotations

import json
import time

import pytest

from protocol.names import Pipeline
from protocol.records import read_records

pytestmark = [pytest.mark.sglang, pytest.mark.netns]


SEEDS = {"sglang": 7, "sglang-oai": 8, "sglang-oai-chat": 9}  # new prompts for each


def test_aiperf_replays_multi_turn_chat_against_the_router_and_agrees_on_ttft(pdd, tmp_path):
    """A peer's load tool, unchanged, from its own venv: AIPerf replays multi-turn chat
    sessions; every request reaches the router (joined by X-Request-ID), long prompts
    take the relay path, and AIPerf's TTFT is the router's plus the client's leg."""
    import statistics
    import subprocess

    from workloads.peers import AIPERF, aiperf_argv, aiperf_requests, multi_turn_dataset

    if not AIPERF.exists():
        pytest.skip("AIPerf is not installed: make setup puts it in .venv-peers")
    dataset = tmp_path / "conversations.jsonl"
    multi_turn_dataset(dataset, sessions=4, turns=3, words=300, seed=91)
    out = tmp_path / "aiperf"
    argv = aiperf_argv(pdd.router_url, pdd.scenario.model.resolve(), dataset, out, sessions=4)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    theirs = aiperf_requests(out)
    assert len(theirs) == 12 and not any(r["error"] for r in theirs.values())
    time.sleep(1.0)  # the router writes a record after the last token
    ours = {r.request_id: r for r in read_records(pdd.records_path) if r.request_id in theirs}
    assert set(ours) == set(theirs) and all(r.status == "ok" for r in ours.values())
    assert any(r.pipeline == Pipeline.P_RLD_MD for r in ours.values())
    # The client's TTFT = the router's + the request's and first chunk's way between them.
    extra = [theirs[i]["ttft_s"] - ours[i].ttft for i in ours]
    print(
        f"AIPerf TTFT - router TTFT: median {statistics.median(extra) * 1000:.1f} ms, "
        f"max {max(extra) * 1000:.1f} ms over {len(extra)} requests"
    )
    assert min(extra) > -0.005, extra  # one clock: the client can never see it earlier
    assert statistics.median(extra) < 0.05, extra
    waits = [ours[i].arrival - theirs[i]["started"] for i in ours]
    assert max(waits) < 0.25, waits  # no request held up before the router took it in


@pytest.mark.parametrize("backend", list(SEEDS))
def test_sglang_bench_serving_runs_unchanged_against_the_router(pdd, backend, tmp_path):
    """A peer's load tool, as its users run it (no extra readiness flags): every request
    completes, text and OpenAI requests are relayed like native ones, and its TTFT
    agrees with the router's records of the same requests."""
    import statistics
    import subprocess
    import sys

    out = tmp_path / "bench.jsonl"
    before = time.time()
    argv = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", backend,
        "--base-url", pdd.router_url, "--tokenizer", str(pdd.scenario.model.resolve()),
        "--dataset-name", "random-ids", "--random-input-len", "300",
        "--random-output-len", "24", "--random-range-ratio", "1", "--num-prompts", "6",
        "--request-rate", "2", "--seed", str(SEEDS[backend]), "--output-file", str(out),
        "--output-details",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 6
    time.sleep(1.0)
    mine = sorted(
        (r for r in read_records(pdd.records_path) if r.arrival >= before), key=lambda r: r.arrival
    )
    assert len(mine) == 7 and all(r.status == "ok" for r in mine)  # its warm-up request too
    measured = mine[1:]  # the benchmark's own requests
    assert any(r.pipeline == "P->RLD->MD" for r in measured)  # 300 new tokens: relayed
    # The same requests seen from both ends, joined in the order they were sent (the
    # tool keeps its requests' order; at 2 req/s they reach the router in it): the
    # client's TTFT is the router's plus its own leg and the first chunk's way back.
    # The median over six is robust to one request the shared machine held up.
    theirs = [t * 1e3 for t in result["ttfts"]]
    ours = [(r.first_token - r.arrival) * 1e3 for r in measured]
    extra = [t - o for t, o in zip(theirs, ours, strict=True)]
    print(f"{backend}: client - router TTFT (ms): {[round(e) for e in extra]}")
    router_ms = statistics.median(ours)
    assert -5 < statistics.median(extra) <= max(60, 0.3 * router_ms), (theirs, ours)


def test_bench_peers_runs_bench_serving_from_the_client_host_and_joins_the_records(pdd, tmp_path):
    """``make bench-peers``' measurement on one system: SGLang's tool in the client host
    against the router, every prompt completed, its ITL and TTFT read, and the router's
    records of the same requests say which pipelines they took (the shared system
    prompt's first request crosses the WAN whole: relayed)."""
    from rich.console import Console

    from testbed.bench import peers

    load = peers.PeerLoad(groups=1, per_group=4, system_prompt_len=600, output_len=12, rate=4)
    row = peers.measure(pdd, tmp_path, load, Console(quiet=True))
    assert row["completed"] == 4 and row["records"] == 5  # the tool's warm-up request too
    assert 0 < row["median_itl_ms"] <= row["p99_itl_ms"]
    assert 0 < row["median_ttft_ms"] <= row["p99_ttft_ms"]
    assert "P->RLD->MD" in row["pipelines"], row


# Last in this module: it kills the deployment's relay and main decode servers.
