"""The router's calls to SGLang servers: one HTTP client session, the prefill call,
and reading a decode stream that must stop the moment its prefill fails."""

from __future__ import annotations

import asyncio

from aiohttp import ClientSession, ClientTimeout, TCPConnector

from protocol.records import RequestRecord
from protocol.stream import Chunk
from testbed.router.config import ServerEntry


class UpstreamError(RuntimeError):
    """A server answered with an error, or its stream carried one."""


class Upstream:
    """The router's HTTP client to its servers (opened on startup, closed on cleanup)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.session: ClientSession | None = None

    async def open(self) -> None:
        # SGLang's HTTP server (uvicorn) closes idle keep-alive connections after 5 s; a
        # request sent on one as it closes fails with "Server disconnected" (seen with
        # think times of a few seconds). Closing them first, at 2 s, avoids the race.
        self.session = ClientSession(
            timeout=ClientTimeout(total=self.timeout_s),
            connector=TCPConnector(keepalive_timeout=2.0),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def post(self, server: ServerEntry, path: str, body: dict):
        """POST ``body`` to ``server``; use as ``await`` or ``async with``."""
        return self.session.post(server.url + path, json=body)

    async def prefill(self, server: ServerEntry, path: str, body: dict, record: RequestRecord):
        """Run the prefill half of a P/D request; records P's prefix hit."""
        async with self.post(server, path, {**body, "stream": False}) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise UpstreamError(f"prefill {server.name} answered {resp.status}: {text[:500]}")
        chunk = Chunk.parse(b"data: " + text.encode())
        record.cached_tokens_prefill = cached_tokens(chunk.data or {})
        return chunk.data


def cached_tokens(data: dict) -> int | None:
    """The prompt tokens a server found in its prefix cache (native or OpenAI)."""
    if "meta_info" in data:
        return data["meta_info"].get("cached_tokens")
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


async def read_or_abort(coro, abort_if: asyncio.Task | None):
    """Await ``coro``; if the prefill task fails first, raise its error instead."""
    task = asyncio.ensure_future(coro)
    if abort_if is None:
        return await task
    done, _ = await asyncio.wait({task, abort_if}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    try:
        _raise_if_failed(abort_if)
    except UpstreamError:
        task.cancel()  # closes the upstream connection: the server drops the request
        raise
    return await task


def _raise_if_failed(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        raise UpstreamError(str(exc)) from exc


async def lines(upstream, abort_if: asyncio.Task | None = None):
    """SSE lines from upstream; stops with UpstreamError if the prefill task fails."""
    while True:
        read = asyncio.ensure_future(upstream.content.readline())
        if abort_if is not None and not abort_if.done():
            done, _ = await asyncio.wait({read, abort_if}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                try:
                    _raise_if_failed(abort_if)
                except UpstreamError:
                    read.cancel()
                    raise
        line = await read
        if not line:
            return
        yield line


async def chunks(upstream, abort_if: asyncio.Task | None = None):
    """Parsed SSE chunks from upstream (see :func:`lines`)."""
    async for line in lines(upstream, abort_if):
        yield Chunk.parse(line)
