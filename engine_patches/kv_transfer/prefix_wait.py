"""Decode holds back a request whose prompt's KV is mostly on its way to it already.

Sessions that open together with one system prompt each send it to decode: every
request reaches decode before any of them holds the prefix, matches nothing in decode's
prefix cache, and prefill sends the prefix once per request (hetero run 070409: four
openings put ~35 MB of one 8.4 MB prefix's KV on a 1.6 MB/s WAN at once, three of them
on new connections in slow start together; 170-266 retransmissions each, 51-55 s for
what the line carries in 6-7).

An AROUND hook on SGLang's ``DecodePreallocQueue.pop_preallocated`` keeps such a
request out of preallocation (it stays queued; nothing is allocated for it) while a
request whose KV is on its way here (in the transfer queue or ahead of it in this queue,
routed before it; or transferred and not yet in the prefix cache) brings enough of what
the cache lacks of its prompt (``protocol.kv.holds_back``; the router predicts with it
too, in its routing order, which the rooms carry: ``protocol.rooms``).
Once that KV has arrived and its prompt is in the cache (SGLang's PREBUILT merge puts
it there; a parked PDD request's when it is parked,
:func:`engine_patches.handoff.md.publish_prompt`), the request matches it and prefill
sends only the rest: under a fair share of the line, a request that waits for the
other's remaining bytes and then sends its own rest is done no later than one that sends
everything beside it, unless the other carries much more than it needs.

Requests in this queue count in the router's order (the rooms carry it), not the order
their legs reached decode: one routed first but queued behind holds a later one back. A
request the router predicted held for a transfer (it names that room:
``protocol.rooms.after_room``) that has not reached decode yet waits for it up to
``ARRIVAL_S``: decode took the later leg 40 ms before the first on default run 030404,
and with nothing on its way sent its whole 10 MB beside the first's.

A request waits at most ``late_leg / 2`` (a dual-path room's second leg must join
within ``late_leg``, or prefill sends to the first only), or what the router allowed it
(``protocol.rooms.hold_bound``: a P->MD request's client waits on it, and past what its
own KV was predicted to take the hold has lost its point), then is preallocated as usual.
The router's bound is a prediction: while the KV held for is still coming and not
stalled, it stretches up to ``STRETCH`` times (``PrefixWait._most``).

Lifecycle of one request in decode's prealloc queue::

    queued ─shares in-flight KV, or its named room not here yet─▶ held ─that KV in the
      cache (the named room here, not shared), or waited its most─▶
    preallocated (SGLang's own path: matched, allocated, KV requested from prefill)

Only on decode servers with the prefix cache (``--disaggregation-decode-enable-radix-
cache``) and ``PDD_DECODE_PREFIX_WAIT=1`` (``servers.decode_prefix_wait``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict

from protocol.env import Env
from protocol.kv import holds_back
from protocol.rooms import after_room, hold_bound, routed_before

POP_PREALLOCATED = "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated"

logger = logging.getLogger("pdd.prefix_wait")
ARRIVAL_S = 1.0  # a named room not here yet is waited for this long (legs posted together)
STRETCH = 2.0  # the router's hold bound, at most this many times, while the KV still comes
QUIET_SHARE = 1 / 30  # of the KV idle timeout: KV on its way with no data this long stalled
SEEN_ROOMS = 4096  # rooms remembered as having reached this decode server


def _cached_tokens(tree, req) -> int:
    """What decode's prefix cache holds of ``req``'s prompt (no lock taken)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.common import _req_radix_key

    key = _req_radix_key(tree, req, req.origin_input_ids)
    return int(tree.match_prefix(MatchPrefixParams(key=key, req=req)).device_prefix_len)


class PrefixWait:
    """One per decode prealloc queue: since when each held request waits and why (the
    reason logged last: a request held for a named room, then for its KV, logs both),
    those that waited their most (never held again while they stay queued), and the rooms
    that have reached this queue (a named room among them is here, or has been)."""

    def __init__(self, max_wait_s: float, quiet_s: float = float("inf")) -> None:
        self.max_wait_s = max_wait_s
        self.quiet_s = quiet_s  # KV on its way with no data for this long has stalled
        self.since: dict[str, tuple[float, str]] = {}  # rid: held since, reason logged last
        self.expired: set[str] = set()
        self.stretched: set[str] = set()  # held past the router's bound (logged once)
        self.seen: OrderedDict[int, None] = OrderedDict()

    def _see(self, rooms) -> None:
        for room in rooms:
            self.seen[room] = None
            self.seen.move_to_end(room)
        while len(self.seen) > SEEN_ROOMS:
            self.seen.popitem(last=False)

    def split(self, queue) -> tuple[list, list]:
        """The queue's requests to hold back now, and the others (queue order)."""
        tree = queue.tree_cache
        page = int(getattr(tree, "page_size", 1) or 1)
        scheduler = queue.scheduler
        # (room, prompt, receiver) of KV on its way: on the wire or still at prefill, or
        # queued here (no receiver yet); then KV that has arrived (not yet merged: any
        # request may wait for that)
        coming = [
            (r.req.bootstrap_room, r.req.origin_input_ids, getattr(r, "kv_receiver", None))
            for r in queue.transfer_queue.queue
        ]
        queued = [(r.req.bootstrap_room, r.req.origin_input_ids) for r in queue.queue]
        here = [r.origin_input_ids for r in scheduler.waiting_queue]
        self._see([room for room, *_ in coming] + [room for room, _ in queued])
        queued_rids = {r.req.rid for r in queue.queue}
        self.expired &= queued_rids  # those SGLang took, or that were aborted, are gone
        self.stretched &= queued_rids
        for gone in self.since.keys() - queued_rids:
            del self.since[gone]
        held, rest, now = [], [], time.monotonic()
        for i, decode_req in enumerate(queue.queue):
            req = decode_req.req
            waited = now - self.since.get(req.rid, (now, ""))[0]
            ids, room, why, awaited = req.origin_input_ids, req.bootstrap_room, None, None
            # only for KV routed before it, as the router predicts the hold: held for one
            # routed after it (its KV still at prefill), a request whose own KV was ready
            # waited for it (default run 025010: 5 s, its TTFT 9.2 s)
            ahead = [(p, rx) for r, p, rx in coming if routed_before(room, r) is not True]
            ahead += [
                (p, None) for j, (r, p) in enumerate(queued) if j != i and _first(j, r, i, room)
            ]
            prompts = [p for p, _ in ahead]
            may_wait = req.rid not in self.expired and not decode_req.is_rebootstrap
            named = after_room(req)
            if may_wait and named is not None and named not in self.seen and waited < ARRIVAL_S:
                why = ("room %s waits for room %s, routed before it and not here yet", named)
            # the prefix cache's match (a tree walk) only for a prompt that would wait even
            # with nothing cached: every scheduler iteration comes here
            elif may_wait and holds_back(ids, 0, prompts, page, here)[0]:
                extra, which = holds_back(ids, _cached_tokens(tree, req), prompts, page, here)
                if extra:
                    why = ("room %s waits for %d tokens on their way", extra)
                    # KV here (not yet merged) surely comes; a receiver says for its own
                    awaited = ahead[which][1] if which < len(ahead) else True
            if why and waited >= self._most(req, waited, awaited):
                self.expired.add(req.rid)
                why = None
                if req.rid in self.since:  # a reviewer counts the holds cut short
                    logger.info("room %s goes on after %.1f s held (its most)", room, waited)
            if why:
                since, said = self.since.get(req.rid, (now, None))
                if said != why[0]:
                    logger.info(why[0], room, why[1])
                self.since[req.rid] = (since, why[0])
                held.append(decode_req)
            else:
                self.since.pop(req.rid, None)
                rest.append(decode_req)
        return held, rest

    def _most(self, req, waited: float, awaited) -> float:
        """How long ``req`` may be held: MD's own bound, or the router's where it named
        one (``protocol.rooms.hold_bound``: a P->MD request's client waits on the hold,
        and the router predicted when the KV held for would be in). The router's bound
        stretches, up to ``STRETCH`` times and MD's own, while the KV held for is still
        coming and not stalled (``awaited``: its receiver, or True for KV already here):
        sent beside it, the request's own KV would share the line with it and end no
        sooner (:func:`protocol.kv.holds_back`), so a late prediction is no reason to send
        the prefix again. Default run ``bench-default-20261207-202124``: a P->MD turn
        bounded at 1.5 s for its session's previous turn (6.4 MB, five retransmissions,
        3.5 s where 2.5 were predicted) went on 0.3 s before that KV was in, and prefill
        sent all 6.9 MB of its prompt behind it (its first token 0.6 s later, the bytes
        twice)."""
        bound = hold_bound(req)
        if bound is None or bound >= self.max_wait_s:
            return self.max_wait_s
        if waited < bound or not _still_coming(awaited, self.quiet_s):
            return bound
        if req.rid not in self.stretched:
            self.stretched.add(req.rid)
            logger.info(
                "room %s holds past the router's %.1f s: the KV it waits for is still coming",
                req.bootstrap_room,
                bound,
            )
        return min(self.max_wait_s, STRETCH * bound)


def _still_coming(awaited, quiet_s: float) -> bool:
    """Whether the KV a request is held for is on its way and moving (True: it has
    arrived; a receiver: it says, where it can)."""
    if awaited is None or awaited is True:
        return awaited is True
    check = getattr(awaited, "still_coming", None)
    return bool(check(quiet_s)) if check is not None else False


def _first(j: int, other: int, i: int, room: int) -> bool:
    """Whether the request queued ``j``-th (room ``other``) goes before the ``i``-th: by
    the router's order where the rooms say it, else by their place in the queue."""
    before, after = routed_before(other, room), routed_before(room, other)
    return j < i if before == after else bool(before)


def _wait_for(queue) -> PrefixWait | None:
    """The queue's ``PrefixWait``, made at its first call (None without the prefix
    cache: nothing would match)."""
    if not hasattr(queue, "_pdd_prefix_wait"):
        from sglang.srt.disaggregation.utils import get_disagg

        from engine_patches.kv_transfer.manager import Timeouts

        on = get_disagg().disaggregation_decode_enable_radix_cache
        timeouts = Timeouts.from_env()
        wait = PrefixWait(timeouts.late_leg / 2, timeouts.idle * QUIET_SHARE)
        queue._pdd_prefix_wait = wait if on else None
    return queue._pdd_prefix_wait


def _pop_preallocated_around(original, queue, *args, **kwargs):
    wait = _wait_for(queue)
    held, rest = wait.split(queue) if wait is not None else ([], queue.queue)
    if not held:
        return original(queue, *args, **kwargs)
    queue.queue = rest
    try:
        return original(queue, *args, **kwargs)
    finally:
        queue.queue = held + queue.queue  # first in line again, in their order


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if os.environ.get(Env.DECODE_PREFIX_WAIT) == "1":
        HookRegistry.register(POP_PREALLOCATED, _pop_preallocated_around, HookType.AROUND)
