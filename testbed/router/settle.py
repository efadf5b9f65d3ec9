"""Main decode's side of a relayed request after the client's stream ended on relay
decode: main decode still takes the exchange into its prefix cache (DRC), off the
client's path, and then the mirror and prefill's cache learn it, as after any request
that ended on main decode. A session's next turn waits for this (``turn_wait_s``).

Two ways there, both run in the background by :class:`testbed.router.relay.RelayedRequest`:

- :func:`settle`: relay decode finished before main decode held the KV (no handoff);
- :func:`drain_main_decode`: it finished after the final handoff, main decode still
  decoding (the switch did not happen before the end).

Each ends by releasing main decode's side of the room (``req.release``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from protocol import clock
from testbed.router.handoff_channel import HandoffError
from testbed.router.handoff_decision import settle_batches
from testbed.router.upstream import chunks

if TYPE_CHECKING:
    from testbed.router.relay import RelayedRequest

logger = logging.getLogger("pdd.router")


async def drain_main_decode(req: RelayedRequest, pending: asyncio.Future, md_stream) -> None:
    """Main decode decodes the request to its end, so its cache holds the exchange;
    then the mirror and P learn it, as after any request that ended on MD."""
    try:
        chunk = await pending
        while chunk is not None and not chunk.error:
            # MD decodes past the final batch: it no longer pauses for it (other rooms'
            # switches need not cushion it while this drain runs)
            req.channel.extend_seen()
            if chunk.finished or chunk.done:
                break
            chunk = await anext(md_stream, None)
        if chunk is None or chunk.error:
            raise HandoffError(f"main decode: {chunk.error if chunk else 'stream ended'}")
        aligning = req.p.after.remember(req.route, req.body, req.record.session_id, req.tokens)
        if aligning is not None:
            await aligning
    except Exception as exc:  # off the client's path: log, never raise
        req.p.after.forget(req.body, req.record.session_id, req.tokens)
        logger.warning("room %s: main decode after relay decode ended: %r", req.record.room, exc)
    finally:
        req.release()


async def settle(req: RelayedRequest, tokens: list[int]) -> None:
    """Relay decode finished the request before MD held the KV: MD still takes the
    exchange into its prefix cache (DRC), off the client's path. P's transfer runs
    to its end instead of being cut, MD gets all eager tokens but the last (it
    decodes that one itself: one extend forward, or one per catch-up batch where a
    handoff would take batches, then one decode step), and once MD's
    output equals what the client got, the mirror and P's cache learn the exchange
    like after any request that ended on MD. A session's next turn waits for this
    at most ``turn_wait_s``, as it waits for P's cache after any request."""
    timeout = req.p.pdd.settle_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    log = req.route.main_decode.transfer_log
    try:
        while not req.ready.done():  # MD holds the KV, its transfer failed, or time is up
            failed = req.p.transfers.peek(req.record.room, log) if log else None
            if failed is not None and not failed.ok:
                raise HandoffError(f"KV transfer to main decode: {failed.reason}")
            if loop.time() > deadline:
                raise TimeoutError(f"main decode did not hold the KV within {timeout:.0f} s")
            await asyncio.wait({req.ready}, timeout=0.25)
        req.ready.result()
        # MD holds the KV: the mirror expects the exchange (not before the KV landed: a
        # next turn routed P->MD on a KV landing late pays its whole transfer, default
        # run 115030: 849 tokens predicted as 17). Nothing of it is in MD's cache yet:
        # the request is parked, and SGLang's tree takes it when the final batch lets it
        # run, then all of it once it decoded the last token. Each batch takes what
        # catch-up batches to this MD recently took (send to EXTENDED; at least a step),
        # then one step. Timed by MD's step alone, hetero run 030425 expected a settle
        # 0.3 s after its KV landed where MD took 6 s to extend its two batches (1.5 s
        # passes): a next turn was predicted 129 uncached tokens where MD lacked 464,
        # went P->MD and had its first token after 10.5 s, the run's slowest.
        # Only what MD lacks: earlier catch-up batches already gave it t2..t(1+handed);
        # in bounded batches where a handoff would (each extend stalls MD's streams).
        lacking = tokens[1 + req.handed : -1]
        # the request left MD's count when the client's stream ended (before this ran)
        md = req.route.main_decode.name
        sizes = settle_batches(len(lacking), req.p.loads.in_flight[md] + 1, req.p.knobs)
        step = req.p.loads.itl.get(md, 0.0)
        batch_s = max(req.p.loads.extend_s.get(md, step), step)
        batches = len(sizes) + (req.inflight is not None)  # one MD is extending first
        ready_at = clock.now() + batches * batch_s + step
        req.p.after.expect(req.body, req.record.session_id, tokens, 0, ready_at)
        if req.inflight is not None:  # a catch-up batch MD is still extending
            await req.inflight
        for i, size in enumerate(sizes):
            batch, lacking = lacking[:size], lacking[size:]
            final = i == len(sizes) - 1
            await req.channel.handoff(batch, final=final)
            if not final:  # MD extended it: the next may go (within the settle's time)
                await asyncio.wait_for(req.channel.extended(), max(deadline - loop.time(), 1))
        md = await asyncio.wait_for(asyncio.shield(req.md), max(deadline - loop.time(), 1))
        ids: list[int] = []
        async for chunk in chunks(md):
            if chunk.error:
                raise HandoffError(f"main decode: {chunk.error}")
            ids += chunk.new_ids(len(ids))
            req.channel.extend_seen()
            if chunk.finished or chunk.done:
                break
        if ids != tokens:
            raise HandoffError(f"main decode's {len(ids)} tokens differ from relay decode's")
        aligning = req.p.after.remember(req.route, req.body, req.record.session_id, tokens)
        if aligning is not None:
            await aligning
    except Exception as exc:  # an optimisation off the client's path: log, never raise
        req.p.after.forget(req.body, req.record.session_id, tokens)
        logger.warning("settling room %s on main decode: %r", req.record.room, exc)
    finally:
        req.release()
