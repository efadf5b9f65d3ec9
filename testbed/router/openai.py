"""OpenAI endpoints served by the native pipelines.

A ``/v1/completions`` or ``/v1/chat/completions`` request is tokenized at the router
(the served model's tokenizer and chat template: the ids SGLang would compute), sent
to the servers as a native ``/generate`` with those ids, and its answer turned back
into the OpenAI shape on the way out. So OpenAI clients get the same prefix
prediction and the same pipelines — relay decode and the handoff included — as
native ones.

Lifecycle of one :class:`OpenAIFront`: made from the request (``native`` gives the
body the servers get); ``line`` turns each native stream chunk into an OpenAI SSE line
(text deltas decoded by the router from the output ids, so the stream reads the same
whichever decoder produced a token); ``final`` builds a non-streamed answer.
"""

from __future__ import annotations

import json
import time
import uuid

from protocol.stream import DONE_LINE, Chunk
from testbed.router.tokens import RouterTokenizer

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
PASSED = (  # OpenAI sampling fields SGLang's sampling_params take as they are
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_tokens",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and SGLang's) default for completions


class OpenAIFront:
    def __init__(self, path: str, body: dict, tokenizer: RouterTokenizer) -> None:
        self.chat = path == CHAT
        self.body, self.tokenizer = body, tokenizer
        self.model = body.get("model") or "default"
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.ids: list[int] = []  # output ids the client has been sent
        self.text = ""  # their text, as sent
        self.prompt_tokens = 0
        self.started = False
        options = body.get("stream_options") or {}
        self.include_usage = bool(isinstance(options, dict) and options.get("include_usage"))

    def native(self) -> dict:
        """The ``/generate`` body the servers get."""
        body = self.body
        if self.chat:
            ids = self.tokenizer.chat(body["messages"])
        elif isinstance(body["prompt"], list):
            ids = list(body["prompt"])
        else:
            ids = self.tokenizer.encode(body["prompt"])
        self.prompt_tokens = len(ids)
        params = {k: body[k] for k in PASSED if body.get(k) is not None}
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is None and not self.chat:
            limit = COMPLETIONS_DEFAULT_MAX_TOKENS
        if limit is not None:
            params["max_new_tokens"] = limit
        if body.get("seed") is not None:
            params["sampling_seed"] = body["seed"]
        native = {"input_ids": ids, "sampling_params": params, "stream": bool(body.get("stream"))}
        if body.get("rid") is not None:
            native["rid"] = body["rid"]
        return native

    # -- streamed -----------------------------------------------------------------
    def line(self, chunk: Chunk) -> bytes:
        """An OpenAI SSE line (or lines) for one native chunk; b"" when it carries
        nothing the client needs (no new text yet)."""
        if chunk.done:
            return DONE_LINE
        if chunk.data is None or chunk.error:
            return chunk.line  # keep-alives and error events pass as they are
        self.ids += chunk.new_ids(len(self.ids))
        finish = _finish_reason(chunk.meta)
        delta = self._delta(final=finish is not None)
        if not delta and finish is None and self.started:
            return b""
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {"content": delta}
            if not self.started:
                choice["delta"]["role"] = "assistant"
        else:
            choice["text"] = delta
        self.started = True
        out = _sse(self._envelope([choice]))
        if finish is not None and self.include_usage:
            out += _sse(self._envelope([], usage=self._usage(chunk.meta)))
        return out

    def _delta(self, final: bool) -> str:
        text = self.tokenizer.decode(self.ids)
        if not final and text.endswith("\ufffd"):  # half a character: wait for the rest
            return ""
        delta, self.text = text[len(self.text) :], text
        return delta

    # -- not streamed ---------------------------------------------------------------
    def final(self, data: dict) -> dict:
        """The OpenAI answer from the native one (its output ids, or those the
        router collected when it stitched the answer from two decoders)."""
        ids = list(self.ids or data.get("output_ids") or [])
        text = self.tokenizer.decode(ids)
        finish = _finish_reason(data.get("meta_info") or {}) or "stop"
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update({"logprobs": None, "finish_reason": finish})
        return self._envelope([choice], usage=self._usage(data.get("meta_info") or {}, len(ids)))

    def _envelope(self, choices: list, usage: dict | None = None) -> dict:
        chunked = "chat.completion.chunk" if self.chat else "text_completion"
        whole = "chat.completion" if self.chat else "text_completion"
        streamed = bool(self.body.get("stream"))
        out = {
            "id": self.id,
            "object": chunked if streamed else whole,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            out["usage"] = usage
        return out

    def _usage(self, meta: dict, completion: int | None = None) -> dict:
        completion = len(self.ids) if completion is None else completion
        prompt = int(meta.get("prompt_tokens") or self.prompt_tokens)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if meta.get("cached_tokens") is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": meta["cached_tokens"]}
        return usage


def _finish_reason(meta: dict) -> str | None:
    reason = meta.get("finish_reason")
    if not reason:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(kind, "stop")


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()
