"""The one stream parser: native /generate chunks (cumulative or incremental ids) and
OpenAI chunks, errors inside a stream, and the [DONE] line."""

from __future__ import annotations

import json

import pytest

from protocol.stream import Chunk, OutputStream, StreamError, error_event
from workloads.client import iter_new_tokens


def native(ids, total, finish=None, **meta) -> bytes:
    info = {"completion_tokens": total, "prompt_tokens": 5, "finish_reason": finish, **meta}
    return f"data: {json.dumps({'output_ids': ids, 'meta_info': info})}\n\n".encode()


def test_cumulative_and_incremental_chunks_give_the_same_tokens():
    cumulative = [native([7], 1), native([7, 8], 2), native([7, 8, 9], 3, {"type": "length"})]
    incremental = [native([7], 1), native([8], 2), native([9], 3, {"type": "length"})]
    for lines in (cumulative, incremental):
        out = OutputStream()
        news = [out.feed(Chunk.parse(line)) for line in lines]
        assert news == [1, 1, 1] and out.ids == [7, 8, 9] and out.done
        assert out.prompt_tokens == 5
    assert Chunk.parse(cumulative[-1]).echoed() == [7, 8, 9]
    assert Chunk.parse(incremental[-1]).echoed() is None  # not all ids: no echo to check


def test_done_line_errors_and_non_data_lines():
    assert Chunk.parse(b"data: [DONE]\n\n").done
    assert Chunk.parse(b": keep-alive\n").data is None
    assert Chunk.parse(b"data: {not json\n").data is None
    bad = Chunk.parse(error_event("main decode died"))
    assert bad.error == "main decode died"
    out = OutputStream()
    assert out.feed(bad) == 0 and out.error == "main decode died"


def test_an_aborted_request_is_an_error_not_a_finished_answer():
    """SGLang streams a request it aborted (a KV transfer that stalled) as an ordinary
    last chunk with a finish reason of type abort, and no tokens."""
    why = {"type": "abort", "message": "KV transfer stalled", "status_code": 500}
    chunk = Chunk.parse(native([], 0, why))
    assert chunk.finished and "KV transfer stalled" in chunk.error
    out = OutputStream()
    assert out.feed(chunk) == 0 and "KV transfer stalled" in out.error
    assert Chunk.parse(native([7], 1, {"type": "length"})).error is None


def test_openai_chunks_count_tokens_and_read_usage():
    out = OutputStream(native=False)
    for piece in ("He", "llo", ""):
        line = f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n"
        out.feed(Chunk.parse(line))
    usage = {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 9}}
    out.feed(Chunk.parse(f"data: {json.dumps(usage)}\n\n"))
    assert out.tokens == 2 and out.prompt_tokens == 9 and out.done


def test_client_iterator_yields_new_ids_and_raises_on_an_error_event():
    lines = [native([1], 1).decode(), native([1, 2], 2).decode(), "data: [DONE]"]
    assert [ids for ids, _ in iter_new_tokens(lines)] == [[1], [2]]
    with pytest.raises(StreamError, match="boom"):
        list(iter_new_tokens([native([1], 1).decode(), error_event("boom").decode()]))
