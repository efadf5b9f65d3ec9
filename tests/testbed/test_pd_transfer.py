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
from tests.conftest import reference_output
from tests.testbed.conftest import two_sites
from tests.testbed.hostile_frames import assert_closed_soon, chunk, forged, frame, untagged
from workloads.client import generate_payload

pytestmark = [pytest.mark.sglang, pytest.mark.netns]

NEW_TOKENS = 16
KV_BYTES_PER_TOKEN = 8192  # the default tiny model, page size 1


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    scenario = two_sites("cross_site_pd")
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
    assert rec.status == "upstream_error" and rec.error

    # The same servers serve the next request, token-exact.
    fresh = [rng.randrange(10, 4000) for _ in range(300)]
    assert generate(pd, fresh, "s-after-cut", 0)["output_ids"] == reference_output(
        colocated, fresh, NEW_TOKENS
    )


def test_openai_endpoints_stream_through_the_router(pd, colocated):
    """The router tokenizes OpenAI requests and serves them natively: the same text
    and token counts as SGLang's own OpenAI endpoints give, streamed or not."""
    chat = {
        "model": "default",
        "messages": [{"role": "user", "content": "plan the tool call"}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    own = httpx.post(f"{colocated.spec.url}/v1/chat/completions", json=chat, timeout=120).json()
    with httpx.stream(
        "POST",
        f"{pd.router_url}/v1/chat/completions",
        json={**chat, "stream": True, "stream_options": {"include_usage": True}},
        timeout=120,
        headers={headers.SESSION: "s-chat"},
    ) as r:
        assert r.status_code == 200
        chunks = [
            json.loads(line[5:])
            for line in r.iter_lines()
            if line.startswith("data:") and "[DONE]" not in line
        ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == own["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["prompt_tokens"] == own["usage"]["prompt_tokens"]
    rec = last_record(pd, "s-chat")
    assert rec.output_tokens == 8 and rec.first_token is not None and rec.kv_bytes > 0
    assert rec.prompt_tokens == own["usage"]["prompt_tokens"]

    done = {"model": "default", "prompt": "tool result:", "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{pd.router_url}/v1/completions", json=done, timeout=120)
    own = httpx.post(f"{colocated.spec.url}/v1/completions", json=done, timeout=120).json()
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == own["choices"][0]["text"]
    assert r.json()["usage"]["prompt_tokens"] == own["usage"]["prompt_tokens"]

    text = {"text": "tool result:", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    r = httpx.post(f"{pd.router_url}/generate", json=text, timeout=120)
    own = httpx.post(f"{colocated.spec.url}/generate", json=text, timeout=120).json()
    assert r.json()["output_ids"] == own["output_ids"] and r.json()["text"] == own["text"]


def test_the_official_openai_client_streams_chat_and_completions(pd, colocated):
    from openai import OpenAI

    client = OpenAI(base_url=f"{pd.router_url}/v1", api_key="none", timeout=120)
    messages = [{"role": "user", "content": "plan the tool call"}]
    stream = client.chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    own = client.with_options(base_url=f"{colocated.spec.url}/v1").chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert text and text == own.choices[0].message.content
    done = client.completions.create(model="default", prompt="tool result:", max_tokens=4)
    assert done.choices[0].text and done.usage.completion_tokens == 4
    with pytest.raises(Exception, match="not served here"):
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)


def server_busy(pd: Deployment, role: str) -> int:
    """Requests the server of ``role`` runs or queues (SGLang's own /v1/loads)."""
    (server,) = [s for s in pd.servers if s.role == role]
    loads = httpx.get(f"{server.spec.url}/v1/loads", timeout=10).json()["loads"]
    return sum(x.get("num_running_reqs", 0) + x.get("num_waiting_reqs", 0) for x in loads)


def wait_for(check, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while not (ok := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ok


def test_hostile_requests_stop_at_the_router_and_a_client_that_leaves_frees_the_servers(
    pd, colocated
):
    rng = random.Random(31)
    prompt = [rng.randrange(10, 4000) for _ in range(200)]
    good = generate_payload(prompt, NEW_TOKENS, False)
    hostile = [
        ({**good, "input_ids": prompt + [4096]}, 400, "vocabulary"),  # the tiny model: 4096
        ({**good, "input_ids": [-1] + prompt}, 400, "vocabulary"),
        ({**good, "input_ids": [7] * 70_000}, 400, "context"),
        ({**good, "rid": "pdd-md-12345"}, 400, "rid"),
        ({**good, "stream": "no"}, 400, "stream"),
        ({**good, "sampling_params": {"max_new_tokens": [4]}}, 400, "max_new_tokens"),
    ]
    for body, status, words in hostile:
        r = httpx.post(f"{pd.router_url}/generate", json=body, timeout=60)
        assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert server_busy(pd, "decode") == 0 and server_busy(pd, "prefill") == 0

    # A streaming client that leaves after two tokens: the record says so, and the
    # decode server drops the request.
    long = generate_payload(prompt, 2000, True)
    long["sampling_params"]["ignore_eos"] = True
    with httpx.stream(
        "POST",
        f"{pd.router_url}/generate",
        json=long,
        timeout=60,
        headers={headers.SESSION: "s-leave"},
    ) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= 2:
                break
    assert wait_for(lambda: server_busy(pd, "decode") == 0)
    assert last_record(pd, "s-leave").status == "client_cancelled"

    # A non-streaming client that gives up: the same.
    long["stream"] = False
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{pd.router_url}/generate",
            json=long,
            headers={headers.SESSION: "s-give-up"},
            timeout=httpx.Timeout(30, read=1.0),
        )
    assert wait_for(lambda: server_busy(pd, "decode") == 0)
    assert wait_for(lambda: any(r.session_id == "s-give-up" for r in read_records(pd.records_path)))
    assert last_record(pd, "s-give-up").status == "client_cancelled"

    # The servers still serve, token-exact.
    assert generate(pd, prompt, "s-after-hostile", 0)["output_ids"] == reference_output(
        colocated, prompt, NEW_TOKENS
    )


# What a hostile or broken prefill peer sends after decode's transfer request: each must
# end decode's request with a clear error quickly, never a dead receiver thread.
PAGE = KV_BYTES_PER_TOKEN  # the tiny model's page (page size 1)
BAD_PREFILL_REPLIES = {
    "bad magic": lambda room: b"XXXX" + bytes(16),
    "wrong version": lambda room: frame(2, room, b"")[:4] + b"\x09" + frame(2, room, b"")[5:],
    "unknown type": lambda room: frame(99, room, b""),
    "2 GiB chunk header": lambda room: frame(2, room, b"", length=(1 << 31)),
    "oversized chunk": lambda room: frame(2, room, b"", length=64 << 20),
    "chunk without header": lambda room: frame(2, room, b"\x00" * 8),
    "chunk of the wrong size": lambda room: frame(2, room, chunk(0, 1, b"\x01" * 10)),
    "chunk with a bad checksum": lambda room: frame(2, room, chunk(0, 1, b"\x02" * PAGE, 7)),
    "chunk beyond the pages": lambda room: frame(2, room, chunk(10**6, 1, b"\x03" * PAGE)),
    "aux with a bad checksum": lambda room: frame(3, room, b"\x00\x00\x00\x01abc"),
    "done with wrong totals": lambda room: frame(4, room, (5).to_bytes(4, "big") + bytes(8)),
    "short done": lambda room: frame(4, room, b"\x00"),
    "an ack from prefill": lambda room: frame(5, room, b""),
    "prefill reports a failure": lambda room: frame(6, room, b"out of cheese"),
    "cut mid-frame": lambda room: frame(2, room, b"", length=PAGE + 12)[:30],
    "a peer without the frame key": lambda room: untagged(2, room, chunk(0, 1, b"\x04" * PAGE)),
    "a forged tag": lambda room: forged(2, room, chunk(0, 1, b"\x05" * PAGE)),
}


def test_malformed_frames_from_a_prefill_peer_fail_decode_clearly(pd, colocated):
    import socket

    from protocol.frames import recv_frame

    (decode,) = [s for s in pd.servers if s.role == "decode"]
    listener = socket.create_server((pd.net.harness_address, 0))
    port = listener.getsockname()[1]
    rng = random.Random(51)
    try:
        for name, reply in BAD_PREFILL_REPLIES.items():
            room = rng.randrange(1, 1 << 62)
            body = {
                **generate_payload([rng.randrange(10, 4000) for _ in range(32)], 4, False),
                "bootstrap_host": pd.net.harness_address,
                "bootstrap_port": port,
                "bootstrap_room": room,
            }
            result: dict = {}

            def post(body=body, result=result):
                result["r"] = httpx.post(f"{decode.spec.url}/generate", json=body, timeout=60)

            thread = threading.Thread(target=post)
            started = time.monotonic()
            thread.start()
            listener.settimeout(30)
            conn, _ = listener.accept()
            kind, got_room, _ = recv_frame(conn)  # decode's transfer request
            assert (kind.name, got_room) == ("TRANSFER_REQUEST", room)
            conn.sendall(reply(room))
            conn.shutdown(socket.SHUT_WR)  # and nothing more: a cut frame ends here
            thread.join(30)
            took = time.monotonic() - started
            conn.close()
            assert "r" in result, f"{name}: decode did not answer within 30 s"
            r = result["r"]
            text = r.text.lower()
            failed = r.status_code != 200 or "abort" in text or "error" in text
            assert failed and took < 10, (name, r.status_code, r.text[:300], took)
    finally:
        listener.close()
    fresh = [rng.randrange(10, 4000) for _ in range(300)]  # decode still serves
    assert generate(pd, fresh, "s-after-frames", 0)["output_ids"] == reference_output(
        colocated, fresh, NEW_TOKENS
    )


def test_malformed_frames_to_the_prefill_listener_are_refused_and_it_serves_on(pd, colocated):

    (prefill,) = [s for s in pd.servers if s.role == "prefill"]
    address = (prefill.spec.host, pd.scenario.servers.bootstrap_port)
    hostile = [
        b"GET / HTTP/1.1\r\nHost: prefill\r\n\r\n",  # not a PDKV peer at all
        frame(2, 1, b"\x00" * 12),  # a KV chunk where a transfer request belongs
        frame(1, 2, b"", length=1 << 30),  # a 1 GiB transfer request: refused unread
        frame(1, 3, b"\x00" * 5),  # a transfer request too short to decode
        frame(1, 4, b"\x00" * 20),  # one with the wrong KV layout
        frame(99, 5, b""),
        untagged(1, 6, b"\x00" * 20),  # well formed, from a peer without the frame key
        forged(1, 7, b"\x00" * 20),
    ]
    for raw in hostile:
        assert_closed_soon(address, raw)
    fresh = [random.Random(52).randrange(10, 4000) for _ in range(300)]
    assert generate(pd, fresh, "s-after-listener", 0)["output_ids"] == reference_output(
        colocated, fresh, NEW_TOKENS
    )
