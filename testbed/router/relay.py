"""PDD's relayed pipeline (P->RLD->MD) in the router.

One request's walk (:meth:`RelayedRequest.run`)::

    open handoff channel to MD ─ WATCH(room) ──────────────────────┐
    POST prefill (dual-path room) ─ KV to RLD (LAN) and MD (WAN)    │
    POST RLD (stream) ─ eager tokens t1.. go to the client at once  │
    POST MD  (rid pdd-md-room) ─ parked on MD once its KV is held ─ READY
    after each eager token: handoff_decision.decide → wait | catch-up batch | final
    final HANDOFF(t2..tk) → MD extends t1..tk and predicts t(k+1) in one forward; RLD
    streams on (greedy) at a slightly slower pace until MD's stream, whose tokens echo
    what the client has (checked, not re-sent), has caught up → RLD's request aborted
    → MD's stream continues (sampled requests: RLD closed at the final handoff)

If RLD finishes before MD holds the KV, the client is done;
:func:`testbed.router.settle.settle` then lets P's transfer finish and hands MD all
tokens anyway, so MD caches the exchange for the session's next turn. If MD never holds
the KV (a cut WAN, MD down) the record says why (``fallback``).
The client sees one stream either way.

Collaborators, all passed to :class:`RelayedPipeline`: the upstream HTTP client, the
servers' loads, the transfer-log index, what follows a request (DRC alignment and the
MD mirror), and a runner for work that outlives the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import ClientError, web

from protocol import clock, headers
from protocol.names import HandoffMode, Pipeline
from protocol.records import RequestRecord
from protocol.rooms import md_rid, with_after
from testbed.router.after import AfterRequest
from testbed.router.client_stream import ClientStream, upstream_path
from testbed.router.config import PddConfig
from testbed.router.handoff_channel import HandoffChannel, HandoffError
from testbed.router.handoff_decision import Action, HandoffState, Knobs, decide, pinned_mode
from testbed.router.policies import Loads, Route, max_new_tokens
from testbed.router.settle import drain_main_decode, settle
from testbed.router.switch import greedy, switch_streams
from testbed.router.transfers import TransferIndex
from testbed.router.upstream import Upstream, UpstreamError, chunks, read_or_abort

RLD_FIRST = "relay decode finished first"


class RelayedPipeline:
    """The shared part: collaborators and knobs. ``serve`` runs one request."""

    def __init__(
        self,
        pdd: PddConfig,
        upstream: Upstream,
        loads: Loads,
        transfers: TransferIndex,
        after: AfterRequest,
        background: Callable[..., asyncio.Task],
        unfinished_prefills: dict[int, asyncio.Task],
    ) -> None:
        self.pdd, self.knobs = pdd, Knobs.of(pdd)
        self.upstream, self.loads, self.transfers = upstream, loads, transfers
        self.after, self.background = after, background
        # The router's: id(record) → the prefill call still running after relay decode
        # finished the request (P answers once its WAN leg ends); the record waits for it.
        self.unfinished_prefills = unfinished_prefills

    async def serve(
        self, request: web.Request, body: dict, route: Route, record: RequestRecord
    ) -> web.StreamResponse:
        return await RelayedRequest(self, request, body, route, record).run()


class RelayedRequest:
    """One request's walk through P->RLD->MD."""

    def __init__(self, pipeline: RelayedPipeline, request, body, route, record) -> None:
        self.p, self.body, self.route, self.record = pipeline, body, route, record
        self.path = upstream_path(request)
        self.out = ClientStream(request, bool(body.get("stream")), record)
        self.tokens: list[int] = []  # every token the client got, in order
        self.handed = 0  # eager tokens sent to MD in handoff batches (t1 came with the KV)
        self.inflight: asyncio.Task | None = None  # the catch-up batch MD is extending
        self.pinned_at = int(request.headers.get(headers.HANDOFF_AT, 0)) or None
        self.pinned_mode = pinned_mode(request.headers.get(headers.HANDOFF_MODE))
        prefill = route.prefill  # record.room: a dual-path room, made by the router
        self.pd_body = {
            **body,
            "stream": True,
            "bootstrap_host": prefill.host,
            "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": record.room,
        }
        md_host, port, md = route.main_decode.host, pipeline.pdd.handoff_port, route.main_decode
        self.channel = HandoffChannel(
            md_host,
            port,
            record.room,
            pipeline.loads.extending,
            md.name,
            on_extended=lambda seconds: pipeline.loads.learn_extend(md.name, seconds),
        )
        self.drained: asyncio.Task | None = None  # main decode finishing apart
        self.relay_died = False  # MD took over from a relay decode that died
        self.ready: asyncio.Task | None = None
        self.prefill: asyncio.Task | None = None
        self.prefill_awaited = False  # the record waits for P's answer (see below)
        self.waited: str | None = None  # why the handoff last waited while MD held the KV
        self.md: asyncio.Task | None = None

    @property
    def md_holds_kv(self) -> bool:
        r = self.ready
        return r.done() and not r.cancelled() and r.exception() is None

    async def run(self) -> web.StreamResponse:
        up, route = self.p.upstream, self.route
        self.ready = asyncio.create_task(self.channel.watch())
        self.prefill = asyncio.create_task(
            up.prefill(route.prefill, self.path, self.pd_body, self.record)
        )
        md_body = {**self.pd_body, "rid": md_rid(self.record.room)}
        md_body = with_after(md_body, route.md_after, self.path)  # the one MD holds it for
        self.md = asyncio.create_task(up.post(route.main_decode, self.path, md_body))
        rld = None
        owns_md_side = True
        try:
            posted = up.post(route.stream_from, self.path, self.pd_body)
            rld = await read_or_abort(posted, self.prefill)
            if rld.status != 200:
                text = (await rld.text())[:300]
                raise UpstreamError(f"relay decode answered {rld.status}: {text}", rld.status)
            mode = await self._relay_eager(rld)
            if mode is None:
                owns_md_side = not await self._ended_on_relay()
                return self.out.response
            self.record.handoff_mode, self.record.pipeline = mode, Pipeline.P_RLD_MD
            md = await self.md
            if md.status != 200:
                text = (await md.text())[:300]
                raise UpstreamError(f"main decode answered {md.status}: {text}", md.status)
            md_stream = chunks(md)
            # Greedy: both streams are the same tokens, so relay decode streams on until
            # main decode has caught up with the client.
            if (
                greedy(self.body)
                and not self.relay_died
                and await switch_streams(self, chunks(rld, self.prefill), rld.close, md_stream)
            ):
                owns_md_side = self.drained is None  # else the drain releases MD's side
                self._prefill_answer_later()
                return self.out.response
            rld.close()  # SGLang aborts relay decode's request
            rld = None
            await self._stream_main_decode(md_stream)
            self.record.decode_server = route.main_decode.name
            await self.out.finish()
            return self.out.response
        except UpstreamError as exc:
            return await self.out.fail(exc)
        finally:
            self.record.output_ids = self.tokens
            if rld is not None:
                rld.close()
            if owns_md_side:
                self.release()

    async def _relay_eager(self, rld) -> HandoffMode | None:
        """Stream relay decode's tokens to the client, handing off as ``decide`` says.
        Returns the handoff's mode once MD took over, None if relay decode finished."""
        record, tokens = self.record, self.tokens
        batches, mode = 0, None
        limit = max_new_tokens(self.body)
        rld_stream = chunks(rld, self.prefill)
        try:
            while True:
                try:
                    chunk = await anext(rld_stream, None)
                    if chunk is None:
                        raise UpstreamError("its stream ended before the request did")
                    if chunk.error:
                        raise UpstreamError(chunk.error)
                except (UpstreamError, ClientError, OSError) as exc:
                    p = self.prefill
                    if p.done() and not p.cancelled() and p.exception() is not None:
                        raise  # the prefill failed: MD cannot hold the KV either
                    batches = await self._take_over(exc, batches)
                    return mode or HandoffMode.ONE_SHOT
                new = chunk.new_ids(len(tokens))
                tokens += new
                await self.out.emit(chunk, len(new))
                if chunk.finished or chunk.done:
                    return None
                if record.fallback:
                    continue  # MD failed mid catch-up: relay decode goes on to the end
                batch_done = self.inflight is not None and self.inflight.done()
                if batch_done and not await self._extended():
                    continue
                state = HandoffState(
                    eager=len(tokens),
                    handed=self.handed,
                    remaining=limit - len(tokens),
                    md_holds_kv=self.md_holds_kv,
                    batch_in_flight=self.inflight is not None,
                    rld_load=self.p.loads.in_flight[self.route.stream_from.name],
                    md_load=self.p.loads.in_flight[self.route.main_decode.name],
                    mode=mode,
                    pinned_at=self.pinned_at,
                    pinned_mode=self.pinned_mode,
                    channel_open=self.channel.open,
                )
                decision = decide(state, self.p.knobs)
                mode = decision.mode
                if decision.action is Action.WAIT:
                    self.waited = decision.why if state.md_holds_kv else None
                    continue
                # a pinned handoff overtakes a catch-up batch: it waits for the batch
                if self.inflight is not None and not await self._extended():
                    continue
                batch = tokens[1 + self.handed : 1 + self.handed + decision.tokens]
                self.handed += len(batch)
                batches += 1
                sent = clock.now()
                final = decision.action is Action.FINAL
                record.handoff_bytes += await self.channel.handoff(batch, final=final)
                if final:
                    record.handoff_sent = sent
                    return mode
                self.inflight = asyncio.create_task(self.channel.extended())
        finally:
            record.eager_tokens = len(tokens)
            record.handoff_tokens, record.handoff_batches = self.handed, batches

    async def _take_over(self, exc, batches: int) -> int:
        """Relay decode died mid-stream. If MD holds the KV (and no handoff failed),
        MD takes over: every eager token it lacks in one final handoff, and the client's
        stream goes on from MD. Else the request fails with relay decode's error."""
        why = f"relay decode died: {exc}"[:300]
        if not self.md_holds_kv or self.record.fallback or not self.tokens:
            raise UpstreamError(why) from exc
        if self.inflight is not None and not await self._extended():
            raise UpstreamError(f"{why}; {self.record.fallback}") from exc
        batch = self.tokens[1 + self.handed :]
        self.record.handoff_bytes += await self.channel.handoff(batch, final=True)
        self.record.handoff_sent = clock.now()
        self.record.fallback = f"{why}; main decode took over"
        self.relay_died = True
        self.handed += len(batch)
        return batches + 1

    async def _extended(self) -> bool:
        """Whether MD extended the catch-up batch in flight; if it failed, relay decode
        finishes the request (the record says why)."""
        try:
            await self.inflight
            return True
        except (OSError, asyncio.IncompleteReadError, HandoffError) as exc:
            self.record.fallback = f"catch-up handoff failed: {exc!r}"[:300]
            return False
        finally:
            self.inflight = None

    async def _ended_on_relay(self) -> bool:
        """Relay decode finished the request. Records why MD did not take it, ends the
        client's stream and, where MD can still cache the exchange, starts settling it
        there. Returns whether the settle now owns MD's side of the room."""
        record = self.record
        record.handoff_mode = HandoffMode.NONE
        if not record.fallback:
            record.fallback = await self._why_md_missed()
        if record.fallback and not record.fallback.startswith(RLD_FIRST):
            record.handoff_mode = HandoffMode.FAILED
        await self.out.finish()
        if record.handoff_mode != HandoffMode.NONE or len(self.tokens) < 2:
            return False
        # The session's next turn waits for the settle, so P's and MD's caches agree.
        self.p.after.settling[id(record)] = self.p.background(settle(self, list(self.tokens)))
        self._prefill_answer_later()
        return True

    def _prefill_answer_later(self) -> None:
        """Relay decode ended the client's stream before P answered: the record waits
        for P's answer (its prefix hit) off the client's path, and releasing MD's side
        leaves that task alone (the router's record writer times it out)."""
        if not self.prefill.done():
            self.p.unfinished_prefills[id(self.record)] = self.prefill
            self.prefill_awaited = True

    def check_echo(self, chunk) -> None:
        echoed, tokens = chunk.echoed(), self.tokens
        if echoed is not None:
            n = min(len(echoed), len(tokens))
            self.record.handoff_mismatch |= echoed[:n] != tokens[:n]

    async def _from_main_decode(self, chunk) -> bool:
        """One chunk of main decode's stream after the handoff: its echo of what the
        client already has is checked, and tokens beyond it go to the client. Returns
        whether it carried such a token (or ended the stream)."""
        if chunk is None:
            raise UpstreamError("main decode's stream ended after the handoff")
        if chunk.error:
            raise UpstreamError(f"main decode: {chunk.error}")
        tokens = self.tokens
        self.check_echo(chunk)
        new = chunk.new_ids(len(tokens))
        if new and self.record.handoff_s is None:  # the client-visible gap at the switch
            self.record.handoff_s = clock.now() - self.record.token_times[-1]
        tokens += new
        if new or chunk.finished or chunk.done:
            await self.out.emit(chunk, len(new))
        return bool(new) or chunk.finished or chunk.done

    async def _stream_main_decode(self, md_stream) -> None:
        async for chunk in md_stream:
            await self._from_main_decode(chunk)

    def start_drain(self, pending: asyncio.Future, md_stream, left_s: float) -> None:
        """Relay decode finished the client's stream after the handoff: main decode
        finishes the request in the background (in about ``left_s``). It settles the
        exchange like :func:`settle`, so the session's next turn waits for it
        (``turn_wait_s``), and the mirror expects it: MD holds what it extended now (the
        first token and the handed-off ones), all once it ends."""
        held = len(self.body["input_ids"]) + 1 + self.handed  # running on MD: in its tree
        ready_at = clock.now() + left_s
        self.p.after.expect(self.body, self.record.session_id, self.tokens, held, ready_at)
        self.drained = self.p.background(drain_main_decode(self, pending, md_stream))
        self.p.after.settling[id(self.record)] = self.drained

    def release(self) -> None:
        """End MD's side of the room: pending tasks cancelled, MD's stream closed, and
        the channel closed (MD then finishes its parked request, if any, as released)."""
        awaited = self.prefill if self.prefill_awaited else None
        for task in (self.ready, self.prefill, self.md):
            if task is not None and task is not awaited and not task.done():
                task.cancel()
        self.channel.close()
        md = self.md
        if md is not None and md.done() and not md.cancelled() and md.exception() is None:
            md.result().close()

    async def _why_md_missed(self) -> str:
        ready, md = self.ready, self.md
        if ready.done() and not ready.cancelled() and ready.exception() is not None:
            return f"handoff channel to main decode failed: {ready.exception()!r}"[:300]
        if (
            md.done()
            and not md.cancelled()
            and md.exception() is None
            and md.result().status != 200
        ):
            resp = md.result()
            return f"main decode answered {resp.status}: {(await resp.text())[:300]}"
        if self.md_holds_kv:  # no handoff was worth it, or MD's KV came at the very end
            why = f"no handoff: {self.waited}" if self.waited else "only at the end"
            return f"{RLD_FIRST} (main decode held the KV; {why})"
        return f"{RLD_FIRST} (main decode did not hold the KV yet)"
