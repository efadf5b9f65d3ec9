"""A streaming client for SGLang's native ``/generate``: one request, timed per token."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamResult:
    """What one streamed request produced, with client-side timestamps (monotonic s)."""

    sent_at: float
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    meta_info: dict = field(default_factory=dict)
    finished_at: float | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent_at

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def e2e(self) -> float:
        return (self.finished_at or self.token_times[-1]) - self.sent_at

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


class StreamError(RuntimeError):
    """The server reported an error inside the stream."""


def new_output_ids(chunk: dict, have: int) -> list[int]:
    """The output ids of a ``/generate`` chunk beyond the first ``have``.

    Chunks carry cumulative ids by default, only the new ones with SGLang's
    --incremental-streaming-output; ``completion_tokens`` says how many are new.
    """
    fresh = int(chunk.get("meta_info", {}).get("completion_tokens", 0)) - have
    return list(chunk.get("output_ids") or [])[-fresh:] if fresh > 0 else []


def iter_new_tokens(lines):
    """Parse SGLang's ``/generate`` SSE lines (str); yield (new output ids, meta_info)."""
    seen = 0
    for line in lines:
        if not line or not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise StreamError(str(chunk["error"])[:500])
        new = new_output_ids(chunk, seen)
        seen += len(new)
        yield new, chunk.get("meta_info", {})


def stream_generate(
    client: httpx.Client, url: str, input_ids: list[int], max_new_tokens: int, timeout: float = 300
) -> StreamResult:
    """POST a streaming ``/generate`` and record when each new token arrived."""
    result = StreamResult(sent_at=time.monotonic())
    payload = generate_payload(input_ids, max_new_tokens, stream=True)
    with client.stream("POST", f"{url}/generate", json=payload, timeout=timeout) as response:
        response.raise_for_status()
        for new, meta in iter_new_tokens(response.iter_lines()):
            now = time.monotonic()
            result.output_ids.extend(new)
            result.token_times.extend([now] * len(new))
            result.meta_info = meta
    result.finished_at = time.monotonic()
    return result
