"""The router against hostile and careless requests (a real router process; its only
server is unreachable, which the malformed requests must never get as far as): every
one is a clear JSON error with the right status and a ``rejected`` record, and the
router goes on serving."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from protocol import headers
from testbed.router.validate import RequestLimits
from tests.testbed.router_process import colocated_config, free_port, running_router

OK = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (endpoint, body or raw bytes, extra headers, expected status, words in the message)
CASES = [
    ("/generate", b"{not json", {}, 400, "not JSON"),
    ("/generate", b"", {}, 400, "not JSON"),
    ("/generate", b"\xff\xfe\x00garbage", {}, 400, "not JSON"),
    ("/generate", b"[" * 100_000, {}, 400, "JSON"),
    ("/generate", b'"a string"', {}, 400, "JSON object"),
    ("/generate", b"[1, 2]", {}, 400, "JSON object"),
    ("/generate", b"null", {}, 400, "JSON object"),
    ("/generate", {}, {}, 400, "exactly one of text and input_ids"),
    ("/generate", {"text": "a", "input_ids": [1]}, {}, 400, "exactly one"),
    ("/generate", {"input_ids": []}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": "1 2 3"}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, "2"]}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, 2.5]}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, True]}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": [[1, 2], [3]]}, {}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, -5]}, {}, 400, "vocabulary"),
    ("/generate", {"input_ids": [1, 1000]}, {}, 400, "vocabulary"),
    ("/generate", {"input_ids": [10**30]}, {}, 400, "vocabulary"),
    (
        "/generate",
        {"input_ids": [1] * 4000, "sampling_params": {"max_new_tokens": 200}},
        {},
        400,
        "context",
    ),
    ("/generate", {**OK, "sampling_params": "fast"}, {}, 400, "sampling_params"),
    ("/generate", {**OK, "sampling_params": {"max_new_tokens": -1}}, {}, 400, "max_new_tokens"),
    ("/generate", {**OK, "sampling_params": {"max_new_tokens": [4]}}, {}, 400, "max_new_tokens"),
    ("/generate", {**OK, "sampling_params": {"max_new_tokens": "4"}}, {}, 400, "max_new_tokens"),
    ("/generate", {**OK, "sampling_params": {"temperature": -1}}, {}, 400, "temperature"),
    ("/generate", {**OK, "sampling_params": {"temperature": "hot"}}, {}, 400, "temperature"),
    ("/generate", {**OK, "sampling_params": {"top_p": 0}}, {}, 400, "top_p"),
    ("/generate", {**OK, "sampling_params": {"n": 3}}, {}, 400, "n"),
    ("/generate", {**OK, "sampling_params": {"stop": 5}}, {}, 400, "stop"),
    ("/generate", {**OK, "stream": "no"}, {}, 400, "stream"),
    ("/generate", {**OK, "stream": 1}, {}, 400, "stream"),
    ("/generate", {**OK, "rid": "pdd-md-42"}, {}, 400, "rid"),
    ("/generate", {**OK, "rid": "pdd-align-1"}, {}, 400, "rid"),
    ("/generate", {**OK, "rid": 7}, {}, 400, "rid"),
    ("/generate", OK, {headers.TURN: "first"}, 400, "x-turn"),
    ("/generate", OK, {headers.TURN: "-1"}, 400, "x-turn"),
    ("/generate", OK, {headers.TURN: "99999999999999999999"}, 400, "x-turn"),
    ("/generate", OK, {headers.HANDOFF_AT: "soon"}, 400, "x-pdd-handoff-at"),
    ("/generate", OK, {headers.HANDOFF_AT: "0"}, 400, "x-pdd-handoff-at"),
    ("/generate", OK, {headers.HANDOFF_MODE: "sideways"}, 400, "x-pdd-handoff-mode"),
    ("/generate", OK, {headers.PIPELINE: "P->X"}, 400, "x-pdd-pipeline"),
    ("/generate", OK, {headers.SESSION: "s" * 500}, 400, "x-session-id"),
    ("/generate", OK, {headers.REQUEST_ID: "a\tb"}, 400, "x-request-id"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "model": "gpt-9"}, {}, 404, "gpt-9"),
    ("/v1/completions", {"max_tokens": 2}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "", "max_tokens": 2}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": [2]}, {}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, {}, 400, "context"),
    ("/v1/completions", {"prompt": [1, 5000], "max_tokens": 2}, {}, 400, "vocabulary"),
    ("/v1/chat/completions", {"max_tokens": 2}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": ["hi", "there"]}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, {}, 400, "role"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, {}, 400, "stream"),
    ("/v1/chat/completions", {**CHAT, "model": "unknown"}, {}, 404, "unknown"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -3}, {}, 400, "max_completion"),
]


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    limits = RequestLimits(
        vocab_size=1000, context_tokens=4096, served_models=("default",), max_body_bytes=1 << 20
    )
    config = colocated_config(tmp, {"gone": free_port()}, limits=limits)
    with running_router(config, tmp) as url:
        yield url, tmp


def test_every_malformed_request_is_a_clear_json_error_and_a_rejected_record(router):
    url, tmp = router
    assert len(CASES) >= 40
    for path, body, extra, status, words in CASES:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(url + path, content=data, headers=extra, timeout=10)
        assert r.status_code == status, (path, body if len(data) < 300 else data[:40], r.text)
        error = r.json()["error"]
        assert words.lower() in error["message"].lower(), (words, error)
        assert error["code"] == status
    time.sleep(0.2)
    records = [json.loads(x) for x in (tmp / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(CASES)  # exactly one record each
    assert {r["status"] for r in records} == {"rejected"}
    # Still serving: a valid request gets as far as routing (its only server is down).
    r = httpx.post(url + "/generate", json=OK, timeout=30)
    assert r.status_code == 503 and "gone" in r.json()["error"]["message"]  # health-checked


def test_a_body_over_the_limit_and_a_bad_charset_are_refused_cleanly(router):
    url, _ = router
    big = json.dumps({"input_ids": [1] * 400_000}).encode()  # 1.2 MB > 1 MiB
    r = httpx.post(url + "/generate", content=big, timeout=30)
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    r = httpx.post(
        url + "/generate",
        content=json.dumps(OK).encode(),
        headers={"Content-Type": "application/json; charset=klingon"},
        timeout=30,
    )
    assert r.status_code == 503  # the charset is ignored (JSON is UTF-8): it reached routing
