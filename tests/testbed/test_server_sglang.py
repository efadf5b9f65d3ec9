"""A real SGLang server on this host: generate, stream, token-exact vs HF, prefix cache."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from testbed.server import ServerSpec, SGLangServer
from workloads.client import generate_payload, stream_generate

pytestmark = pytest.mark.sglang

PROMPT_LENGTHS = (7, 300, 2100)
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    spec = ServerSpec(model_path=tiny_model, port=30201)
    srv = SGLangServer(spec, tmp_path_factory.mktemp("server") / "server.log")
    srv.start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(10, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def hf_reference(tiny_model):
    """Greedy continuations from HF transformers for the same model and prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    out = {}
    with torch.no_grad():
        for p in prompts(vocab):
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=0,
            )
            out[tuple(p)] = gen[0, len(p) :].tolist()
    return out


def test_greedy_output_is_token_exact_against_hf(server, hf_reference):
    for prompt, expected in hf_reference.items():
        r = httpx.post(
            f"{server.spec.url}/generate",
            json=generate_payload(list(prompt), NEW_TOKENS, stream=False),
            timeout=300,
        )
        r.raise_for_status()
        assert r.json()["output_ids"] == expected, f"prompt of {len(prompt)} tokens"
    assert max(len(p) for p in hf_reference) >= 2000


def test_streaming_generate_yields_the_same_tokens_one_by_one(server, hf_reference):
    prompt, expected = next(iter(hf_reference.items()))
    with httpx.Client() as client:
        r = stream_generate(client, server.spec.url, list(prompt), NEW_TOKENS)
    assert r.output_ids == expected
    assert len(set(r.token_times)) > NEW_TOKENS // 2  # tokens really arrived over time


def test_repeated_prefix_is_reported_as_cached(server):
    rng = random.Random(7)
    prefix = [rng.randrange(10, 4000) for _ in range(400)]
    with httpx.Client() as client:
        first = stream_generate(client, server.spec.url, prefix + [11, 12], 4)
        second = stream_generate(client, server.spec.url, prefix + [13, 14], 4)
    assert first.cached_tokens == 0
    assert second.cached_tokens >= 384  # the shared prefix, to a cache page


def test_streaming_chat_completions(server):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "call the tool"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    chunks = []
    with httpx.stream(
        "POST", f"{server.spec.url}/v1/chat/completions", json=body, timeout=120
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert len(chunks) >= 8 and content
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_cpu_servers_scheduler_and_detokenizer_are_forked_not_spawned(server):
    """engine_patches.cpu.fork_start: SGLang's children of a CPU server are forks of its
    launcher (they inherit its imports), not fresh interpreters that import SGLang again.
    SGLang retitles its children, so the launcher's log says which start method it used."""
    import psutil

    from engine_patches.cpu.fork_start import LOG_LINE

    tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    (launcher,) = [p for p in tree if "sglang.launch_server" in p.cmdline()[:3]]
    titles = sorted(c.cmdline()[0] for c in launcher.children())
    assert titles == ["sglang::detokenizer", "sglang::scheduler"], titles
    assert server.log_path.read_text().count(LOG_LINE) == 1
