"""The OpenAI front on its own, with the tiny model's real tokenizer: the native body
the servers get, and native chunks (hand-made here, standing in for a server's
stream) turned into OpenAI chunks whose text adds up to the decoded output."""

from __future__ import annotations

import json

from protocol.stream import Chunk
from testbed.router.openai import OpenAIFront
from testbed.router.tokens import RouterTokenizer


def native_chunk(ids: list[int], finish: str | None = None) -> Chunk:
    meta = {"completion_tokens": len(ids), "prompt_tokens": 5}
    if finish:
        meta["finish_reason"] = {"type": finish}
    return Chunk.parse(f"data: {json.dumps({'output_ids': ids, 'meta_info': meta})}")


def events(raw: bytes) -> list[dict]:
    lines = [x for x in raw.decode().split("\n\n") if x.startswith("data: ")]
    return [json.loads(x[6:]) for x in lines if x != "data: [DONE]"]


def test_chat_is_tokenized_with_the_template_and_streams_openai_deltas(tiny_model):
    tok = RouterTokenizer(tiny_model)
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "plan the tool call"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    front = OpenAIFront("/v1/chat/completions", body, tok)
    native = front.native()
    assert native["input_ids"] == tok.chat(body["messages"])
    assert native["sampling_params"] == {"temperature": 0, "max_new_tokens": 6}
    out = tok.encode(" the tool result is ready")[:6]
    raw = b"".join(
        front.line(native_chunk(out[:n], "length" if n == len(out) else None))
        for n in range(1, len(out) + 1)
    )
    got = events(raw)
    assert got[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"]["content"] for e in got if e["choices"])
    assert text == tok.decode(out)
    assert got[-2]["choices"][0]["finish_reason"] == "length"
    assert got[-1]["usage"]["completion_tokens"] == len(out) and got[-1]["choices"] == []
    assert front.line(Chunk.parse("data: [DONE]")) == b"data: [DONE]\n\n"


def test_completions_default_to_16_tokens_and_answer_in_one_piece(tiny_model):
    tok = RouterTokenizer(tiny_model)
    front = OpenAIFront("/v1/completions", {"prompt": "tool result:"}, tok)
    native = front.native()
    assert native["input_ids"] == tok.encode("tool result:") and not native["stream"]
    assert native["sampling_params"]["max_new_tokens"] == 16
    ids = tok.encode(" done")
    answer = front.final({"output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}}})
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == " done"
    assert answer["usage"] == {
        "prompt_tokens": len(native["input_ids"]),
        "completion_tokens": len(ids),
        "total_tokens": len(native["input_ids"]) + len(ids),
    }
