"""The router's HTTP side (aiohttp): /generate, /v1/completions, /v1/chat/completions.

Per request: parse → the policy picks a route → for P/D routes, inject the bootstrap
fields and POST prefill and decode together → relay the decode stream to the client,
timing every token → write the RequestRecord (KV bytes joined from the transfer log).
A prefill failure cancels the decode request and reaches the client as an error.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from engine_patches.kv_transfer.rooms import new_room
from reports.records import RecordWriter, RequestRecord
from testbed.router.after import AfterRequest
from testbed.router.config import RouterConfig, ServerEntry
from testbed.router.pdd import serve_relayed
from testbed.router.policies import P_RLD_MD, PIPELINE_HEADER, Loads, Route, make_policy
from testbed.router.transfers import TransferIndex
from workloads.client import new_output_ids

ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
SESSION_HEADER, TURN_HEADER, REQUEST_HEADER = "x-session-id", "x-turn", "x-request-id"


class Router:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.policy = make_policy(config)
        self.loads = Loads()
        self.records = RecordWriter(config.records)
        logs = [s.transfer_log for s in config.servers if s.transfer_log]
        self.transfers = TransferIndex(logs)
        self.session: ClientSession | None = None
        self.after = AfterRequest(self) if config.policy == "pdd" else None
        self._background: set[asyncio.Task] = set()  # work that outlives its request

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 << 20)
        for path in ENDPOINTS:
            app.router.add_post(path, self.handle)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app) -> None:
        # SGLang's HTTP server (uvicorn) closes idle keep-alive connections after 5 s; a
        # request sent on one as it closes fails with "Server disconnected" (seen with
        # think times of a few seconds). Closing them first, at 2 s, avoids the race.
        self.session = ClientSession(
            timeout=ClientTimeout(total=self.config.upstream_timeout_s),
            connector=TCPConnector(keepalive_timeout=2.0),
        )

    async def _stop(self, app) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.session.close()

    def background(self, coro) -> asyncio.Task:
        """Run ``coro`` past the request that started it (kept referenced, cancelled at
        shutdown)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "system": self.config.system, "in_flight": dict(self.loads.in_flight)}
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival = time.time()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "request body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "request body must be a JSON object"}, status=400)
        record = RequestRecord(
            request_id=request.headers.get(REQUEST_HEADER) or uuid.uuid4().hex,
            system=self.config.system, endpoint=request.path, arrival=arrival,
            session_id=request.headers.get(SESSION_HEADER),
            turn=int(request.headers[TURN_HEADER]) if TURN_HEADER in request.headers else None,
        )  # fmt: skip
        turn_done = None
        if self.after is not None:
            turn_done = await self.after.before(record.session_id)
        try:
            pinned = request.headers.get(PIPELINE_HEADER)
            route = self.policy.choose(body, self.loads, record.session_id, pinned)
        except (LookupError, ValueError) as exc:
            if self.after is not None:
                self.after.after(None, body, record, turn_done)
            status = 503 if isinstance(exc, LookupError) else 400
            return web.json_response({"error": str(exc)}, status=status)
        record.pipeline, record.pipeline_reason = route.pipeline, route.reason
        record.predicted_wan_s = route.predicted_wan_s
        record.decode_server = route.stream_from.name
        record.prefill_server = route.prefill.name if route.prefill else None
        busy = [s.name for s in (route.prefill, route.stream_from, route.main_decode) if s]
        for name in busy:
            self.loads.in_flight[name] += 1
        try:
            return await self._serve(request, body, route, record)
        except (TimeoutError, ClientError, UpstreamError) as exc:
            # A server that is down or dies mid-request: a clear error, never a 500
            # with a traceback, and a record that says so.
            message = f"upstream failure on {record.decode_server}: {exc!r}"[:500]
            record.status, record.error = "error", message
            return web.json_response({"error": message}, status=502)
        finally:
            for name in busy:
                self.loads.in_flight[name] -= 1
            record.finish = record.finish or time.time()
            await self._join_transfer(route, record)
            if self.after is not None:
                self.after.after(route, body, record, turn_done)
            self.records.write(record)

    async def _serve(self, request, body, route: Route, record: RequestRecord):
        if route.prefill is None:
            return await self._relay(request, route.stream_from, body, record)
        if route.pipeline == P_RLD_MD:
            return await serve_relayed(self, request, body, route, record)
        room = new_room()
        record.room = room
        pd_body = {
            **body,
            "bootstrap_host": route.prefill.host,
            "bootstrap_port": route.prefill.bootstrap_port,
            "bootstrap_room": room,
        }
        prefill = asyncio.create_task(self._prefill(route.prefill, request.path, pd_body, record))
        decode = asyncio.create_task(
            self._relay(request, route.stream_from, pd_body, record, abort_if=prefill)
        )
        try:
            return await decode
        finally:
            if not prefill.done():
                prefill.cancel()

    async def _prefill(self, server: ServerEntry, path: str, body: dict, record: RequestRecord):
        async with self.session.post(server.url + path, json={**body, "stream": False}) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise UpstreamError(f"prefill {server.name} answered {resp.status}: {text[:500]}")
            data = json.loads(text)
            record.cached_tokens_prefill = _cached_tokens(data)
            return data

    async def _relay(
        self,
        request,
        server: ServerEntry,
        body: dict,
        record: RequestRecord,
        abort_if: asyncio.Task | None = None,
    ) -> web.StreamResponse:
        stream = bool(body.get("stream"))
        response: web.StreamResponse | None = None
        # A PD decode server answers only once it has the KV: if the prefill fails
        # first, fail now instead of when the transfer times out.
        upstream = await _read_or_abort(self.session.post(server.url + request.path, json=body),
                                        abort_if)  # fmt: skip
        try:
            if not stream or upstream.status != 200:
                text = await _read_or_abort(upstream.text(), abort_if)
                record.finish = time.time()
                _record_final(record, text, upstream.status)
                return web.Response(
                    text=text, status=upstream.status, content_type=upstream.content_type
                )
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            counter = TokenCounter(request.path)
            try:
                async for line in _lines(upstream, abort_if):
                    now = time.time()
                    new = counter.feed(line, record)
                    if new:
                        record.token_times.extend([now] * new)
                        record.first_token = record.first_token or now
                    await response.write(line)
                await response.write_eof()
            except ConnectionError:
                # The client left. After the last token that is normal (it stops reading
                # at [DONE]); before it, the request did not complete.
                if counter.done is False:
                    record.status, record.error = "error", "client disconnected mid-stream"
            record.output_tokens = counter.tokens
            record.output_ids = counter.ids
            record.finish = time.time()
            return response
        except UpstreamError as exc:
            record.status, record.error = "error", str(exc)
            if response is not None and response.prepared:
                await response.write(f"data: {json.dumps({'error': str(exc)})}\n\n".encode())
                await response.write_eof()
                return response
            return web.json_response({"error": str(exc)}, status=502)
        finally:
            upstream.release()

    async def _join_transfer(self, route: Route, record: RequestRecord) -> None:
        if record.room is None:
            return
        # The KV that matters is the one to the server that decodes to the end (for
        # P->RLD->MD: main decode, over the WAN, even if relay decode finished it).
        server = route.main_decode or route.stream_from
        if server.transfer_log is None:
            return
        transfer = await self.transfers.lookup(
            record.room, server.transfer_log, wait_s=0.5 if record.status == "ok" else 0.1
        )
        if transfer is None:
            return
        record.kv_bytes, record.kv_wire_bytes = transfer["kv_bytes"], transfer["wire_bytes"]
        record.cached_tokens_decode = transfer["decode_prefix_len"]
        if transfer["end"] and transfer.get("first_byte"):
            record.kv_transfer_s = transfer["end"] - transfer["first_byte"]
        record.kv_link = "lan" if route.prefill.site == server.site else "wan"
        if transfer["status"] != "success" and record.fallback:
            record.fallback = f"{record.fallback}; KV transfer: {transfer['reason']}"[:500]
        elif transfer["status"] != "success" and record.status == "ok":
            record.status, record.error = "error", f"KV transfer failed: {transfer['reason']}"


class UpstreamError(RuntimeError):
    pass


async def _read_or_abort(coro, abort_if: asyncio.Task | None):
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


async def _lines(upstream, abort_if: asyncio.Task | None):
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


class TokenCounter:
    """Counts tokens in an SGLang SSE stream (native or OpenAI)."""

    def __init__(self, path: str) -> None:
        self.native = path == "/generate"
        self.tokens = 0
        self.ids: list[int] = []  # native only
        self.done = False  # saw [DONE] or a finish reason

    def feed(self, line: bytes, record: RequestRecord) -> int:
        text = line.decode(errors="replace").strip()
        if text.startswith("data:") and text[5:].strip() == "[DONE]":
            self.done = True
        if not text.startswith("data:") or text[5:].strip() == "[DONE]":
            return 0
        try:
            chunk = json.loads(text[5:])
        except json.JSONDecodeError:
            return 0
        if "error" in chunk:
            record.status, record.error = "error", str(chunk["error"])[:500]
            return 0
        if self.native:
            meta = chunk.get("meta_info", {})
            total = int(meta.get("completion_tokens", self.tokens))
            record.prompt_tokens = meta.get("prompt_tokens", record.prompt_tokens)
            if record.prefill_server is None and "cached_tokens" in meta:
                record.cached_tokens_prefill = meta["cached_tokens"]  # colocated: one server
            self.done = self.done or bool(meta.get("finish_reason"))
            new, self.tokens = max(0, total - self.tokens), max(total, self.tokens)
            self.ids += new_output_ids(chunk, len(self.ids))
            return new
        usage = chunk.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
        new = sum(
            1
            for c in chunk.get("choices", [])
            if (c.get("delta") or {}).get("content") or c.get("text")
        )
        self.tokens += new
        return new


def _cached_tokens(data: dict) -> int | None:
    if "meta_info" in data:
        return data["meta_info"].get("cached_tokens")
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


def _record_final(record: RequestRecord, text: str, status: int) -> None:
    if status != 200:
        record.status, record.error = "error", f"HTTP {status}: {text[:500]}"
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
            record.cached_tokens_prefill = meta.get("cached_tokens")
    elif "usage" in data:
        record.output_tokens = int(data["usage"].get("completion_tokens", 0))
        record.prompt_tokens = data["usage"].get("prompt_tokens")
    record.token_times = [record.finish] * record.output_tokens
