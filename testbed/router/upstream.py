"""The router's calls to SGLang servers: an HTTP client session per server role, the
prefill call, and reading a decode stream that must stop the moment its prefill fails.

Lifecycle: ``open`` on the router's startup, a session per role made on first use
(its own connection pool, as large as the router's admission bound, so decode calls
waiting for their KV never hold the connections prefill calls need), ``close`` on
cleanup."""

from __future__ import annotations

import asyncio
import json

from aiohttp import ClientSession, ClientTimeout, TCPConnector

from protocol.records import RequestRecord
from protocol.stream import Chunk
from testbed.router.config import ServerEntry, upstream_keep_alive_s


class UpstreamError(RuntimeError):
    """A server answered with an error, or its stream carried one; ``status``: the HTTP
    status it answered with, where it answered one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def refused(self) -> bool:
        """The server refused the request itself (a 4xx other than a timeout or a rate
        limit: an unknown sampling option, say, which the router passes through): the
        client's error, answered as such, not a server's failure."""
        status = self.status or 0
        return 400 <= status < 500 and status not in (408, 429)

    def answer(self) -> tuple[str, int, str]:
        """(the record's status, the HTTP status, the error type) to answer it with."""
        if self.refused:
            return "rejected", self.status, "invalid_request_error"
        return "upstream_error", 502, "upstream_error"


class Upstream:
    """The router's HTTP client to its servers."""

    def __init__(self, timeout_s: float, connections: int = 512, keep_alive_s: float | None = None):
        self.timeout_s, self.connections = timeout_s, connections
        self.keep_alive_s = upstream_keep_alive_s() if keep_alive_s is None else keep_alive_s
        self.sessions: dict[str, ClientSession] = {}
        self.closed = True

    async def open(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            await session.close()

    def session(self, role: str) -> ClientSession:
        if self.closed:
            raise UpstreamError("the router is shutting down")
        if role not in self.sessions:
            # idle connections close before the server closes them (upstream_keep_alive_s)
            self.sessions[role] = ClientSession(
                timeout=ClientTimeout(total=self.timeout_s),
                connector=TCPConnector(keepalive_timeout=self.keep_alive_s, limit=self.connections),
            )
        return self.sessions[role]

    def post(self, server: ServerEntry, path: str, body: dict):
        """POST ``body`` to ``server``; use as ``await`` or ``async with``."""
        return self.session(server.role).post(server.url + path, json=body)

    async def prefill(self, server: ServerEntry, path: str, body: dict, record: RequestRecord):
        """Run the prefill half of a P/D request; records P's prefix hit."""
        async with self.post(server, path, {**body, "stream": False}) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise UpstreamError(
                    f"prefill {server.name} answered {resp.status}: {text[:500]}", resp.status
                )
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
    try:
        done, _ = await asyncio.wait({task, abort_if}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()  # whoever waited is gone: so is the call
        raise
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
        raise UpstreamError(str(exc), getattr(exc, "status", None)) from exc


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


def record_answer(record: RequestRecord, text: str, status: int) -> None:
    """A non-streamed response (or an error) into the record."""
    if status != 200:
        record.status = UpstreamError(text, status).answer()[0]  # refused: "rejected"
        record.error = f"HTTP {status}: {text[:500]}"
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return
    record.first_token = record.finish
    if "meta_info" in data:
        meta = data["meta_info"]
        record.output_tokens = int(meta.get("completion_tokens", 0))
        record.output_ids = list(data.get("output_ids") or [])
        record.prompt_tokens = meta.get("prompt_tokens")
        if record.prefill_server is None:
            record.cached_tokens_prefill = cached_tokens(data)
    elif "usage" in data:
        record.output_tokens = int(data["usage"].get("completion_tokens", 0))
        record.prompt_tokens = data["usage"].get("prompt_tokens")
    record.token_times = [record.finish] * record.output_tokens
