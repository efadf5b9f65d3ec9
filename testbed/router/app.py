"""The router's HTTP side (aiohttp): /generate, /v1/completions, /v1/chat/completions,
and what a server answers about itself (/v1/models, /model_info, /server_info,
/flush_cache), the router's /health and live /pdd/stats.

Per request: admission (``max_in_flight``) → headers and body checked
(:mod:`validate`) → text and OpenAI requests tokenized (:mod:`tokens`, :mod:`openai`)
→ the policy picks a route among the healthy servers (:mod:`health`) → the route's
pipeline serves it: colocated and P/D in :mod:`testbed.router.direct` (prefill and
decode posted together, the decode stream relayed to the client, every token timed),
PDD's P->RLD->MD in :mod:`testbed.router.relay` → write exactly one RequestRecord
(KV bytes joined from the transfer log), whatever happened. A prefill failure cancels
the decode request and reaches the client as an error; any failure after the stream
started is an SSE error event and the stream's end.

Lifecycle: ``Router(config).app()`` → on startup the upstream sessions open and the
health checks start → requests → on cleanup the records still waiting for P's answer
get ``SHUTDOWN_WRITE_S`` to be written whole, then background work is cancelled (a
record cut short says so) and the sessions close. A harness that stops the router waits
first until ``/pdd/stats`` shows no ``records_pending``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

from aiohttp import ClientError, web

from protocol import clock, headers
from protocol.names import Pipeline, Role
from protocol.records import CUT_AT_SHUTDOWN, JsonlWriter, RequestRecord
from protocol.rooms import new_room
from protocol.stream import error_body
from testbed.router import server_info
from testbed.router.after import AfterRequest
from testbed.router.client_stream import (
    FRONT,
    STREAM,
    answer_error,
    client_gone,
)
from testbed.router.config import RouterConfig
from testbed.router.direct import DirectPipeline
from testbed.router.health import Health
from testbed.router.live import LiveStats
from testbed.router.openai import CHAT, COMPLETIONS, OpenAIFront
from testbed.router.policies import Loads, PddPolicy, Route, make_policy, prompt_tokens
from testbed.router.relay import RelayedPipeline
from testbed.router.tokens import RouterTokenizer
from testbed.router.transfers import TransferIndex
from testbed.router.upstream import Upstream, UpstreamError
from testbed.router.validate import Rejected, check_body, check_headers

ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
INFO = ("/v1/models", "/model_info", "/server_info")  # answered by a server
OPENAI = (COMPLETIONS, CHAT)  # tokenized at the router, served natively
SHUTDOWN_WRITE_S = 5.0  # at shutdown, records waiting for P's answer get this long
logger = logging.getLogger("pdd.router")


class Router:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.policy = make_policy(config)
        self.loads = Loads()
        self.records = JsonlWriter(config.records)
        logs = [s.transfer_log for s in config.servers if s.transfer_log]
        self.transfers = TransferIndex(logs, on_line=self._learn_wan)
        self.upstream = Upstream(
            config.upstream_timeout_s, config.limits.max_in_flight, config.upstream_keep_alive_s
        )
        near = {s.site for s in config.with_role(Role.PREFILL)}
        far = [s for s in config.servers if s.site not in near]
        self._wan_logs = {Path(s.transfer_log) for s in far if s.transfer_log}
        self._far_hosts = {s.host for s in far}
        self._background: set[asyncio.Task] = set()  # work that outlives its request
        self._late_writes: set[asyncio.Task] = set()  # records waiting for P's answer
        self.active = 0  # requests being handled
        self.live = LiveStats()
        self.health_checks: Health | None = None
        self.tokenizer = RouterTokenizer(config.tokenizer) if config.tokenizer else None
        # id(record) → P's call still running when the client's stream ended (its answer,
        # with P's prefix hit, is on its way): the record waits for it, off the client's path
        self.unfinished_prefills: dict[int, asyncio.Task] = {}
        self.direct = DirectPipeline(self.upstream, self.unfinished_prefills)
        self.after: AfterRequest | None = None
        self.relayed: RelayedPipeline | None = None
        if isinstance(self.policy, PddPolicy):
            pdd = self.policy.pdd
            self.after = AfterRequest(pdd, self.policy.mirror, self.upstream)
            self.relayed = RelayedPipeline(
                pdd,
                self.upstream,
                self.loads,
                self.transfers,
                self.after,
                self.background,
                self.unfinished_prefills,
            )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.limits.max_body_bytes)
        for path in ENDPOINTS:
            app.router.add_post(path, self.handle)
        app.router.add_get("/health", self.health)
        app.router.add_get("/pdd/stats", self.stats)
        for path in INFO:
            app.router.add_get(path, self.info)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app) -> None:
        await self.upstream.open()
        if self.tokenizer is not None:  # loaded before the first request, not during it
            await asyncio.get_running_loop().run_in_executor(None, self.tokenizer.warm)
        cfg = self.config
        self.health_checks = Health(
            cfg.servers, self.loads, cfg.health_interval_s, cfg.health_timeout_s
        )
        self.background(self.health_checks.run())

    async def _stop(self, app) -> None:
        if self._late_writes:  # records of finished requests: whole if P answers soon
            await asyncio.wait(self._late_writes, timeout=SHUTDOWN_WRITE_S)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.upstream.close()

    def background(self, coro) -> asyncio.Task:
        """Run ``coro`` past the request that started it (kept referenced, cancelled at
        shutdown)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "system": self.config.system,
                "in_flight": dict(self.loads.in_flight),
                "down": dict(self.loads.down),
                "slow": dict(self.health_checks.slow) if self.health_checks else {},
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        """Live figures since the router started (Locust's PDD tab shows them): requests
        per pipeline and per status, KV bytes over the WAN, handoff stream gaps, and the
        records not written yet (requests in flight, records waiting for P's answer)."""
        pending = self.active + len(self._late_writes)  # requests whose record is unwritten
        return web.json_response({**self.live.as_dict(), "records_pending": pending})

    async def info(self, request: web.Request) -> web.Response:
        return await server_info.first_healthy(
            request, self.config.servers, self.loads, self.upstream
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        mirror = self.policy.mirror if isinstance(self.policy, PddPolicy) else None
        return await server_info.flush_all(self.config.servers, self.upstream, mirror)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Admission control around :meth:`_handle`: past ``max_in_flight`` requests,
        503 with a Retry-After."""
        limit = self.config.limits.max_in_flight
        if self.active >= limit:
            record = RequestRecord(
                request_id=request.headers.get(headers.REQUEST_ID) or uuid.uuid4().hex,
                system=self.config.system,
                endpoint=request.path,
                arrival=clock.now(),
            )
            message = f"the router has {limit} requests in flight; retry"
            return self._reject(record, Rejected(message, 503, "overloaded"))
        self.active += 1
        try:
            return await self._handle(request)
        finally:
            self.active -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        record = RequestRecord(
            request_id=uuid.uuid4().hex,
            system=self.config.system,
            endpoint=request.path,
            arrival=clock.now(),
        )
        try:
            meta = check_headers(request.headers)
            record.request_id = meta.request_id or record.request_id
            record.session_id, record.turn = meta.session, meta.turn
            body = await self._body(request)
            check_body(request.path, body, self.config.limits)
            if request.path in OPENAI and self.tokenizer is not None:
                front = request[FRONT] = OpenAIFront(request.path, body, self.tokenizer)
                body = front.native()
                check_body("/generate", body, self.config.limits)  # the context, in ids
            else:
                body = self._tokenized(request.path, body)
        except Rejected as exc:
            return self._reject(record, exc)
        turn_done = None
        if self.after is not None:
            turn_done = await self.after.before(record.session_id)
        try:
            self.transfers.refresh()  # transfers that ended leave the WAN line's backlog
            route = self.policy.choose(body, self.loads, record.session_id, meta.pipeline)
        except (LookupError, ValueError) as exc:
            if self.after is not None:
                self.after.after(None, body, record, turn_done)
            status = 503 if isinstance(exc, LookupError) else 400
            return self._reject(record, Rejected(str(exc), status))
        record.dispatched = clock.now()
        record.pipeline, record.pipeline_reason = route.pipeline, route.reason
        record.decode_server = route.stream_from.name
        if route.prefill is not None:
            record.prefill_server = route.prefill.name
            record.room = new_room(
                dual_path=route.pipeline == Pipeline.P_RLD_MD,
                early_start=route.pipeline == Pipeline.P_MD,
            )
        self._on_wan(route, record, body)
        busy = [s.name for s in (route.prefill, route.stream_from, route.main_decode) if s]
        for name in busy:
            self.loads.in_flight[name] += 1
        try:
            if route.pipeline == Pipeline.P_RLD_MD:
                return await self.relayed.serve(request, body, route, record)
            return await self.direct.serve(request, body, route, record)
        except Exception as exc:  # one answer, one record, never a second response
            return await self._failed(request, record, exc)
        finally:
            for name in busy:
                self.loads.in_flight[name] -= 1
            if record.status == "ok":
                switched = 0 < record.eager_tokens < record.output_tokens
                self.loads.learn_itl(record.decode_server, record.token_times, switched)
            record.finish = record.finish or clock.now()
            if self.after is not None:
                self.after.after(route, body, record, turn_done)
            late = self.unfinished_prefills.pop(id(record), None)
            if late is None:
                await self._write(route, record)
            else:
                self._write_later(route, record, late)

    def _write_later(self, route: Route, record: RequestRecord, late: asyncio.Task) -> None:
        """The client is done; P's answer (its prefix hit) comes with its WAN leg: the
        record is written then, off the client's path (``records_pending`` counts it)."""
        task = self.background(self._write(route, record, after=late))
        self._late_writes.add(task)
        task.add_done_callback(self._late_writes.discard)

    async def _body(self, request: web.Request) -> object:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.limits.max_body_bytes
            raise Rejected(f"request body over {limit} bytes", 413) from None
        try:
            return json.loads(raw)  # bytes: UTF-8/16/32 detected, whatever the header says
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Rejected("request body is not JSON") from None
        except RecursionError:
            raise Rejected("request body: JSON nested too deeply") from None

    def _tokenized(self, path: str, body: dict) -> dict:
        """A native text prompt as the token ids its server would compute, so that
        routing (the prefix mirror, relay decode's handoff) sees the ids."""
        if self.tokenizer is None or path != "/generate" or body.get("text") is None:
            return body
        ids = self.tokenizer.encode(body["text"])
        native = {k: v for k, v in body.items() if k != "text"}
        native["input_ids"] = ids
        check_body(path, native, self.config.limits)  # the context, now that ids are known
        return native

    def _reject(self, record: RequestRecord, exc: Rejected) -> web.Response:
        """A refused request: a JSON error, and a record that says so."""
        record.status, record.error = "rejected", str(exc)[:500]
        record.finish = clock.now()
        self.records.write(record)
        self.live.add(record)
        headers_ = {"Retry-After": "1"} if exc.status == 503 else None
        body = error_body(str(exc), exc.status, exc.kind)
        return web.json_response(body, status=exc.status, headers=headers_)

    async def _failed(self, request: web.Request, record: RequestRecord, exc: Exception):
        """A request that failed after it was routed. The client left: its upstream
        work is already closed with its connection. A server refused the request (a 4xx:
        an option SGLang does not take): its status and answer, the client's error. A
        server failed (down, died, an error in its stream): 502 naming it. Anything
        else: 500. After the stream started, the error goes into the stream as an SSE
        event and the stream ends."""
        if client_gone(request):
            record.status, record.error = "client_cancelled", "client disconnected"
            return request.get(STREAM) or web.Response(status=499)
        if isinstance(exc, UpstreamError) and exc.refused:  # the client's error, not a server's
            message = str(exc)
            record.status, status, kind = exc.answer()
        elif isinstance(exc, TimeoutError | ClientError | UpstreamError | OSError):
            message = f"upstream failure on {record.decode_server}: {exc!r}"
            record.status, status, kind = "upstream_error", 502, "upstream_error"
        else:
            logger.exception("request %s", record.request_id)
            message = f"router error: {exc!r}"
            record.status, status, kind = "error", 500, "server_error"
        record.error = message[:500]
        return await answer_error(request, message, status, kind)

    async def _write(self, route: Route, record: RequestRecord, after=None) -> None:
        """Join the KV transfer into the record and write it (also when cut short by
        shutdown: a record is never lost)."""
        try:
            if after is not None:
                # P answers once its WAN leg has ended: cancelling it would close P's
                # connection and P would abort the leg (and main decode's settle with it;
                # hetero run 230923 cut four such legs 60 s after relay decode finished).
                # The upstream's own timeout bounds the wait.
                await asyncio.wait({after})
                if not after.cancelled():
                    after.exception()  # retrieved: a failed late answer changes nothing
            await self.transfers.join(route, record)
        except asyncio.CancelledError:  # the router stops: the record is not passed off whole
            said = record.fallback
            record.fallback = f"{said}; {CUT_AT_SHUTDOWN}" if said else CUT_AT_SHUTDOWN
            raise
        finally:
            self._abandon(record)
            self.records.write(record)
            self.live.add(record)

    def _abandon(self, record: RequestRecord) -> None:
        """A failed request's transfer that decode never took (none will run): off the
        WAN model's line, and out of what main decode's cache is expected to hold."""
        wan = self.policy.wan
        if record.status == "ok" or record.room is None or wan is None:
            return
        if wan.abandon(record.room) and isinstance(self.policy, PddPolicy):
            self.policy.mirror.arrived(record.room, ok=False)

    def _learn_wan(self, log, side: str, transfer) -> None:
        """A transfer-log line: a far-site receiver's settles its WAN transfer, and its
        pool lines say which connections it holds; a sender's to a far-site host gives
        the window its connection ended with."""
        if self.policy.wan is None:
            return
        if side == "pool" and log in self._wan_logs:
            self.policy.wan.mirror(transfer)
        elif side == "decode" and log in self._wan_logs:
            self.policy.wan.settle(transfer.room, transfer)
            if isinstance(self.policy, PddPolicy):
                self.policy.mirror.arrived(transfer.room, transfer.ok)
        elif side == "prefill" and transfer.peer.rsplit(":", 1)[0] in self._far_hosts:
            self.policy.wan.sender_end(transfer.room, transfer)

    def _on_wan(self, route: Route, record: RequestRecord, body: dict) -> None:
        """A request whose KV crosses the WAN: its prediction goes into the record, and
        its bytes onto the line's backlog (and its prompt into what MD's cache will hold)
        until the receiver's log settles them."""
        if route.wan is None:
            return
        record.predicted_wan_s = route.wan.seconds
        record.predicted_kv_span_s = route.wan.span_s
        record.wan_queued_bytes = route.wan.queued_bytes
        record.wan_own_bytes = route.wan.own_bytes
        record.wan_goodput_bytes_s = route.wan.goodput_bytes_s
        record.wan_cwnd_bytes = route.wan.cwnd_bytes
        record.wan_held_s, record.wan_held_for = route.wan.held_s, route.wan.after
        crosses = route.prefill is not None and route.kv_server.site != route.prefill.site
        if crosses and route.wan.own_bytes and self.policy.wan is not None:
            self.policy.wan.start(record.room, route.wan.own_bytes, route.wan.after)
            prompt = prompt_tokens(body)
            if isinstance(self.policy, PddPolicy) and prompt is not None:
                self.policy.mirror.coming(record.room, prompt, route.kv_server.name)
