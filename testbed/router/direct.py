"""Colocated and P/D requests (P->D, and PDD's P->MD): one server's stream passed
through to the client, timing every token; for P/D the prefill posted beside it.

Per request: ``serve`` → P/D: the bootstrap fields injected, prefill and decode posted
together (a prefill failure aborts the decode call) → ``stream`` relays the decode
server's SSE lines, parsing each chunk for the record → if the stream ended before
P's HTTP answer (P's prefix hit rides on it), that call goes to the router's
``unfinished_prefills`` for the record to wait on, off the client's path.
PDD's relayed pipeline (P->RLD->MD) is :mod:`testbed.router.relay`.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from protocol import clock
from protocol.records import RequestRecord
from protocol.rooms import with_after
from protocol.stream import Chunk, OutputStream
from testbed.router.client_stream import (
    FRONT,
    STREAM,
    answer_error,
    client_gone,
    client_left,
    client_line,
    upstream_path,
)
from testbed.router.config import ServerEntry
from testbed.router.policies import Route
from testbed.router.upstream import Upstream, UpstreamError, lines, read_or_abort, record_answer


class DirectPipeline:
    def __init__(self, upstream: Upstream, unfinished_prefills: dict[int, asyncio.Task]) -> None:
        self.upstream = upstream
        self.unfinished_prefills = unfinished_prefills  # the router's (see Router)

    async def serve(self, request, body, route: Route, record: RequestRecord):
        """A colocated request (one server), or P/D: prefill and decode posted together."""
        if route.prefill is None:
            return await self.stream(request, route.stream_from, body, record)
        pd_body = {
            **body,
            "bootstrap_host": route.prefill.host,
            "bootstrap_port": route.prefill.bootstrap_port,
            "bootstrap_room": record.room,
        }
        prefill = asyncio.create_task(
            self.upstream.prefill(route.prefill, upstream_path(request), pd_body, record)
        )
        path = upstream_path(request)
        decode_body = with_after(pd_body, route.md_after, path, route.md_hold_s)
        decode = asyncio.create_task(
            self.stream(request, route.stream_from, decode_body, record, abort_if=prefill)
        )
        try:
            response = await decode
        except BaseException:
            prefill.cancel()
            raise
        if not prefill.done():  # the stream ended before P's answer came back
            if record.status == "ok":
                self.unfinished_prefills[id(record)] = prefill
            else:
                prefill.cancel()
        return response

    async def stream(
        self,
        request,
        server: ServerEntry,
        body: dict,
        record: RequestRecord,
        abort_if: asyncio.Task | None = None,
    ) -> web.StreamResponse:
        """Pass one server's response through to the client, timing every token."""
        response: web.StreamResponse | None = None
        # A PD decode server answers only once it has the KV: if the prefill fails
        # first, fail now instead of when the transfer times out. A client that leaves
        # a non-streamed request closes the upstream call too (SGLang then aborts it).
        left = None if body.get("stream") else asyncio.ensure_future(client_left(request))
        try:
            path = upstream_path(request)
            posted = read_or_abort(self.upstream.post(server, path, body), abort_if)
            upstream = await read_or_abort(posted, left)
        except BaseException:
            if left is not None:
                left.cancel()
            raise
        try:
            if not body.get("stream") or upstream.status != 200:
                text = await read_or_abort(read_or_abort(upstream.text(), abort_if), left)
                record.finish = clock.now()
                record_answer(record, text, upstream.status)
                front = request.get(FRONT)
                if front is not None and upstream.status == 200:
                    return web.json_response(front.final(json.loads(text)))
                return web.Response(
                    text=text, status=upstream.status, content_type=upstream.content_type
                )
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            request[STREAM] = response
            out = OutputStream(native=upstream_path(request) == "/generate")
            try:
                async for line in lines(upstream, abort_if):
                    now = clock.now()
                    chunk = Chunk.parse(line)
                    new = out.feed(chunk)
                    if new:
                        record.token_times.extend([now] * new)
                        record.first_token = record.first_token or now
                    if sent := client_line(request, chunk):
                        await response.write(sent)
                if not out.done and not out.error:  # no finish, no [DONE]: cut short
                    raise UpstreamError(f"{server.name}'s stream ended before the request did")
                await response.write_eof()
            except ConnectionError as exc:
                if not client_gone(request):
                    raise UpstreamError(f"{server.name}: {exc!r}") from exc
                # The client left. After the last token that is normal (it stops reading
                # at [DONE]); before it, the request did not complete.
                if not out.done:
                    record.status, record.error = "client_cancelled", "client disconnected"
            finally:
                record.prompt_tokens = out.prompt_tokens
                if record.prefill_server is None and out.cached_tokens is not None:
                    record.cached_tokens_prefill = out.cached_tokens  # colocated: one server
                record.output_tokens, record.output_ids = out.tokens, out.ids
            if out.error:
                record.status, record.error = "upstream_error", out.error
            record.finish = clock.now()
            return response
        except UpstreamError as exc:
            record.status, status, kind = exc.answer()
            record.error = str(exc)[:500]
            return await answer_error(request, str(exc), status, kind)
        finally:
            upstream.release()  # not read to its end (client gone): the connection closes
            if left is not None:
                left.cancel()
