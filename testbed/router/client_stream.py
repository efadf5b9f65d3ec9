"""What the client of a stitched stream gets: SSE lines as they come, or one JSON body
at the end; every token it is sent is timed into the request's record."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from protocol import clock
from protocol.records import RequestRecord
from protocol.stream import DONE_LINE, Chunk, error_body, error_event
from testbed.router.upstream import UpstreamError

STREAM = "pdd.client_stream"  # request[STREAM]: the client's response, once prepared
FRONT = "pdd.openai_front"  # request[FRONT]: an OpenAI request served natively


def upstream_path(request: web.Request) -> str:
    """The endpoint the servers get: native for a request the router tokenized."""
    return "/generate" if request.get(FRONT) is not None else request.path


def client_line(request: web.Request, chunk: Chunk) -> bytes:
    """What the client gets for one upstream chunk (in its endpoint's shape)."""
    front = request.get(FRONT)
    return chunk.line if front is None else front.line(chunk)


class ClientStream:
    def __init__(self, request: web.Request, stream: bool, record: RequestRecord) -> None:
        self.request, self.stream, self.record = request, stream, record
        self.response: web.StreamResponse | None = None
        self.last: dict | None = None

    async def emit(self, chunk: Chunk, new_tokens: int) -> None:
        now = clock.now()
        if new_tokens:
            self.record.token_times.extend([now] * new_tokens)
            self.record.first_token = self.record.first_token or now
            self.record.output_tokens += new_tokens
        if chunk.data is not None:
            self.last = chunk.data
            self.record.prompt_tokens = chunk.meta.get("prompt_tokens", self.record.prompt_tokens)
        line = client_line(self.request, chunk)  # an OpenAI front follows every chunk
        if not self.stream:
            return
        if self.response is None:
            self.response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream"}
            )
            await self.response.prepare(self.request)
            self.request[STREAM] = self.response
        if not chunk.done and line:
            await self.response.write(line)

    async def finish(self) -> None:
        self.record.finish = clock.now()
        if self.stream:
            if self.response is None:
                self.response = web.StreamResponse(status=200)
                await self.response.prepare(self.request)
                self.request[STREAM] = self.response
            await self.response.write(DONE_LINE)
            await self.response.write_eof()
        else:
            front = self.request.get(FRONT)
            data = self.last or {}
            self.response = web.json_response(data if front is None else front.final(data))

    async def fail(self, exc: UpstreamError) -> web.StreamResponse:
        """A server failed (502), or refused the request (its 4xx: the client's error)."""
        self.record.status, status, kind = exc.answer()
        self.record.error = str(exc)[:500]
        return await answer_error(self.request, str(exc), status, kind)


async def answer_error(request: web.Request, message: str, status: int, kind: str):
    """The error to the client: an SSE error event and the stream's end if the stream
    already started (never a second response), else a JSON error."""
    stream = request.get(STREAM)
    if stream is None or not stream.prepared:
        return web.json_response(error_body(message, status, kind), status=status)
    with contextlib.suppress(ConnectionError):
        await stream.write(error_event(message, status, kind))
        await stream.write_eof()
    return stream


def client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def client_left(request: web.Request, every_s: float = 0.25) -> None:
    """Returns by raising once the client's connection is gone."""
    while not client_gone(request):
        await asyncio.sleep(every_s)
    raise ConnectionResetError("client disconnected")
