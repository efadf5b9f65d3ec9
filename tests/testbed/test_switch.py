"""The switch from relay decode to main decode after the final handoff
(``testbed.router.switch``). The two streams are async generators of SGLang-shaped
chunks standing in for the servers' SSE responses, and the request is a stand-in
holding only what the switch reads and writes; the real servers' switch runs in
tests/testbed/test_pdd.py."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from types import SimpleNamespace

import pytest

from protocol.names import RelayStop
from protocol.stream import Chunk
from testbed.router.config import PddConfig
from testbed.router.handoff_channel import HandoffChannel
from testbed.router.policies import Loads
from testbed.router.switch import switch_streams

TOTAL = 40  # output tokens of the request
EAGER = 12  # tokens the client had from relay decode at the final handoff


def chunk(count: int) -> Chunk:
    ids = [100 + i for i in range(count)]
    data = {"output_ids": ids, "meta_info": {"completion_tokens": count}}
    if count == TOTAL:
        data["meta_info"]["finish_reason"] = {"type": "length"}
    return Chunk.parse(f"data: {json.dumps(data)}")


async def stream(first: int, step_s: float, die_after: int | None = None):
    """Chunks with counts ``first``..TOTAL, one every ``step_s``; None-ending early
    (the server gone) after ``die_after``."""
    for count in range(first, TOTAL + 1):
        await asyncio.sleep(step_s)
        if die_after is not None and count > die_after:
            return
        yield chunk(count)


class Request:
    """What the switch uses of relay.RelayedRequest."""

    def __init__(self, itl_s: float) -> None:
        now = time.time()
        self.tokens = [100 + i for i in range(EAGER)]
        self.body = {"sampling_params": {"max_new_tokens": TOTAL}}
        times = [now - (EAGER - i) * itl_s for i in range(EAGER)]
        self.record = SimpleNamespace(token_times=times, handoff_s=None, eager_tokens=EAGER)
        self.record.relay_stop_reason = None
        self.record.decode_server, self.record.fallback = "rld", None
        pdd = PddConfig(switch_pace=1.25, switch_tokens=4, switch_limit_tokens=8)
        self.p = SimpleNamespace(pdd=pdd, loads=Loads())
        self.route = SimpleNamespace(main_decode=SimpleNamespace(name="md"))
        # unconnected: the switch only reads and settles its count of unextended batches
        self.channel = HandoffChannel("md", 0, 1, self.p.loads.extending, "md")
        self.channel._count(1)  # the final handoff batch, sent
        self.sent: list[float] = list(times)  # when the client got each token
        self.rld_closed = False
        self.closed_at: int | None = None  # tokens the client had when relay decode stopped
        self.out = SimpleNamespace(emit=self.emit, finish=self.finish)

    async def emit(self, chunk, n: int) -> None:
        self.sent += [time.time()] * n

    async def finish(self) -> None:
        pass

    def check_echo(self, chunk) -> None:
        pass

    def start_drain(self, pending, md_stream, left_s: float) -> None:
        pending.cancel()
        self.drain_left_s, self.drain_started = left_s, time.time()

    def close_rld(self) -> None:
        self.rld_closed, self.closed_at = True, len(self.sent)

    @property
    def longest_gap(self) -> float:
        return max(b - a for a, b in zip(self.sent[EAGER - 1 :], self.sent[EAGER:], strict=False))


def run(req: Request, rld, md) -> bool:
    return asyncio.run(switch_streams(req, rld, req.close_rld, md))


def test_a_faster_main_decode_takes_over_once_it_caught_up_with_the_client():
    req = Request(itl_s=0.06)
    ended_on_rld = run(req, stream(EAGER + 1, 0.06), stream(EAGER - 4, 0.015))
    assert not ended_on_rld and req.rld_closed and req.record.decode_server == "md"
    assert req.tokens == [100 + i for i in range(TOTAL)]
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)
    assert req.longest_gap < 3 * 0.06  # the stream slowed at most, never stopped
    # the record says when and why relay decode stopped: main decode held, or at its
    # pace would have in time, what the router held (not the limit: it caught up)
    assert req.record.relay_stop_reason in (RelayStop.CAUGHT_UP, RelayStop.IN_TIME)
    assert req.record.relay_stopped is not None


def test_a_main_decode_slower_than_relay_decode_still_takes_over_without_one_stall():
    """It would never catch up: relay decode stops once main decode has decoded
    switch_limit_tokens, and the client's wait for main decode is spread over the
    tokens still queued instead of one stall when they run out."""
    req = Request(itl_s=0.05)
    ended_on_rld = run(req, stream(EAGER + 1, 0.05), stream(EAGER - 6, 0.12))
    assert not ended_on_rld and req.rld_closed and req.record.decode_server == "md"
    assert req.tokens == [100 + i for i in range(TOTAL)]
    after = req.sent[req.closed_at - 1 :]  # from relay decode's stop
    gaps = [b - a for a, b in zip(after, after[1:], strict=False)]
    waited = len(gaps) and after[-1] - after[0]
    # main decode was ~20 tokens (2.4 s) behind what the router held at the stop: one
    # stall would be most of that; spread, no gap is more than a few even shares
    assert len(gaps) >= 10 and max(gaps) < 0.3 * waited
    assert req.record.relay_stop_reason == RelayStop.LIMIT
    assert req.record.relay_stop_md_behind >= 10
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)
    # evenly: the switch itself (the first token only main decode gave) is no longer a
    # gap than the spread ones (it was 1.3x them: the queue ran out a token early)
    first_md = req.record.eager_tokens  # relay decode gave the tokens before it
    spread = req.sent[req.closed_at - 1 : first_md]
    spread_gaps = [b - a for a, b in zip(spread, spread[1:], strict=False)]
    switch_gap = req.sent[first_md] - req.sent[first_md - 1]
    assert switch_gap <= 1.1 * statistics.median(spread_gaps)


def test_main_decodes_interval_on_its_recent_requests_paces_the_client_from_the_handoff():
    """Until main decode's pace in this request is measured, the client is served at
    the interval main decode showed on its recent requests, not relay decode's
    faster one: it does not run ahead of main decode only to wait for it later."""
    gaps = {}
    for known in (False, True):
        req = Request(itl_s=0.02)
        if known:
            req.p.loads.learn_itl("md", [i * 0.06 for i in range(10)], switched=False)
        assert not run(req, stream(EAGER + 1, 0.02), stream(EAGER - 4, 0.06))
        assert req.tokens == [100 + i for i in range(TOTAL)]
        gaps[known] = req.longest_gap
    assert gaps[True] < 1.6 * 0.06 < gaps[False]


def test_waiting_for_a_main_decode_still_behind_counts_as_the_handoff_gap():
    """Relay decode dies right after the handoff: the client waits for main decode
    to reach it, and that wait is the handoff's gap."""
    req = Request(itl_s=0.05)
    ended_on_rld = run(req, stream(EAGER + 1, 0.05, die_after=EAGER), stream(EAGER - 10, 0.06))
    assert not ended_on_rld and req.record.decode_server == "md"
    assert req.tokens == [100 + i for i in range(TOTAL)]
    assert req.longest_gap >= 8 * 0.06  # ten tokens behind main decode's first chunk
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)


async def steps(first: int, seconds: list[float]):
    """Chunks with counts ``first``..TOTAL, the i-th after ``seconds[i]`` (the last
    repeats)."""
    for i, count in enumerate(range(first, TOTAL + 1)):
        await asyncio.sleep(seconds[min(i, len(seconds) - 1)])
        yield chunk(count)


def test_relay_decode_serves_the_client_through_main_decodes_slow_first_steps():
    """Main decode's first chunk after the final extend has every token the client
    has, but its next steps, with the request new in its batch, run slow: relay decode
    keeps serving the client through them (stopped at that first chunk, the client
    waited a slow step of main decode's, three of relay decode's intervals)."""
    req = Request(itl_s=0.05)
    slow_start = [0.01, 0.15, 0.15, 0.03]  # first chunk at once, two slow steps, then fast
    assert not run(req, stream(EAGER + 1, 0.05), steps(EAGER, slow_start))
    assert req.tokens == [100 + i for i in range(TOTAL)] and req.record.decode_server == "md"
    # the first gap is the stand-in's own two intervals (the last eager token one
    # interval before the switch, relay decode's next one after); stopped at main
    # decode's first chunk, the client then waited 0.15 s, then 0.21 s
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)
    assert req.longest_gap < 2.5 * 0.05
    later = [b - a for a, b in zip(req.sent[EAGER:], req.sent[EAGER + 1 :], strict=False)]
    assert max(later) < 1.6 * 0.05  # never slower than the paced relay stream (1.25x)


def test_relay_decode_that_will_end_the_request_first_is_not_paced_at_main_decodes():
    """Relay decode (fast) has the rest of the request decoded long before a slower main
    decode could reach ``switch_limit_tokens``: no switch can happen, so the client
    keeps relay decode's rhythm (paced at main decode's interval, every token of the
    rest came 1.25 x 0.1 s apart). With a lower limit main decode would take over, and
    the same streams are paced."""
    gaps = {}
    for limit in (48, 8):
        req = Request(itl_s=0.03)
        req.p.pdd = PddConfig(switch_pace=1.25, switch_tokens=4, switch_limit_tokens=limit)
        req.p.loads.learn_itl("md", [i * 0.1 for i in range(10)], switched=False)
        ended_on_rld = run(req, stream(EAGER + 1, 0.03), stream(EAGER - 2, 0.1))
        assert req.tokens == [100 + i for i in range(TOTAL)]
        assert ended_on_rld == (limit == 48)
        # past the first gap (the stand-in's own two intervals: see the test above)
        later = [b - a for a, b in zip(req.sent[EAGER:], req.sent[EAGER + 1 :], strict=False)]
        gaps[limit] = statistics.median(later)
    assert gaps[48] < 1.5 * 0.03 < 0.1 < gaps[8]


def test_relay_decode_that_will_end_the_request_is_not_paced_while_main_decode_is_busy():
    """As above (relay decode ends the request before main decode could take it over),
    but another room's batch is pending on main decode all along: its pause needs no
    cushion, since no switch will come, so the client keeps relay decode's rhythm
    (hetero run 182143: paced at 1.25x main decode's interval, 143 ms a token against
    relay decode's 82 ms)."""
    req = Request(itl_s=0.03)
    req.p.pdd = PddConfig(switch_pace=1.25, switch_tokens=4, switch_limit_tokens=48)
    req.p.loads.learn_itl("md", [i * 0.1 for i in range(10)], switched=False)
    req.p.loads.extending["md"] += 1  # another room's batch, never extended meanwhile
    assert run(req, stream(EAGER + 1, 0.03), stream(EAGER - 2, 0.1))  # ended on relay
    assert req.tokens == [100 + i for i in range(TOTAL)]
    # past the first gap (the stand-in's own two intervals), none held back
    later = [b - a for a, b in zip(req.sent[EAGER:], req.sent[EAGER + 1 :], strict=False)]
    assert max(later) < 2 * 0.03, [round(g, 3) for g in later]


def test_relay_decode_that_ends_the_request_before_main_decode_reaches_the_client_is_not_stopped():
    """Relay decode ran ahead unpaced (it looked sure to end the request first), then
    slowed (hetero: its batch grew) and main decode reached ``switch_limit_tokens`` 16
    tokens behind the client. Stopped at the limit, the client would wait about 1.6 s for
    main decode (hetero run 084227: 5.8 and 7.9 s); relay decode ends the request in two
    of its slow steps instead."""
    req = Request(itl_s=0.03)
    req.p.pdd = PddConfig(switch_pace=1.25, switch_tokens=4, switch_limit_tokens=12)
    req.p.loads.learn_itl("md", [i * 0.1 for i in range(10)], switched=False)
    relay = steps(EAGER + 1, [0.03] * 25 + [0.3])  # count 37 at 0.75 s, then 0.3 s a token
    started = time.time()
    ended_on_rld = run(req, relay, stream(EAGER - 2, 0.1))  # the limit at 1.3 s, count 22
    assert ended_on_rld and not req.rld_closed and req.record.relay_stop_reason is None
    # main decode finishes the request in the background: when it is expected to end
    # (what the router's mirror of its cache waits for) is when its stream would
    md_ends = started + (TOTAL - (EAGER - 2) + 1) * 0.1
    assert req.drain_started + req.drain_left_s == pytest.approx(md_ends, abs=0.35)
    assert req.tokens == [100 + i for i in range(TOTAL)]
    assert req.longest_gap < 0.4  # relay decode's slow steps, no wait for main decode
    # those steps are relay decode's inter-token intervals, not the switch's gaps: the
    # handoff's is the first after it (the stand-in's own two intervals, see above)
    assert req.record.handoff_s == pytest.approx(req.sent[EAGER] - req.sent[EAGER - 1], abs=0.02)
    assert req.record.handoff_s < 0.15


def test_relay_decode_stops_only_once_main_decode_holds_the_clients_next_token():
    """Main decode reaches the client's count and then stalls a step (another request's
    extend in its batch): relay decode keeps serving the client through the stall
    until main decode has decoded past it. Stopped when main decode merely had every
    token the client had, the client waited out the stall (0.33 s here; 162 ms in
    default run 023756, at an inter-token P50 of 45 ms)."""
    req = Request(itl_s=0.05)
    stall = [0.01, 0.01, 0.01, 0.25, 0.02]  # counts EAGER-2..EAGER fast, then a stall
    assert not run(req, stream(EAGER + 1, 0.05), steps(EAGER - 2, stall))
    assert req.tokens == [100 + i for i in range(TOTAL)] and req.record.decode_server == "md"
    assert req.closed_at > EAGER + 1  # relay decode served through the stall
    # the first gap is the stand-in's own two intervals (see above); none longer after it
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)
    assert req.longest_gap < 2.5 * 0.05


async def bunched(first: int, step_s: float, burst: int):
    """Chunks with counts ``first``..TOTAL decoded one every ``step_s`` but arriving
    ``burst`` at a time (main decode's stream across the WAN: a segment held back holds
    back the ones behind it)."""
    count = first
    while count <= TOTAL:
        await asyncio.sleep(burst * step_s)
        for c in range(count, min(count + burst, TOTAL + 1)):
            yield chunk(c)
        count += burst


def test_main_decodes_pace_is_not_measured_from_a_burst_of_its_chunks():
    """Main decode (0.08 s a token) is slower than relay decode (0.05 s), and its chunks
    cross a 0.4 s round trip in bursts of five. Timed chunk by chunk, a burst looks like
    no time a token: relay decode was stopped "in time" at main decode's first burst,
    and the client then waited for main decode's real pace (hetero runs 144348 and
    161028: 1.4 and 4.9 s; here 0.84 s). Measured over a round trip, the pace is main
    decode's: relay decode serves the client until the limit, and the longest wait is
    a burst's period (once main decode serves, its tokens come as they arrive)."""
    req = Request(itl_s=0.05)
    req.p.pdd = PddConfig(
        switch_pace=1.25, switch_tokens=4, switch_limit_tokens=8, wan_one_way_s=0.2
    )
    run(req, stream(EAGER + 1, 0.05), bunched(EAGER - 2, 0.08, 5))
    assert req.tokens == [100 + i for i in range(TOTAL)]
    assert req.record.relay_stop_reason != RelayStop.IN_TIME
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)
    assert req.longest_gap < 1.25 * 5 * 0.08


def test_at_the_limit_relay_decode_streams_on_while_its_stop_would_stall_the_client():
    """Main decode (0.06 s a token) is faster than relay decode (0.1 s) but starts ten
    tokens behind and is seven behind the client at ``switch_limit_tokens`` (nothing
    queued: relay decode is slower than the paced interval). Stopped there, the client
    would wait about 0.45 s for one token (hetero run 004052: 0.9 s, main decode five
    tokens behind across the WAN); relay decode streams on until main decode is close
    enough for the wait, spread over the queued tokens, to stay short."""
    req = Request(itl_s=0.1)
    # the limit at 12 tokens (0.72 s); close enough before twice that, where it stops anyway
    req.p.pdd = PddConfig(switch_pace=1.25, switch_tokens=4, switch_limit_tokens=12)
    ended_on_rld = run(req, stream(EAGER + 1, 0.1), stream(EAGER - 10, 0.06))
    assert not ended_on_rld and req.rld_closed and req.record.decode_server == "md"
    assert req.tokens == [100 + i for i in range(TOTAL)]
    # past the first gap (the stand-in's own two intervals): relay decode's steps, and
    # once main decode is close enough, its wait spread at most 2 x the paced interval
    # (1.25 x 0.06 s) a token; stopped at the limit, one gap of about 0.45 s
    later = [b - a for a, b in zip(req.sent[EAGER:], req.sent[EAGER + 1 :], strict=False)]
    assert max(later) < 0.25
    assert req.record.handoff_s == pytest.approx(req.longest_gap, abs=0.02)


def test_relay_decode_streams_on_while_main_decode_is_about_to_extend_another_room():
    """Main decode catches up with the client at once, but another room's handoff batch
    is on its way there (``Loads.extending``), and its extend pauses main decode's batch
    for 0.5 s. Stopped once main decode held the client's next token, the client waited
    out that pause (hetero run 004052: 2.9 s); relay decode serves the client until main
    decode has extended the other room's batch, and the client never waits."""
    req = Request(itl_s=0.05)
    paused = [0.01] * 3 + [0.04] * 3 + [0.5, 0.02]  # a little ahead, then the pause

    async def other_room():
        req.p.loads.extending["md"] += 1  # its batch, sent to main decode
        await asyncio.sleep(0.56)
        req.p.loads.extending["md"] -= 1  # extended: its stream shows main decode past it

    async def both():
        other = asyncio.ensure_future(other_room())
        await asyncio.sleep(0)
        ended = await switch_streams(
            req, stream(EAGER + 1, 0.05), req.close_rld, steps(EAGER - 2, paused)
        )
        await other
        return ended

    started = time.time()
    assert not asyncio.run(both())
    assert req.tokens == [100 + i for i in range(TOTAL)] and req.record.decode_server == "md"
    assert req.record.relay_stopped - started > 0.5  # not before the other room's extend
    assert req.longest_gap < 2.5 * 0.05
    assert req.p.loads.extending["md"] == 0  # this room's own batch counted off as extended


def test_a_client_ahead_of_relay_decode_keeps_a_cushion_while_main_decode_is_about_to_pause():
    """Main decode runs ahead of relay decode from the start, but another room's batch is
    pending there, so relay decode streams on. Served at main decode's pace, the client
    would run six tokens ahead of relay decode, then wait out main decode's 0.6 s extend
    until relay decode caught up (old code: a 0.36 s gap; hetero run 075106: 1.38 s).
    Kept at relay decode's rhythm, main decode's lead lasts through the pause."""
    req = Request(itl_s=0.06)

    async def other_room():
        req.p.loads.extending["md"] += 1
        await asyncio.sleep(0.66)
        req.p.loads.extending["md"] -= 1

    async def both():
        other = asyncio.ensure_future(other_room())
        await asyncio.sleep(0)
        md = steps(EAGER + 1, [0.01] * 6 + [0.6, 0.01])
        ended = await switch_streams(req, stream(EAGER + 1, 0.06), req.close_rld, md)
        await other
        return ended

    assert not asyncio.run(both())
    assert req.tokens == [100 + i for i in range(TOTAL)] and req.record.decode_server == "md"
    assert req.longest_gap < 2.5 * 0.06
    assert req.record.handoff_s <= req.longest_gap


def test_a_main_decode_expected_faster_leaves_the_client_at_relay_decodes_rhythm():
    """Main decode's recent requests ran at 0.03 s a token, relay decode's at 0.06, and
    main decode's first chunk comes 0.5 s after the handoff (its extend, the WAN): until
    then the client keeps relay decode's rhythm. Paced at 1.25x relay decode's interval
    (hetero run 041406: 0.5 s gaps for four seconds where relay decode gave one every
    0.4), the handoff slowed the stream for nothing."""
    req = Request(itl_s=0.06)
    req.p.loads.learn_itl("md", [i * 0.03 for i in range(10)], switched=False)
    started = time.time()
    assert not run(req, stream(EAGER + 1, 0.06), steps(EAGER + 4, [0.5, 0.03]))
    assert req.tokens == [100 + i for i in range(TOTAL)]
    before_md = [t for t in req.sent[EAGER:] if t < started + 0.45]
    gaps = [b - a for a, b in zip(before_md, before_md[1:], strict=False)]
    assert len(gaps) >= 4 and statistics.median(gaps) < 1.12 * 0.06
