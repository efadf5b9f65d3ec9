"""A streaming client for SGLang's native ``/generate``: one request, timed per token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from protocol.records import TokenTimes
from protocol.stream import Chunk, OutputStream, StreamError


@dataclass
class StreamResult(TokenTimes):
    """What one streamed request produced, with client-side timestamps (monotonic s)."""

    START = "sent"
    sent: float
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    meta_info: dict = field(default_factory=dict)
    finish: float | None = None

    @property
    def first_token(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def cached_tokens(self) -> int:
        return int(self.meta_info.get("cached_tokens") or 0)


def generate_payload(input_ids: list[int], max_new_tokens: int, stream: bool) -> dict:
    """Greedy decoding of exactly ``max_new_tokens`` tokens (EOS ignored)."""
    return {
        "input_ids": list(input_ids),
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
        "stream": stream,
    }


def iter_new_tokens(lines):
    """Parse SGLang's ``/generate`` SSE lines; yield (new output ids, meta_info).
    An error inside the stream raises StreamError."""
    out = OutputStream()
    for line in lines:
        chunk = Chunk.parse(line)
        if chunk.done:
            return
        had = len(out.ids)
        out.feed(chunk)
        if out.error:
            raise StreamError(out.error)
        if chunk.data is not None:
            yield out.ids[had:], out.meta


def stream_generate(
    client: httpx.Client, url: str, input_ids: list[int], max_new_tokens: int, timeout: float = 300
) -> StreamResult:
    """POST a streaming ``/generate`` and record when each new token arrived."""
    result = StreamResult(sent=time.monotonic())
    payload = generate_payload(input_ids, max_new_tokens, stream=True)
    with client.stream("POST", f"{url}/generate", json=payload, timeout=timeout) as response:
        response.raise_for_status()
        for new, meta in iter_new_tokens(response.iter_lines()):
            now = time.monotonic()
            result.output_ids.extend(new)
            result.token_times.extend([now] * len(new))
            result.meta_info = meta
    result.finish = time.monotonic()
    return result
