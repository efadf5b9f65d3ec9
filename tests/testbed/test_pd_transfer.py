"""Real KV transfer between SGLang prefill and decode servers over the emulated WAN.

A cross-site PD deployment (prefill in site A, decode in site B, 100 Mbit/s WAN with
5 ms one way) and a colocated reference server; every assertion is on what a user
sees or on bytes that crossed the wire.
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest

from protocol import headers
from protocol.records import read_records
from testbed.deployment import Deployment
from testbed.scenario import Scenario, ServersSpec
from tests.conftest import reference_output
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec
from workloads.client import generate_payload

pytestmark = [pytest.mark.sglang, pytest.mark.netns]

NEW_TOKENS = 16
KV_BYTES_PER_TOKEN = 8192  # the default tiny model, page size 1


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    scenario = Scenario(
        name="test_pd",
        network=NetworkSpec(wan=LinkSpec(rate_mbit=100, delay_ms=5, queue_packets=2000)),
        servers=ServersSpec(kv_idle_timeout_s=5, max_total_tokens=60000),
        systems=["cross_site_pd"],
    )
    with Deployment(scenario, "cross_site_pd", tmp_path_factory.mktemp("pd"), "tpd") as deployment:
        yield deployment


def generate(pd: Deployment, prompt: list[int], session: str, turn: int, timeout=300) -> dict:
    r = httpx.post(
        f"{pd.router_url}/generate",
        json=generate_payload(prompt, NEW_TOKENS, False),
        headers={headers.SESSION: session, headers.TURN: str(turn)},
        timeout=timeout,
    )
    assert r.status_code == 200, r.text[:1000]
    return r.json()


def last_record(pd: Deployment, session: str):
    time.sleep(0.3)
    return [r for r in read_records(pd.records_path) if r.session_id == session][-1]


def test_multi_turn_session_is_token_exact_and_moves_only_missing_kv(pd, colocated):
    rng = random.Random(11)
    prompt = [rng.randrange(10, 4000) for _ in range(1500)]
    moved = []
    for turn in range(3):
        before = pd.net.wan_tx_bytes()
        out = generate(pd, prompt, "s-exact", turn)["output_ids"]
        wire = pd.net.wan_tx_bytes() - before
        assert out == reference_output(colocated, prompt, NEW_TOKENS), f"turn {turn}"

        rec = last_record(pd, "s-exact")
        missing = rec.prompt_tokens - rec.cached_tokens_decode
        # KV payload = bytes per token x tokens decode lacked (page size 1 here).
        assert abs(rec.kv_bytes - missing * KV_BYTES_PER_TOKEN) <= KV_BYTES_PER_TOKEN
        # What really crossed the WAN: the payload plus TCP/IP and HTTP overhead.
        assert rec.kv_wire_bytes <= wire <= 1.08 * rec.kv_wire_bytes + 64_000
        assert rec.kv_link == "wan"
        moved.append(rec.kv_bytes)
        if turn:
            assert rec.cached_tokens_decode > 0.85 * rec.prompt_tokens  # decode-side hit
        # Next turn: the whole exchange plus ~10% new tokens.
        prompt = prompt + out + [rng.randrange(10, 4000) for _ in range(len(prompt) // 9)]
    assert 0.05 < moved[1] / moved[0] < 0.2, moved


def test_transfer_time_follows_the_wan_rate(pd):
    rng = random.Random(5)
    times = {}
    try:
        for rate in (100, 50):
            pd.net.set_wan_rate(rate)
            prompt = [rng.randrange(10, 4000) for _ in range(6000)]
            generate(pd, prompt, f"s-rate-{rate}", 0)
            times[rate] = last_record(pd, f"s-rate-{rate}").kv_transfer_s
    finally:
        pd.net.set_wan_rate(100)
    assert 1.6 <= times[50] / times[100] <= 2.5, times


def test_wan_cut_mid_transfer_fails_clearly_then_servers_recover(pd, colocated):
    rng = random.Random(9)
    prompt = [rng.randrange(10, 4000) for _ in range(7000)]
    result: dict = {}

    def request():
        t0 = time.monotonic()
        r = httpx.post(
            f"{pd.router_url}/generate",
            json=generate_payload(prompt, NEW_TOKENS, True),
            headers={headers.SESSION: "s-cut"},
            timeout=120,
        )
        result.update(status=r.status_code, text=r.text, elapsed=time.monotonic() - t0)

    before = pd.net.wan_tx_bytes()
    worker = threading.Thread(target=request)
    worker.start()
    deadline = time.monotonic() + 60
    while pd.net.wan_tx_bytes() - before < 4_000_000 and time.monotonic() < deadline:
        time.sleep(0.05)  # wait until KV is flowing
    pd.net.cut_wan()
    cut_at = time.monotonic()
    try:
        worker.join(timeout=90)
        assert not worker.is_alive(), "the client hung after the WAN was cut"
    finally:
        pd.net.restore_wan()
    waited = time.monotonic() - cut_at
    assert waited < 45, f"error took {waited:.0f} s after the cut (idle timeout is 5 s)"
    assert "error" in result["text"].lower(), result
    rec = last_record(pd, "s-cut")
    assert rec.status == "error" and rec.error

    # The same servers serve the next request, token-exact.
    fresh = [rng.randrange(10, 4000) for _ in range(300)]
    assert generate(pd, fresh, "s-after-cut", 0)["output_ids"] == reference_output(
        colocated, fresh, NEW_TOKENS
    )


def test_openai_endpoints_stream_through_the_router(pd):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "plan the tool call"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        f"{pd.router_url}/v1/chat/completions",
        json=body,
        timeout=120,
        headers={headers.SESSION: "s-chat"},
    ) as r:
        assert r.status_code == 200
        chunks = [
            json.loads(line[5:])
            for line in r.iter_lines()
            if line.startswith("data:") and "[DONE]" not in line
        ]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    rec = last_record(pd, "s-chat")
    assert rec.output_tokens >= 7 and rec.first_token is not None and rec.kv_bytes > 0

    r = httpx.post(
        f"{pd.router_url}/v1/completions",
        json={"model": "tiny", "prompt": "tool result:", "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
