"""Which requests decode holds back for a prefix on its way (no servers: SGLang's queues
and radix tree are stood in for by plain objects; the real path runs in
tests/testbed/test_prefix_wait.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine_patches.kv_transfer import prefix_wait
from engine_patches.kv_transfer.prefix_wait import PrefixWait
from protocol.kv import holds_back
from protocol.rooms import TIME_BITS, is_dual_path, new_room, routed_before, with_after

SHARED = list(range(100, 1124))  # a 1024-token system prompt


def test_a_request_whose_uncached_prompt_is_mostly_on_its_way_waits():
    prompt = SHARED + list(range(5000, 5300))  # lacks 1324, 1024 of them coming
    assert holds_back(prompt, 0, [SHARED[:10], SHARED + [7, 8, 9]]) == (1024, 1)


def test_what_the_cache_already_holds_is_not_waited_for():
    prompt = SHARED + list(range(5000, 5300))
    # the prefix is cached: the other request brings nothing more of it
    assert holds_back(prompt, 1024, [SHARED + [7, 8, 9]])[0] == 0
    # half cached, the rest coming (512 of the 812 lacked): waits for those
    assert holds_back(prompt, 512, [SHARED])[0] == 512


def test_a_small_share_of_what_is_lacked_is_sent_again_rather_than_waited_for():
    prompt = SHARED[:100] + list(range(5000, 6000))  # 100 of 1100 coming
    assert holds_back(prompt, 0, [SHARED])[0] == 0
    a_quarter = SHARED[:256] + list(range(5000, 5768))
    assert holds_back(a_quarter, 0, [SHARED])[0] == 256


def test_less_than_half_coming_is_waited_for_where_waiting_ends_sooner():
    """Hetero run 061253: a turn lacking 2,976 tokens, 1,440 of them in its session's
    previous turn on its way, sent all of it beside that one (the rule was half)."""
    previous = SHARED + list(range(5000, 5416))  # 1440 tokens
    turn = previous + list(range(7000, 8536))  # 2976 tokens
    assert holds_back(turn, 0, [previous]) == (1440, 0)


def test_a_transfer_carrying_much_more_than_a_request_needs_is_not_waited_for():
    """Beside a 5,000-token transfer a 300-token request ends after twice its own bytes;
    waiting for the other's 5,000 first would take far longer, however much it shares."""
    prompt = SHARED[:200] + list(range(5000, 5100))
    huge = SHARED + list(range(6000, 9976))
    assert holds_back(prompt, 0, [huge])[0] == 0
    assert holds_back(prompt, 0, [huge[:250]]) == (200, 0)  # the other lacks little
    # a prompt whose KV has arrived (not yet in the cache) leaves nothing on the line
    assert holds_back(prompt, 0, [], arrived=[huge]) == (200, 0)
    assert holds_back(prompt, 0, [SHARED[:10]], arrived=[huge]) == (200, 1)


def test_less_than_a_page_is_not_waited_for():
    prompt = SHARED[:10] + [1, 2]
    assert holds_back(prompt, 0, [SHARED[:10] + [5]], page_size=16)[0] == 0
    assert holds_back(prompt, 0, [SHARED[:10] + [5]], page_size=1)[0] == 10


def test_nothing_on_its_way_nothing_to_wait_for():
    assert holds_back(SHARED, 0, [])[0] == 0


def _queue(waiting: list[list[int]], in_transfer: list[list[int]], transferred=()):
    """Stand-ins for SGLang's prealloc queue, transfer queue and scheduler."""

    def decode_req(rid, ids):
        return SimpleNamespace(
            req=SimpleNamespace(rid=rid, origin_input_ids=ids, bootstrap_room=rid),
            is_rebootstrap=False,
        )

    return SimpleNamespace(
        tree_cache=SimpleNamespace(page_size=1),
        queue=[decode_req(f"w{i}", ids) for i, ids in enumerate(waiting)],
        transfer_queue=SimpleNamespace(
            queue=[decode_req(f"t{i}", ids) for i, ids in enumerate(in_transfer)]
        ),
        scheduler=SimpleNamespace(
            waiting_queue=[SimpleNamespace(origin_input_ids=ids) for ids in transferred]
        ),
    )


@pytest.fixture
def empty_tree(monkeypatch):
    monkeypatch.setattr(prefix_wait, "_cached_tokens", lambda tree, req: 0)


def test_the_first_of_several_openings_goes_and_the_others_wait_for_it(empty_tree):
    openings = [SHARED + [i] * 50 for i in range(4)]
    held, rest = PrefixWait(60).split(_queue(openings, []))
    assert [r.req.rid for r in rest] == ["w0"]
    assert [r.req.rid for r in held] == ["w1", "w2", "w3"]


def test_requests_wait_for_kv_in_transfer_or_transferred_not_yet_cached(empty_tree):
    q = _queue([SHARED + [1], [9] * 300], in_transfer=[SHARED + [2]])
    held, rest = PrefixWait(60).split(q)
    assert [r.req.rid for r in held] == ["w0"] and [r.req.rid for r in rest] == ["w1"]
    q = _queue([SHARED + [1]], [], transferred=[SHARED + [3]])
    held, _ = PrefixWait(60).split(q)
    assert [r.req.rid for r in held] == ["w0"]


def test_a_request_waits_at_most_its_bound(empty_tree, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    wait, q = PrefixWait(5.0), _queue([SHARED + [1]], in_transfer=[SHARED + [2]])
    assert len(wait.split(q)[0]) == 1
    now[0] += 4.9
    assert len(wait.split(q)[0]) == 1
    now[0] += 0.2  # past 5 s: preallocated as usual, the prefix sent again
    held, rest = wait.split(q)
    assert not held and len(rest) == 1 and not wait.since


def test_the_hook_puts_held_requests_back_first_in_line(empty_tree):
    q = _queue([SHARED + [1], [9] * 300], in_transfer=[SHARED + [2]])
    q._pdd_prefix_wait = PrefixWait(60)
    seen = []

    def original(queue):  # SGLang's pop_preallocated: takes whatever it is shown
        seen.append([r.req.rid for r in queue.queue])
        queue.queue = []
        return ["popped"]

    assert prefix_wait._pop_preallocated_around(original, q) == ["popped"]
    assert seen == [["w1"]]
    assert [r.req.rid for r in q.queue] == ["w0"]


def test_a_request_that_waited_its_most_is_not_held_again_while_it_stays_queued(
    empty_tree, monkeypatch
):
    """Released at its bound, it may stay queued (its handshake with prefill still
    going): held again with a fresh clock it could wait past the late-leg timeout."""
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    wait, q = PrefixWait(5.0), _queue([SHARED + [1]], in_transfer=[SHARED + [2]])
    assert len(wait.split(q)[0]) == 1
    now[0] += 5.1
    for _ in range(3):  # still queued, the prefix still coming: goes on as usual
        held, rest = wait.split(q)
        assert not held and len(rest) == 1
        now[0] += 1.0
    q.queue = []  # SGLang preallocated it: forgotten
    wait.split(q)
    assert not wait.expired


def test_a_request_aborted_while_held_is_forgotten(empty_tree):
    """A held request that leaves the queue without being let go (aborted: SGLang drops
    it from the prealloc queue) leaves no entry behind."""
    wait, q = PrefixWait(60), _queue([SHARED + [1], SHARED + [3]], in_transfer=[SHARED + [2]])
    assert len(wait.split(q)[0]) == 2 and set(wait.since) == {"w0", "w1"}
    q.queue = q.queue[1:]  # w0 aborted
    wait.split(q)
    assert set(wait.since) == {"w1"}


def test_the_prefix_cache_is_matched_only_for_a_prompt_that_could_wait(monkeypatch):
    matched = []
    monkeypatch.setattr(
        prefix_wait, "_cached_tokens", lambda tree, req: matched.append(req.rid) or 0
    )
    q = _queue([SHARED + [1], SHARED[:100] + [9] * 1000], in_transfer=[SHARED + [2]])
    PrefixWait(60).split(q)
    assert matched == ["w0"]  # w1: 100 of 1100 coming, no wait whatever the cache holds


def test_a_request_waits_only_for_kv_routed_before_it(empty_tree):
    """Main decode may take a later-routed request's leg first; the first request, its
    own KV ready, must not wait for that one's (still at prefill: default run 025010,
    held 5 s). KV that has arrived, not yet merged, is waited for whoever sent it."""
    first, second = new_room(routed_us=1_000), new_room(routed_us=1_002)
    assert routed_before(first, second) and not routed_before(second, first)
    assert routed_before(first, 12345) is None  # a random room says nothing
    q = _queue([SHARED + [1]], in_transfer=[SHARED + [2]])
    q.queue[0].req.bootstrap_room = first
    q.transfer_queue.queue[0].req.bootstrap_room = second
    held, rest = PrefixWait(60).split(q)
    assert not held and len(rest) == 1  # the later one's KV: not waited for
    q.transfer_queue.queue[0].req.bootstrap_room, q.queue[0].req.bootstrap_room = first, second
    assert len(PrefixWait(60).split(q)[0]) == 1  # the earlier one's: waited for
    q = _queue([SHARED + [1]], [], transferred=[SHARED + [3]])
    q.queue[0].req.bootstrap_room = first
    assert len(PrefixWait(60).split(q)[0]) == 1  # arrived: waited for, routed before or not


def test_rooms_compare_across_the_clocks_wrap():
    last = (1 << TIME_BITS) - 1  # the routing clock's last microsecond before it wraps
    assert routed_before(new_room(routed_us=last), new_room(routed_us=last + 5))
    assert not routed_before(new_room(routed_us=last + 5), new_room(routed_us=last))
    assert is_dual_path(new_room(dual_path=True)) and not is_dual_path(new_room())


def test_a_request_routed_first_but_queued_behind_holds_the_later_one(empty_tree):
    """Main decode may take two legs in another order than the router sent them: the
    later-routed one, queued first, waits for the earlier one's KV as the router predicted
    (without the order, it went at once and sent the shared prefix again)."""
    first, second = new_room(routed_us=1_000), new_room(routed_us=1_002)
    q = _queue([SHARED + [2], SHARED + [1]], [])
    q.queue[0].req.bootstrap_room, q.queue[1].req.bootstrap_room = second, first
    held, rest = PrefixWait(60).split(q)
    assert [r.req.bootstrap_room for r in held] == [second]
    assert [r.req.bootstrap_room for r in rest] == [first]


def _naming(q, i: int, room: int):
    """The router named ``room`` in the ``i``-th queued request (protocol.rooms)."""
    body = with_after({"sampling_params": {}}, room, "/generate")
    q.queue[i].req.sampling_params = SimpleNamespace(**body["sampling_params"])


def test_a_request_waits_a_while_for_the_room_the_router_named_before_it_arrives(
    empty_tree, monkeypatch, caplog
):
    """The third opening turn of default run 030404 reached main decode 40 ms before the
    first, which the router predicted it held for: with nothing on its way yet, it sent
    its whole 10 MB beside the first's. Named, it waits for that room to arrive (at most
    ``ARRIVAL_S``), and then for its KV as any held request does; MD's log says each
    reason once."""
    caplog.set_level("INFO", logger="pdd.prefix_wait")
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    first, third = new_room(routed_us=1_000), new_room(routed_us=1_001)
    wait, q = PrefixWait(60), _queue([SHARED + [3]], [])
    q.queue[0].req.bootstrap_room = third
    _naming(q, 0, first)
    assert len(wait.split(q)[0]) == 1  # the named room has not reached decode
    q.queue.append(_queue([SHARED + [1]], []).queue[0])  # it has now, queued behind
    q.queue[1].req.bootstrap_room, q.queue[1].req.rid = first, "first"
    held, rest = wait.split(q)
    assert [r.req.bootstrap_room for r in held] == [third] and len(rest) == 1
    q.queue.pop()  # preallocated: its KV on the wire now
    q.transfer_queue.queue.append(
        SimpleNamespace(
            req=SimpleNamespace(rid="t", origin_input_ids=SHARED + [1], bootstrap_room=first)
        )
    )
    assert len(wait.split(q)[0]) == 1  # waits for that KV, as any held request
    q.transfer_queue.queue.clear()  # in the cache (a stand-in tree matching nothing here)
    assert not wait.split(q)[0]  # the room has been here: nothing more to wait for
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and f"waits for room {first}" in said[0]
    assert "tokens on their way" in said[1]


def test_a_named_room_that_never_comes_is_waited_for_only_its_arrival_bound(
    empty_tree, monkeypatch
):
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    wait, q = PrefixWait(60), _queue([[9] * 300], [])
    _naming(q, 0, new_room())
    assert len(wait.split(q)[0]) == 1
    now[0] += prefix_wait.ARRIVAL_S
    held, rest = wait.split(q)
    assert not held and len(rest) == 1  # preallocated as usual: nothing else to wait for


def test_a_request_the_router_bounded_waits_no_longer_than_that(empty_tree, monkeypatch, caplog):
    """Hetero run 061253: a P->MD turn waited 76 s for its session's previous turn, whose
    transfer stalled on the wire (its TTFT 89 s). The router names the longest MD may
    hold a P->MD request (``protocol.rooms.hold_bound``); past it the request goes on its
    own and is never held again, while one without a bound keeps MD's."""
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    wait, q = PrefixWait(60), _queue([SHARED + [1], SHARED + [2]], [SHARED + [0]])
    body = with_after({"sampling_params": {}}, None, "/generate", hold_s=2.0)
    q.queue[0].req.sampling_params = SimpleNamespace(**body["sampling_params"])
    assert len(wait.split(q)[0]) == 2  # both share the prefix on the wire
    now[0] += 2.0
    with caplog.at_level("INFO", logger="pdd.prefix_wait"):
        held, rest = wait.split(q)
    assert [r.req.rid for r in rest] == ["w0"] and [r.req.rid for r in held] == ["w1"]
    assert "room w0 goes on after 2.0 s held" in caplog.text  # counted in MD's log
    now[0] += 1.0
    assert [r.req.rid for r in wait.split(q)[1]] == ["w0"]  # not held again
    now[0] += 57.0
    assert len(wait.split(q)[1]) == 2  # MD's own bound


def test_the_routers_bound_stretches_while_the_kv_held_for_still_comes(
    empty_tree, monkeypatch, caplog
):
    """The router's bound is its prediction of when the KV held for is in; default run
    bench-default-20261207-202124 had a turn go on 0.3 s before its session's previous
    turn's 6.4 MB landed late (five retransmissions), and prefill sent all 6.9 MB of its
    prompt again behind it. While that KV still comes (its receiver says: not ended,
    not stalled) the hold goes on, at most twice the bound and never past MD's own; a
    stalled one is not waited for past the bound."""
    caplog.set_level("INFO", logger="pdd.prefix_wait")
    now = [1000.0]
    monkeypatch.setattr(prefix_wait.time, "monotonic", lambda: now[0])
    coming = {"yes": True}
    asked = []

    def still_coming(quiet_s):
        asked.append(quiet_s)
        return coming["yes"]

    def bounded_queue():
        q = _queue([SHARED + [1]], [SHARED + [0]])
        body = with_after({"sampling_params": {}}, None, "/generate", hold_s=2.0)
        q.queue[0].req.sampling_params = SimpleNamespace(**body["sampling_params"])
        q.transfer_queue.queue[0].kv_receiver = SimpleNamespace(still_coming=still_coming)
        return q

    wait, q = PrefixWait(60, quiet_s=0.5), bounded_queue()
    assert len(wait.split(q)[0]) == 1
    now[0] += 2.5  # past the router's 2 s, the KV still coming: held
    assert len(wait.split(q)[0]) == 1 and asked[-1] == 0.5
    assert "holds past the router's 2.0 s" in caplog.text
    now[0] += 1.5  # 4 s: twice the bound, its most
    held, rest = wait.split(q)
    assert not held and len(rest) == 1
    assert "goes on after 4.0 s held (its most)" in caplog.text

    wait, q = PrefixWait(60, quiet_s=0.5), bounded_queue()
    assert len(wait.split(q)[0]) == 1
    coming["yes"] = False  # stalled on the wire: the bound holds
    now[0] += 2.0
    assert not wait.split(q)[0]

    wait, q = PrefixWait(3.0, quiet_s=0.5), bounded_queue()
    coming["yes"] = True
    assert len(wait.split(q)[0]) == 1
    now[0] += 3.0  # MD's own bound (3 s) before twice the router's
    assert not wait.split(q)[0]
