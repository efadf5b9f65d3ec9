"""The switch from relay decode to main decode after the final handoff, without a gap
in the client's stream (greedy requests; see :func:`switch_streams`)."""

from __future__ import annotations

import asyncio
import statistics
from collections import deque

from protocol import clock
from protocol.names import RelayStop
from testbed.router.policies import max_new_tokens
from testbed.router.upstream import UpstreamError

HELD_S = 0.005  # a token that waited this long at the router was held back, not relayed


async def switch_streams(req, rld_stream, close_rld, md_stream) -> bool:
    """After the final handoff, without a gap: relay decode keeps streaming while
    main decode takes over, and both streams (the same tokens: greedy decoding
    only) feed one queue the client is served from. Until main decode has caught up
    with the client, tokens leave the queue at most one per ``switch_pace`` x an
    inter-token interval (relay decode's until main decode has decoded
    ``switch_tokens``, then main decode's own), so the client's stream slows a little
    instead of stopping for the takeover.

    Relay decode's request is aborted (``close_rld``) once main decode has the token
    after those the client has and has decoded ``switch_settle_tokens`` since its first
    chunk (its first steps with the request run slow); before that, once main decode
    at its recent pace would decode past what the router holds before the client has
    been served what is queued;
    and at the latest once main decode has decoded ``switch_limit_tokens`` (relay
    decode is a stage and must free its slot), unless that stop would stall the client
    (main decode's wait spread over the queued tokens over twice the paced interval):
    the stop then waits until it would not, or until main decode has decoded twice
    ``switch_limit_tokens``. Usually it waits less: the client is served at most one
    token per paced interval, longer than main decode's, so either main decode catches
    up with the client or the queue grows until the wait spread over it is short (or
    relay decode ends the request). No stop while main decode is about to
    pause for another room's extend (a handoff batch sent there and not yet extended,
    ``Loads.extending``): its decode batch waits out that pass, which main decode's
    pace cannot foresee (hetero run 004052: a stop "in time" met a 2.1 s extend, and
    the client waited 2.9 s); meanwhile the client is served no faster than relay
    decode's rhythm, so main decode's lead queues up and covers that pause. The tokens
    still queued after the stop
    are spaced so that they last until main decode reaches them: the client's wait
    for a slower main decode is spread over them, not one stall. While relay decode
    will have decoded the whole request before main decode could take it over (see
    :func:`_relay_decode_ends_it`), nothing is paced: the client keeps relay decode's
    rhythm. If main decode fails
    meanwhile, relay decode finishes the request (``fallback``). Returns True if the
    client's stream ended here without main decode; main decode's side is then
    released here or, while it still decodes the request (its cache should hold the
    exchange), by a drain in the background.

    ``handoff_s`` is the longest gap the switch made the client see, from the final
    handoff until the switch is complete (relay decode stopped and main decode caught
    up with the client): the first gap after the final handoff, every gap ending in a
    token the router held back (paced), and every gap after relay decode stopped (waits
    for a main decode still behind). Gaps of relay decode's own steps while it streams
    unpaced are its inter-token intervals, not the switch's (on hetero, a relayed
    request that ended on relay decode counted its slowest step on GPU-A)."""
    queue: deque = deque()  # chunks not yet sent, in token order, with when they came
    have = len(req.tokens)  # tokens the router holds (sent or queued)
    itl = _itl(req.record.token_times)  # the request's own, on relay decode
    # main decode's interval on its recent requests (relay decode's where it has none):
    # until its pace in this request is measured, the client is not served faster than
    # main decode is expected to go, so it does not run far ahead of main decode only to
    # wait for it at the switch; a main decode expected faster than relay decode leaves
    # the client at relay decode's rhythm (hetero run 041406: paced at 1.25x relay
    # decode's 0.4 s while main decode decoded at 0.14-0.28 s, the client's gaps were
    # 0.5 s for four seconds, the handoff's gap over 2x the inter-token P50)
    expected = req.p.loads.itl.get(req.route.main_decode.name) or itl
    # main decode's pace since its first chunk (its chunks cross the WAN)
    md_pace = _Pace(span_s=2 * req.p.pdd.wan_one_way_s)
    from_rld = asyncio.ensure_future(anext(rld_stream, None))
    from_md = asyncio.ensure_future(anext(md_stream, None))
    last_sent, md_count = req.record.token_times[-1], 0
    rld_open, md_open, md_failed, finished = True, True, False, False
    rld_finished, switching, first = False, True, True
    try:
        while not finished:
            # spaced by main decode's interval once measured: the rhythm the client keeps
            # after the switch (a faster main decode then catches up with relay decode's)
            known = md_pace.measured(req.p.pdd.switch_tokens)
            pace = req.p.pdd.switch_pace * (md_pace.seconds_for(1) if known else expected)
            # main decode holds the client's next token, and its first steps with the
            # request in its batch are behind it (default run N: the one or two after
            # its final extend took 55-80 ms where it then ran at 35; with relay decode
            # stopped at main decode's first chunk, the client waited on them, and that
            # was the handoff's longest gap). Holding only the tokens the client has,
            # the client waited a whole step of main decode's for the next, and any
            # stall in it: default run 023756 showed a 162 ms gap there, at an ITL of 45.
            settled = md_pace.tokens >= req.p.pdd.switch_settle_tokens
            pausing = _md_pauses(req)  # main decode is about to extend another room
            caught_up = not md_failed and not pausing and settled and md_count > len(req.tokens)
            # or main decode, at its measured pace, has the token after all the router
            # holds before the client has been served the queue and one interval more,
            # counted from the last token sent (from now, a stop a while after it left the
            # client waiting that while more: hetero run 041406, 0.58 s at a 0.35 s pace)
            # A main decode already overdue for its next chunk is not in time (stalled, or
            # its chunk about to come: the next event decides).
            served_by = last_sent + (have - len(req.tokens) + 1) * pace
            due = md_pace.due(have + 1 - md_count)
            in_time = not md_failed and not pausing and known and clock.now() <= due <= served_by
            # or at the latest at the limit, unless the stop would stall the client (main
            # decode's wait, spread over the queued tokens, over twice the paced interval;
            # hetero run 084227 stalled 5.8 and 7.9 s at the limit, run 004052 0.9 s with
            # main decode, faster than relay decode, 5 tokens behind across the WAN)
            # The wait is bounded: at twice the limit relay decode stops anyway (on CI's
            # shared cores a main decode as slow as relay decode and far behind never
            # came close enough in 240 tokens, and relay decode ended every request).
            limit_tokens = req.p.pdd.switch_limit_tokens
            limit = not md_failed and md_pace.tokens >= limit_tokens
            if limit and rld_open and md_pace.tokens < 2 * limit_tokens:
                wait = md_pace.seconds_until(have + 1 - md_count)
                stall = (clock.now() - last_sent + wait) / (len(queue) + 1) > 2 * pace
                limit = not (stall or pausing)
            if (caught_up or in_time or limit) and rld_open:  # relay decode stops
                from_rld.cancel()
                close_rld()
                rld_open = False
                req.record.decode_server = req.route.main_decode.name
                reasons = {RelayStop.CAUGHT_UP: caught_up, RelayStop.IN_TIME: in_time}
                why = next((r for r, hit in reasons.items() if hit), RelayStop.LIMIT)
                req.record.relay_stopped, req.record.relay_stop_reason = clock.now(), why.value
                req.record.relay_stop_md_behind = max(0, have - md_count)
            # main decode still behind what the client will get (unless relay decode
            # already has, or is sure to have, the whole request)
            rld_ends = rld_open and _relay_decode_ends_it(req, have, itl, expected, md_pace)
            slow = not md_failed and not rld_finished and not rld_ends and md_count < have
            # main decode about to pause for another room's extend while relay decode
            # streams on: the client keeps relay decode's rhythm, so main decode's lead
            # queues up and covers the pause (hetero run 075106: served at main decode's
            # pace, the client ran 13 tokens ahead of relay decode, then waited out a
            # 1.29 s extend)
            # (not while relay decode ends the request anyway: no switch to cover; hetero
            # run 182143 paced such a request at 1.25x main decode's interval, 143 ms
            # against relay decode's 82, for a switch that never came)
            cushion = pausing and rld_open and not md_failed and not rld_ends
            interval = max(pace, itl) if cushion else pace
            if slow and not rld_open and queue:
                # What is queued must last until main decode has the token after it: the
                # time from the last token sent until then, spread evenly over the queued
                # tokens and that one (the switch's own gap).
                wait = md_pace.seconds_until(have + 1 - md_count)
                if wait != float("inf"):
                    span = clock.now() - last_sent + wait
                    interval = max(pace, span / (len(queue) + 1))
            if queue and (not (slow or cushion) or clock.now() - last_sent >= interval):
                chunk, queued_at = queue.popleft()
                new = chunk.new_ids(len(req.tokens))
                req.tokens += new
                # the client-visible gap, where the switch made it: the first after the
                # final handoff, one the router held the token through, and any once
                # relay decode stopped (not relay decode's own steps as it streams on)
                held = clock.now() - queued_at >= HELD_S
                if switching and (first or held or not (rld_open or rld_finished)):
                    gap = clock.now() - last_sent
                    req.record.handoff_s = max(req.record.handoff_s or 0.0, gap)
                first = False
                await req.out.emit(chunk, len(new))
                last_sent, finished = clock.now(), chunk.finished or chunk.done
                switching = rld_open or md_failed or md_count < len(req.tokens)
                continue
            waits = {t for t, open_ in ((from_rld, rld_open), (from_md, md_open)) if open_}
            if not waits:
                break
            timeout = max(0.0, last_sent + interval - clock.now()) if queue else None
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if rld_open and from_rld.done():
                chunk = from_rld.result()
                if chunk is None or chunk.error:  # relay decode is gone: main decode alone
                    rld_open = False
                    req.record.decode_server = req.route.main_decode.name
                else:
                    have = _queue(queue, chunk, have)
                    req.record.eager_tokens = have
                    rld_finished = chunk.finished or chunk.done
                    rld_open = not rld_finished
                    from_rld = asyncio.ensure_future(anext(rld_stream, None))
            if md_open and from_md.done():
                chunk = from_md.result()
                if chunk is None or chunk.error:
                    what = chunk.error if chunk is not None else "stream ended"
                    req.record.fallback = f"main decode after the handoff: {what}"[:300]
                    md_open, md_failed = False, True
                    continue
                req.check_echo(chunk)
                req.channel.extend_seen()  # MD decodes past the final batch: extended
                count = int(chunk.meta.get("completion_tokens", 0))
                md_pace.add(count)
                md_count = max(md_count, count)
                have = _queue(queue, chunk, have)
                md_open = not (chunk.finished or chunk.done)
                if md_open:
                    from_md = asyncio.ensure_future(anext(md_stream, None))
        if not finished:
            raise UpstreamError("relay and main decode both ended before the request did")
        if req.record.decode_server == req.route.main_decode.name:
            return False  # switched; main decode's stream is consumed here to its end
        await req.out.finish()
        if md_open:  # main decode still decodes the request: let it finish, then release
            known = md_pace.measured(req.p.pdd.switch_tokens)
            interval = md_pace.seconds_for(1) if known else expected
            req.start_drain(from_md, md_stream, (len(req.tokens) - md_count) * interval)
            from_md = None
        return True
    finally:
        for task in (from_rld, from_md):
            if task is not None and not task.done():
                task.cancel()


def greedy(body: dict) -> bool:
    """Whether a request decodes greedily (so relay and main decode agree token for
    token). SGLang's default temperature is 1."""
    params = body.get("sampling_params") or {}
    temperature = params.get("temperature", body.get("temperature", 1.0))
    return temperature == 0 or params.get("top_k") == 1


class _Pace:
    """A decoder's pace after the handoff, from the counts its chunks carry: the median
    per-token interval of its last few chunks (since its first chunk, the slow steps
    with the request new in its batch stretched it for the rest of the switch, and the
    client was spaced at up to three of its later intervals). Chunks that crossed the
    WAN arrive bunched (a segment held back by jitter or a loss holds back the ones
    behind it), so where the last few span less than ``span_s`` (the line's round
    trip) the pace is taken over the last ``span_s`` instead: hetero runs 144348 and
    161028 measured main decode's pace from a burst, stopped relay decode "in time",
    and the client waited 1.4 and 4.9 s."""

    def __init__(self, window: int = 5, span_s: float = 0.0) -> None:
        self.window, self.span_s = window, span_s
        self.first: tuple[int, float] | None = None  # (count, time) of its first chunk
        self.chunks: deque[tuple[int, float]] = deque(maxlen=256)

    def add(self, count: int) -> None:
        now = clock.now()
        self.first = self.first or (count, now)
        self.chunks.append((count, now))

    @property
    def last(self) -> tuple[int, float] | None:
        return self.chunks[-1] if self.chunks else None

    @property
    def tokens(self) -> int:
        """Tokens decoded since its first chunk."""
        return self.last[0] - self.first[0] if self.first else 0

    def measured(self, tokens: int) -> bool:
        """Whether the pace is known: ``tokens`` decoded since the first chunk, which
        came at least ``span_s`` before the last."""
        return self.tokens >= tokens and self.last[1] - self.first[1] >= self.span_s

    def seconds_until(self, tokens: int) -> float:
        """How long from now until it has decoded ``tokens`` more than its last chunk's
        count, at its recent pace (its next token is due one interval after that chunk)."""
        return max(0.0, self.due(tokens) - clock.now())

    def due(self, tokens: int) -> float:
        """When it will have decoded ``tokens`` more than its last chunk's count."""
        if not self.tokens:
            return float("inf")
        return self.last[1] + self.seconds_for(tokens)

    def seconds_for(self, tokens: int) -> float:
        """How long it takes to decode ``tokens`` more at its recent pace."""
        if tokens <= 0:
            return 0.0
        if len(self.chunks) < 2:
            return float("inf")
        recent = list(self.chunks)[-self.window :]
        (c0, t0), (c1, t1) = recent[0], recent[-1]
        if t1 - t0 < self.span_s:  # bunched: over the last span, or since the first chunk
            spanning = (c for c in reversed(self.chunks) if t1 - c[1] >= self.span_s)
            c0, t0 = next(spanning, self.chunks[0])
            return tokens * (t1 - t0) / (c1 - c0) if c1 > c0 else float("inf")
        pairs = zip(recent, recent[1:], strict=False)
        steps = [(b - a) / (d - c) for (c, a), (d, b) in pairs if d > c]
        return tokens * statistics.median(steps) if steps else float("inf")


def _relay_decode_ends_it(req, have: int, itl: float, expected: float, md_pace: _Pace) -> bool:
    """Whether relay decode, at its own interval with the pace's margin, decodes the rest
    of the request (up to its ``max_new_tokens``) before main decode has decoded
    ``switch_limit_tokens`` after the handoff, the latest relay decode would be stopped:
    no switch can then happen before the end, and spacing the client's tokens at main
    decode's slower pace would only slow the stream (hetero run Q: 9 of 12 relayed
    requests ended on relay decode, paced at main decode's interval all along)."""
    if itl <= 0:
        return False
    left = max_new_tokens(req.body) - have
    limit = req.p.pdd.switch_limit_tokens
    # before main decode has streamed: its expected interval from now on
    md_s = md_pace.seconds_until(limit - md_pace.tokens) if md_pace.tokens else limit * expected
    return left * itl * req.p.pdd.switch_pace < md_s


def _md_pauses(req) -> bool:
    """Whether main decode has another room's handoff batch to extend (its decode batch,
    this request in it, waits out that pass)."""
    return req.p.loads.extending[req.route.main_decode.name] > req.channel.pending


def _itl(token_times: list[float]) -> float:
    """The request's recent inter-token interval (median of its last gaps; 0 if none)."""
    gaps = sorted(b - a for a, b in zip(token_times[-9:], token_times[-8:], strict=False))
    return gaps[len(gaps) // 2] if gaps else 0.0


def _queue(queue: deque, chunk, have: int) -> int:
    """Queue a chunk, with when, if it carries tokens the router does not hold yet (or
    the end)."""
    count = int(chunk.meta.get("completion_tokens", 0))
    if count > have or chunk.finished or chunk.done:
        queue.append((chunk, clock.now()))
    return max(have, count)
