"""PDD's relayed pipeline (P->RLD->MD) in the router, and what follows each request.

One request's walk (``serve_relayed``)::

    open handoff channel to MD ─ WATCH(room) ──────────────────────┐
    POST prefill (dual-path room) ─ KV to RLD (LAN) and MD (WAN)    │
    POST RLD (stream) ─ eager tokens t1.. go to the client at once  │
    POST MD  (rid pdd-md-room) ─ parked on MD once its KV is held ─ READY
    on READY, per RLD token:  pending <= catch_up_threshold or RLD busy → one-shot
                              else catch-up batches (RLD keeps decoding) until few pend
    final HANDOFF(t..tk) → RLD's stream is closed (SGLang aborts it) → MD's stream,
    whose first k tokens echo t1..tk (checked, not re-sent), continues from t(k+1)

If RLD finishes before MD holds the KV, the client is done; ``settle_on_md`` then lets
P's transfer finish and hands MD all tokens anyway, so MD caches the exchange for the
session's next turn. If MD never holds the KV (a cut WAN, MD down) the record says why
(``fallback``). The client sees one stream either way.

What follows each request (DRC alignment, the MD prefix mirror) is in ``after``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from engine_patches.handoff.md import md_rid
from engine_patches.handoff.messages import Extended, Handoff, Ready
from engine_patches.kv_transfer.messages import HEADER, MAGIC, MsgType
from engine_patches.kv_transfer.rooms import new_room
from reports.records import RequestRecord
from testbed.router.policies import P_RLD_MD, Route, max_new_tokens
from workloads.client import new_output_ids

logger = logging.getLogger("pdd.router")
HANDOFF_AT_HEADER, HANDOFF_MODE_HEADER = "x-pdd-handoff-at", "x-pdd-handoff-mode"
RLD_FIRST = "relay decode finished first"


def _held(ready: asyncio.Task) -> bool:
    return ready.done() and not ready.cancelled() and ready.exception() is None


class HandoffError(RuntimeError):
    pass


class HandoffChannel:
    """The router's connection to MD's handoff listener, for one room."""

    def __init__(self, host: str, port: int, room: int) -> None:
        self.host, self.port, self.room = host, port, room
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.bytes_sent = 0

    async def watch(self) -> Ready:
        """Connect, WATCH, and wait until MD holds the prompt's KV."""
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        await self._send(MsgType.WATCH, b"")
        return Ready.decode(await self._expect(MsgType.READY))

    async def handoff(self, tokens: list[int], final: bool) -> int:
        """Send one handoff batch; returns its bytes on the wire."""
        return await self._send(MsgType.HANDOFF, Handoff(tuple(tokens), final).encode())

    async def extended(self) -> Extended:
        return Extended.decode(await self._expect(MsgType.EXTENDED))

    async def _send(self, kind: MsgType, body: bytes) -> int:
        frame = HEADER.pack(MAGIC, 1, kind, 0, self.room, len(body)) + body
        self.writer.write(frame)
        await self.writer.drain()
        self.bytes_sent += len(frame)
        return len(frame)

    async def _expect(self, kind: MsgType) -> bytes:
        head = await self.reader.readexactly(HEADER.size)
        magic, _, got, _, _, length = HEADER.unpack(head)
        body = await self.reader.readexactly(length)
        if magic != MAGIC or got != kind:
            raise HandoffError(f"expected {kind.name} from main decode, got type {got}")
        return body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Chunk:
    """One native /generate SSE line, parsed."""

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.data: dict | None = None
        text = line.decode(errors="replace").strip()
        if text.startswith("data:") and text[5:].strip() != "[DONE]":
            try:
                self.data = json.loads(text[5:])
            except json.JSONDecodeError:
                self.data = None
        self.done = text.startswith("data:") and text[5:].strip() == "[DONE]"

    @property
    def error(self) -> str | None:
        return str(self.data["error"])[:500] if self.data and "error" in self.data else None

    def new_ids(self, have: int) -> list[int]:
        """Output ids beyond the first ``have`` (cumulative or incremental chunks)."""
        return new_output_ids(self.data, have) if self.data else []

    def echoed(self) -> list[int] | None:
        ids = (self.data or {}).get("output_ids")
        total = int((self.data or {}).get("meta_info", {}).get("completion_tokens", 0))
        return list(ids) if ids is not None and len(ids) == total else None

    @property
    def finished(self) -> bool:
        return bool(self.data and self.data.get("meta_info", {}).get("finish_reason"))


async def serve_relayed(router, request, body: dict, route: Route, record: RequestRecord):
    """P->RLD->MD for one request; returns the client's response."""
    from testbed.router.app import UpstreamError, _lines, _read_or_abort

    pdd, path = router.config.pdd, request.path
    prefill, rld, md = route.prefill, route.stream_from, route.main_decode
    room = new_room(dual_path=True)
    record.room = room
    pd_body = {**body, "stream": True, "bootstrap_host": prefill.host,
               "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": room}  # fmt: skip
    channel = HandoffChannel(md.host, pdd.handoff_port, room)
    ready = asyncio.create_task(channel.watch())
    prefill_task = asyncio.create_task(router._prefill(prefill, path, pd_body, record))
    md_body = {**pd_body, "rid": md_rid(room)}
    md_task = asyncio.create_task(router.session.post(md.url + path, json=md_body))
    rld_resp = None
    out = ClientStream(request, bool(body.get("stream")), record)
    tokens: list[int] = []
    try:
        rld_resp = await _read_or_abort(router.session.post(rld.url + path, json=pd_body),
                                        prefill_task)  # fmt: skip
        if rld_resp.status != 200:
            text = (await rld_resp.text())[:300]
            raise UpstreamError(f"relay decode answered {rld_resp.status}: {text}")
        handed, batches, mode, inflight = 0, 0, None, None
        # Experiments and tests pin the handoff: at this many eager tokens (just past it
        # when one stream chunk carries several tokens; sent even before MD holds the
        # KV, MD applies it once it does), in this mode.
        forced_at = int(request.headers.get(HANDOFF_AT_HEADER, 0)) or None
        forced_mode = request.headers.get(HANDOFF_MODE_HEADER)
        limit = max_new_tokens(body)
        takeover = False
        async for line in _lines(rld_resp, prefill_task):
            chunk = Chunk(line)
            if chunk.error:
                raise UpstreamError(f"relay decode: {chunk.error}")
            new = chunk.new_ids(len(tokens))
            tokens += new
            await out.emit(chunk, len(new))
            if chunk.finished or chunk.done:
                break
            if record.fallback:
                continue  # MD failed mid catch-up: relay decode goes on to the end
            if forced_at is None and not _held(ready):
                continue  # hand off only once MD holds the KV
            if inflight is not None:
                if not inflight.done() and (forced_at is None or len(tokens) < forced_at):
                    continue
                try:
                    await inflight
                except (OSError, asyncio.IncompleteReadError, HandoffError) as exc:
                    record.fallback = f"catch-up handoff failed: {exc!r}"[:300]
                    continue
                inflight = None
            pending = len(tokens) - 1 - handed  # eager tokens MD lacks (t1 came from P)
            if forced_at is None and limit - len(tokens) < pdd.min_remaining_tokens:
                continue  # relay decode is about to finish anyway
            busy = router.loads.in_flight[rld.name] > pdd.rld_busy_requests
            if mode is None:
                catch_up = (
                    (forced_mode == "catch-up")
                    if forced_mode
                    else (pending > pdd.catch_up_threshold and not busy)
                )
                mode = "catch-up" if catch_up else "one-shot"
            final = (
                len(tokens) >= forced_at
                if forced_at
                else (mode == "one-shot" or pending <= pdd.catch_up_done or busy)
            )
            if not final and (mode == "one-shot" or pending == 0 or not _held(ready)):
                continue  # catch-up batches need MD holding the KV (their acks share the channel)
            batch = tokens[1 + handed :]
            handed += len(batch)
            batches += 1
            sent = time.time()
            record.handoff_bytes += await channel.handoff(batch, final=final)
            if final:
                record.handoff_sent = sent
                takeover = True
                break
            inflight = asyncio.create_task(channel.extended())
        record.eager_tokens = len(tokens)
        record.handoff_tokens, record.handoff_batches = handed, batches
        if not takeover:
            record.handoff_mode = "none"
            if not record.fallback and not _held(ready):
                record.fallback = await _why_md_missed(ready, md_task)
            if record.fallback and not record.fallback.startswith(RLD_FIRST):
                record.handoff_mode = "failed"
            await out.finish()
            if record.handoff_mode == "none" and len(tokens) >= 2:
                settle = settle_on_md(router, route, body, record.session_id, channel,
                                      (ready, prefill_task, md_task), list(tokens))  # fmt: skip
                # The session's next turn waits for it, so P's and MD's caches agree.
                router.after.settling[id(record)] = router.background(settle)
                channel = None  # the settle task owns MD's side from here
            return out.response
        record.handoff_mode = mode
        record.pipeline = P_RLD_MD
        rld_resp.close()  # SGLang aborts relay decode's request
        rld_resp = None
        eager_end = time.time()
        md_resp = await md_task
        if md_resp.status != 200:
            text = (await md_resp.text())[:300]
            raise UpstreamError(f"main decode answered {md_resp.status}: {text}")
        k = len(tokens)
        async for line in _lines(md_resp, None):
            chunk = Chunk(line)
            if chunk.error:
                raise UpstreamError(f"main decode: {chunk.error}")
            echoed = chunk.echoed()
            if echoed is not None and len(echoed) >= k and echoed[:k] != tokens[:k]:
                record.handoff_mismatch = True
            new = chunk.new_ids(len(tokens))
            if new and record.handoff_s is None:
                record.handoff_s = time.time() - eager_end
            tokens += new
            if new or chunk.finished or chunk.done:
                await out.emit(chunk, len(new))
        record.decode_server = md.name
        await out.finish()
        return out.response
    except UpstreamError as exc:
        return await out.fail(str(exc))
    finally:
        record.output_ids = tokens
        if rld_resp is not None:
            rld_resp.close()
        if channel is not None:
            _release(channel, (ready, prefill_task, md_task))


def _release(channel: HandoffChannel, tasks: tuple[asyncio.Task, ...]) -> None:
    """End MD's side of a room: pending tasks cancelled, MD's stream closed, and the
    channel closed (MD then finishes its parked request, if any, as released)."""
    for task in tasks:
        if not task.done():
            task.cancel()
    channel.close()
    md_task = tasks[-1]
    if md_task.done() and not md_task.cancelled() and md_task.exception() is None:
        md_task.result().close()


async def settle_on_md(
    router, route: Route, body: dict, session: str | None, channel: HandoffChannel,
    tasks: tuple[asyncio.Task, asyncio.Task, asyncio.Task], tokens: list[int],
) -> None:  # fmt: skip
    """Relay decode finished the request before MD held the KV: MD still takes the
    exchange into its prefix cache (DRC), off the client's path. P's transfer runs to
    its end instead of being cut, MD gets all eager tokens but the last (it decodes
    that one itself: one extend forward, one decode step), and once MD's output equals
    what the client got, the mirror and P's cache learn the exchange like after any
    request that ended on MD. A session's next turn waits for this (at most
    ``settle_timeout_s``), as it waits for P's cache after any request."""
    from testbed.router.app import _lines

    ready, _, md_task = tasks
    timeout = router.config.pdd.settle_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not ready.done():  # MD holds the KV, or its transfer failed, or time is up
            log = route.main_decode.transfer_log
            failed = router.transfers.peek(channel.room, log) if log else None
            if failed is not None and failed["status"] != "success":
                raise HandoffError(f"KV transfer to main decode: {failed.get('reason')}")
            if loop.time() > deadline:
                raise TimeoutError(f"main decode did not hold the KV within {timeout:.0f} s")
            await asyncio.wait({ready}, timeout=0.25)
        ready.result()
        await channel.handoff(tokens[1:-1], final=True)
        md_resp = await asyncio.wait_for(asyncio.shield(md_task), max(deadline - loop.time(), 1))
        ids: list[int] = []
        async for line in _lines(md_resp, None):
            chunk = Chunk(line)
            if chunk.error:
                raise HandoffError(f"main decode: {chunk.error}")
            ids += chunk.new_ids(len(ids))
            if chunk.finished or chunk.done:
                break
        if ids != tokens:
            raise HandoffError(f"main decode's {len(ids)} tokens differ from relay decode's")
        aligning = router.after.remember(route, body, session, tokens)
        if aligning is not None:
            await aligning
    except Exception as exc:  # an optimisation off the client's path: log, never raise
        logger.info("settling room %s on main decode: %r", channel.room, exc)
    finally:
        _release(channel, tasks)


async def _why_md_missed(ready: asyncio.Task, md_task: asyncio.Task) -> str:
    if ready.done() and not ready.cancelled() and ready.exception() is not None:
        return f"handoff channel to main decode failed: {ready.exception()!r}"[:300]
    if md_task.done() and md_task.exception() is None and md_task.result().status != 200:
        resp = md_task.result()
        return f"main decode answered {resp.status}: {(await resp.text())[:300]}"
    return f"{RLD_FIRST} (main decode did not hold the KV yet)"


class ClientStream:
    """What the client gets: SSE lines as they come, or one JSON body at the end."""

    def __init__(self, request, stream: bool, record: RequestRecord) -> None:
        self.request, self.stream, self.record = request, stream, record
        self.response: web.StreamResponse | None = None
        self.last: dict | None = None

    async def emit(self, chunk: Chunk, new_tokens: int) -> None:
        now = time.time()
        if new_tokens:
            self.record.token_times.extend([now] * new_tokens)
            self.record.first_token = self.record.first_token or now
            self.record.output_tokens += new_tokens
        if chunk.data is not None:
            self.last = chunk.data
            meta = chunk.data.get("meta_info", {})
            self.record.prompt_tokens = meta.get("prompt_tokens", self.record.prompt_tokens)
        if not self.stream:
            return
        if self.response is None:
            self.response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream"}
            )
            await self.response.prepare(self.request)
        if not chunk.done:
            await self.response.write(chunk.line)

    async def finish(self) -> None:
        self.record.finish = time.time()
        if self.stream:
            if self.response is None:
                self.response = web.StreamResponse(status=200)
                await self.response.prepare(self.request)
            await self.response.write(b"data: [DONE]\n\n")
            await self.response.write_eof()
        else:
            self.response = web.json_response(self.last or {})

    async def fail(self, message: str) -> web.StreamResponse:
        self.record.status, self.record.error = "error", message[:500]
        if self.response is not None and self.response.prepared:
            await self.response.write(f"data: {json.dumps({'error': message})}\n\n".encode())
            await self.response.write_eof()
            return self.response
        return web.json_response({"error": message}, status=502)
