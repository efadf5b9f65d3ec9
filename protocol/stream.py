"""The one parser of SGLang's streamed responses (server-sent events).

``/generate`` chunks carry the output ids (cumulative by default, only the new ones
with ``--incremental-streaming-output``) and ``meta_info``; OpenAI chunks carry text
deltas in ``choices`` and, at the end, ``usage``. :class:`Chunk` is one ``data:``
line; :class:`OutputStream` follows a whole response (ids, counts, finish).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

DONE_LINE = b"data: [DONE]\n\n"


class StreamError(RuntimeError):
    """The server reported an error inside the stream."""


def error_body(message: str, status: int, kind: str = "server_error") -> dict:
    """An error as OpenAI-compatible servers (SGLang's included) answer it."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error_event(message: str, status: int = 502, kind: str = "upstream_error") -> bytes:
    """An SSE line that tells a client the stream ended in an error."""
    return f"data: {json.dumps(error_body(message, status, kind))}\n\n".encode()


def new_output_ids(data: dict, have: int) -> list[int]:
    """The output ids of a ``/generate`` chunk beyond the first ``have``
    (``completion_tokens`` says how many there are in all)."""
    fresh = int(data.get("meta_info", {}).get("completion_tokens", 0)) - have
    return list(data.get("output_ids") or [])[-fresh:] if fresh > 0 else []


@dataclass(frozen=True)
class Chunk:
    """One SSE line: its bytes as received and, for a ``data:`` line, its JSON."""

    line: bytes
    data: dict | None = None
    done: bool = False  # the ``data: [DONE]`` line

    @classmethod
    def parse(cls, line: bytes | str) -> Chunk:
        raw = line.encode() if isinstance(line, str) else line
        text = raw.decode(errors="replace").strip()
        if not text.startswith("data:"):
            return cls(raw)
        payload = text[5:].strip()
        if payload == "[DONE]":
            return cls(raw, done=True)
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            return cls(raw)
        return cls(raw, data if isinstance(data, dict) else None)

    @property
    def meta(self) -> dict:
        return (self.data or {}).get("meta_info") or {}

    @property
    def error(self) -> str | None:
        """Why the server ended the request: an error event, or a finish of type abort
        (SGLang streams an aborted request, e.g. a failed KV transfer, as an ordinary
        last chunk: never a complete answer)."""
        if not self.data:
            return None
        reason = self.meta.get("finish_reason")
        if isinstance(reason, dict) and reason.get("type") == "abort":
            return f"aborted by the server: {reason.get('message') or 'no reason given'}"[:500]
        if "error" not in self.data:
            return None
        error = self.data["error"]
        if isinstance(error, dict) and "message" in error:
            error = error["message"]
        return str(error)[:500]

    @property
    def finished(self) -> bool:
        """A finish reason: the last chunk with tokens."""
        if self.meta.get("finish_reason"):
            return True
        return any(c.get("finish_reason") for c in (self.data or {}).get("choices") or [])

    def new_ids(self, have: int) -> list[int]:
        """Native output ids beyond the first ``have``."""
        return new_output_ids(self.data, have) if self.data else []

    def echoed(self) -> list[int] | None:
        """All output ids so far, when the chunk carries them cumulatively."""
        ids = (self.data or {}).get("output_ids")
        total = int(self.meta.get("completion_tokens", 0))
        return list(ids) if ids is not None and len(ids) == total else None

    def openai_tokens(self) -> int:
        """Tokens in an OpenAI chunk (one per choice that carries text)."""
        return sum(
            1
            for c in (self.data or {}).get("choices") or []
            if (c.get("delta") or {}).get("content") or c.get("text")
        )


@dataclass
class OutputStream:
    """Follows one streamed response, chunk by chunk."""

    native: bool = True  # /generate (else an OpenAI endpoint)
    ids: list[int] = field(default_factory=list)  # native only
    tokens: int = 0
    done: bool = False  # saw [DONE] or a finish reason
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    meta: dict = field(default_factory=dict)
    error: str | None = None

    def feed(self, chunk: Chunk) -> int:
        """Take one chunk; returns how many new tokens it carried."""
        self.done = self.done or chunk.done or chunk.finished
        if chunk.data is None:
            return 0
        if chunk.error:
            self.error = chunk.error
            return 0
        if not self.native:
            usage = chunk.data.get("usage") or {}
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            new = chunk.openai_tokens()
            self.tokens += new
            return new
        self.meta = chunk.meta
        self.prompt_tokens = self.meta.get("prompt_tokens", self.prompt_tokens)
        self.cached_tokens = self.meta.get("cached_tokens", self.cached_tokens)
        new_ids = chunk.new_ids(len(self.ids))
        self.ids += new_ids
        total = int(self.meta.get("completion_tokens", self.tokens))
        new, self.tokens = max(0, total - self.tokens), max(total, self.tokens)
        return new
