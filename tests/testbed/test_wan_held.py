"""A prefix on its way to main decode, as the router predicts it (no servers): MD holds a
request back while enough of what it lacks is coming in another transfer
(engine_patches.kv_transfer.prefix_wait), so the router predicts only the rest, from
when that transfer ends."""

from __future__ import annotations

import pickle
from dataclasses import replace
from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

from protocol.names import Pipeline
from protocol.records import PoolRecord
from protocol.rooms import AFTER_KEY, HOLD_KEY, after_room, hold_bound, new_room, with_after
from testbed.router.mirror import PrefixMirror
from testbed.router.policies import Loads
from testbed.router.tcp_model import INITIAL_WINDOW
from testbed.router.wan import WanLine
from tests.testbed.test_pdd_policy_unit import body, policy
from tests.testbed.wan_line import MB, Clock

SHARED = list(range(10, 1034))  # a 1024-token system prompt


def policy_with_a_prefix_on_its_way(**knobs):
    """A PDD policy whose WAN carries room 101's 1,224 tokens (``SHARED`` and 200 more)
    to main decode, and that first request's body."""
    p, first = policy(**knobs), body(0)
    first["input_ids"] = SHARED + [1] * 200
    p.wan.start(101, 1224 * 8192)
    p.mirror.coming(101, first["input_ids"], "md")
    return p, first


def test_a_transfer_held_back_for_another_starts_when_that_one_ends():
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)  # no delay, no loss: bytes alone
    line.start(1, 10 * MB)  # 1 s on the line
    beside = line.predict(MB)  # shares the line with it: 2 MB's time
    held = line.predict(MB, after=1)
    assert beside.seconds == pytest.approx(0.2) and beside.held_s == 0
    assert held.held_s == pytest.approx(1.0) and held.after == 1
    assert held.seconds == pytest.approx(0.1)  # the line to itself by then
    line.start(2, MB, after=1)
    assert line.due(clock(), 1) == pytest.approx(clock() + 1.0)  # 1 is not slowed by 2
    clock.now += 0.5
    assert line.predict(MB, after=1).held_s == pytest.approx(0.5)
    assert line.predict(MB, after=3).held_s == 0  # no such transfer on the line


def test_a_hold_behind_a_hold_ends_after_the_late_transfer_the_first_waits_for():
    """Hetero run 061253: turn 0 of a session was held by MD behind the opening's transfer,
    which ran late (checked out, on the wire 88 s); the model saw turn 0's bytes drained
    long before, so turn 1, held by MD for turn 0 in turn, was predicted unheld, went
    P->MD and waited 76 s. A transfer not yet checked out that is held for another
    starts once that one ends, however late it runs."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)  # no delay, no loss: bytes alone
    line.start(1, 10 * MB)  # the opening: 1 s on the line
    line.mirror(PoolRecord(1, "checkout", "p:1", "md:1", 0, 0, [], time=clock.now))
    line.start(2, MB, after=1)  # held behind it: due once 1 ends, then 0.1 s
    clock.now += 11.0  # 1 is 10 s late (still on the wire); 2 never checked out
    alone = line.predict(MB, after=2)
    assert alone.held_s == pytest.approx(10.0 + 0.1, abs=0.05)  # 1 late as long again
    # the model's view before: 2 drained long ago, 1's lateness nothing to it
    line.outstanding[2].after = None
    assert line.predict(MB, after=2).held_s == 0


def test_the_mirror_counts_a_prompt_on_its_way_and_holds_it_once_it_arrived():
    mirror = PrefixMirror()
    prompt = SHARED + [7] * 300
    mirror.coming(1, SHARED + [5] * 40)
    assert mirror.held_for(prompt, 0, rooms=[1]) == (1024, 1)
    assert mirror.held_for(prompt, 0, rooms=[]) == (0, None)  # no longer on the line
    assert mirror.held_for([5] * 100 + SHARED, 0, rooms=[1]) == (0, None)
    assert mirror.predicted_hit(prompt, None) == 0
    mirror.arrived(1, ok=True)  # MD's prefix cache took the transferred prompt
    assert mirror.predicted_hit(prompt, None) == 1024
    assert mirror.held_for(prompt, 1024, rooms=[1]) == (0, None)
    mirror.coming(2, [3] * 500)
    mirror.arrived(2, ok=False)  # a failed transfer: MD holds nothing of it
    assert mirror.predicted_hit([3] * 500, None) == 0


def test_a_request_opening_with_a_prompt_on_its_way_is_routed_on_the_rest():
    p = policy(direct_wan_bound_s=0.1)
    first = body(0)
    first["input_ids"] = SHARED + [1] * 200
    second = {**first, "input_ids": SHARED + [2] * 200}
    route = p.choose(first, Loads(), "a")
    assert route.wan.own_bytes == 1224 * 8192 and route.wan.held_s == 0
    p.wan.start(101, route.wan.own_bytes)  # the router routed it: room 101
    p.mirror.coming(101, first["input_ids"])
    route = p.choose(second, Loads(), "b")
    assert route.wan.own_bytes == 200 * 8192  # only its own tokens cross
    assert route.wan.after == 101 and route.wan.held_s > 0.5  # 10 MB at 12.5 MB/s first
    assert route.pipeline == Pipeline.P_RLD_MD and "held" in route.reason


def test_a_request_all_of_whose_lack_is_on_its_way_waits_for_that_transfer():
    """A prompt sent again while its first KV still crosses (bench_serving draws prompts
    with replacement) lacks nothing of its own, and MD holds it until that transfer ends.
    The model said 0 s: the router sent it P->MD, MD's hold ran out before the first
    transfer ended and it sent all 1152 tokens again (TTFT 5.7 s; bench-peers run
    20261207-145454)."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, clock=clock)  # no delay, no loss: bytes alone
    line.start(1, 10 * MB)  # 1 s on the line
    nothing = line.predict(0, after=1)
    assert nothing.held_s == pytest.approx(1.0) and nothing.after == 1
    assert nothing.seconds == 0 and line.predict(0).held_s == 0
    p, first = policy_with_a_prefix_on_its_way(direct_wan_bound_s=0.3)
    again = p.choose(first, Loads(), "b")
    assert again.wan.own_bytes == 0 and again.wan.after == 101 and again.md_after == 101
    assert again.wan.held_s > 0.5  # 10 MB at 12.5 MB/s first
    assert again.pipeline == Pipeline.P_RLD_MD and "held" in again.reason
    assert replace(again, pipeline=Pipeline.P_MD).md_hold_s >= again.wan.held_s


def test_a_held_transfer_checks_out_the_connection_the_one_it_waited_for_frees():
    """Decode asks for a held request's KV once the hold ends: by then the transfer it
    was held for has returned its (grown) connection to the pool; a request routed
    beside it, checked out at once, gets a new connection's window."""
    clock = Clock()
    line = WanLine(rate_bytes_s=10 * MB, one_way_s=0.05, clock=clock)
    line.start(1, 10 * MB)  # a new connection: its window grows on the way
    beside, held = line.predict(MB), line.predict(MB, after=1)
    assert beside.cwnd_bytes == INITIAL_WINDOW
    assert held.held_s > 0.9 and held.cwnd_bytes > 10 * INITIAL_WINDOW
    assert held.seconds < beside.seconds


def test_only_a_transfer_to_the_same_main_decode_holds_a_request_back():
    """With several main decode servers (scenarios/paper.yaml has four), a prefix on its
    way to one is nothing to the others: the router predicts no hold there, and names
    none."""
    mirror = PrefixMirror()
    mirror.coming(1, SHARED + [5] * 40, "md0")
    prompt = SHARED + [7] * 300
    assert mirror.held_for(prompt, 0, rooms=[1], server="md0") == (1024, 1)
    assert mirror.held_for(prompt, 0, rooms=[1], server="md1") == (0, None)
    mirror.arrived(1, ok=True)
    assert not mirror.on_its_way


def test_the_room_a_request_is_held_for_reaches_sglangs_sampling_params():
    """The router names the room in main decode's request; SGLang's own sampling params
    (what its scheduler's request carries) keep it, native or OpenAI-shaped."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    room = new_room()
    native = with_after(
        {"input_ids": [1, 2], "sampling_params": {"temperature": 0}}, room, "/generate"
    )
    params = SamplingParams(**native["sampling_params"])
    params.verify(vocab_size=4096)
    assert after_room(SimpleNamespace(sampling_params=pickle.loads(pickle.dumps(params)))) == room
    assert native["sampling_params"]["temperature"] == 0
    chat = with_after({"messages": []}, room, "/v1/chat/completions")
    assert ChatCompletionRequest(**chat, model="m").custom_params == {AFTER_KEY: room}
    assert with_after(native, None, "/generate") is native  # nothing named: as it was
    assert after_room(SimpleNamespace(sampling_params=SamplingParams())) is None
    assert hold_bound(SimpleNamespace(sampling_params=SamplingParams())) is None
    # the longest MD may hold it, beside the room or alone
    bounded = with_after({"sampling_params": {}}, room, "/generate", hold_s=2.5)
    params = pickle.loads(pickle.dumps(SamplingParams(**bounded["sampling_params"])))
    req = SimpleNamespace(sampling_params=params)
    assert after_room(req) == room and hold_bound(req) == 2.5
    alone = with_after({"messages": []}, None, "/v1/chat/completions", hold_s=0.4)
    assert ChatCompletionRequest(**alone, model="m").custom_params == {HOLD_KEY: 0.4}
    for junk in (True, "3", float("nan"), None):
        custom = SimpleNamespace(custom_params={HOLD_KEY: junk})
        assert hold_bound(SimpleNamespace(sampling_params=custom)) is None
    negative = SimpleNamespace(custom_params={HOLD_KEY: -1})
    assert hold_bound(SimpleNamespace(sampling_params=negative)) == 0.0


def test_only_a_request_whose_kv_goes_to_main_decode_names_the_transfer():
    """Relay decode never sees the room named (an RLD-only request would wait for it)."""
    p, first = policy_with_a_prefix_on_its_way(direct_wan_bound_s=0.1)
    route = p.choose({**first, "input_ids": SHARED + [2] * 200}, Loads(), "b")
    assert route.wan.after == 101 and route.md_after == 101
    assert replace(route, pipeline=Pipeline.P_MD).md_after == 101
    assert replace(route, pipeline=Pipeline.RLD_ONLY).md_after is None


def test_md_may_hold_a_p_md_request_only_as_long_as_the_router_planned_its_kv():
    """A P->MD request's client waits on main decode: the router names the longest MD may
    hold it (its predicted hold and crossing, or all it lacks crossing alone if longer);
    a relayed one streams from relay decode, and MD keeps its own bound."""
    p, first = policy_with_a_prefix_on_its_way(direct_wan_bound_s=100.0)
    held = p.choose({**first, "input_ids": SHARED + [2] * 200}, Loads(), "b")
    assert held.pipeline == Pipeline.P_MD and held.wan.after == 101
    alone = p.wan.predict(1224 * 8192).seconds  # all it lacks, had MD not held it
    assert held.wan.unheld_s == pytest.approx(alone, rel=1e-3)  # the clock moved on
    planned = held.wan.held_s + held.wan.seconds
    assert held.md_hold_s == pytest.approx(max(alone, planned), rel=1e-3)
    assert replace(held, pipeline=Pipeline.P_RLD_MD).md_hold_s is None
    lone = p.choose({**first, "input_ids": [9] * 300}, Loads(), "c")  # nothing on its way
    assert lone.wan.held_s == 0 and lone.md_hold_s == pytest.approx(lone.wan.seconds)


def test_md_holds_from_its_arrival_so_the_bound_counts_prefills_compute():
    """MD holds a request from when it has it, before prefill has computed anything: the
    bound is the crossing predicted from then (test_prefix_wait's B had its hold run
    out after 1.8 s as the prefix it waited for arrived, its prefill having taken
    0.95 s, and prefill sent the prefix again)."""
    p, first = policy_with_a_prefix_on_its_way(direct_wan_bound_s=100.0)
    before = p.choose({**first, "input_ids": SHARED + [2] * 200}, Loads(), "b")
    p.wan.lags.extend([1.0, 1.2, 1.1])  # routed to first KV byte in: prefill computed
    p.wan.leads.extend([0.1, 0.1, 0.1])  # routed to decode's checkout
    held = p.choose({**first, "input_ids": SHARED + [3] * 200}, Loads(), "c")
    assert held.wan.after == 101 and held.wan.due_s == pytest.approx(1.0)
    assert held.md_hold_s == pytest.approx(
        1.0 + max(held.wan.unheld_s, held.wan.held_s + held.wan.seconds)
    )
    # from MD's arrival, not the wire's first byte (the clock runs on: a little drained)
    assert held.md_hold_s == pytest.approx(before.md_hold_s + 1.0, abs=0.05)
