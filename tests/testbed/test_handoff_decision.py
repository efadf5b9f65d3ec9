"""The handoff decision on its own (no servers): every branch of PDD.md's rules."""

from __future__ import annotations

from protocol.names import HandoffMode
from testbed.router.handoff_decision import (
    Action,
    HandoffState,
    Knobs,
    decide,
    pinned_mode,
    settle_batches,
)

K = Knobs(catch_up_threshold=64, catch_up_done=8, rld_busy_requests=4, min_remaining_tokens=2)


def state(**kw) -> HandoffState:
    base = dict(eager=10, handed=0, remaining=100, md_holds_kv=True)
    return HandoffState(**{**base, **kw})


def test_nothing_moves_before_main_decode_holds_the_kv():
    d = decide(state(md_holds_kv=False), K)
    assert d.action is Action.WAIT and d.mode is None


def test_few_pending_tokens_go_one_shot_and_final():
    d = decide(state(eager=10), K)  # 9 pending (the first token came from prefill)
    assert (d.action, d.mode, d.tokens) == (Action.FINAL, HandoffMode.ONE_SHOT, 9)


def test_many_pending_tokens_start_a_catch_up_batch():
    d = decide(state(eager=100), K)
    assert (d.action, d.mode, d.tokens) == (Action.BATCH, HandoffMode.CATCH_UP, 64)  # bounded


def test_catch_up_waits_for_the_batch_in_flight_then_ends_when_few_pend():
    s = state(eager=110, handed=99, mode=HandoffMode.CATCH_UP, batch_in_flight=True)
    assert decide(s, K).action is Action.WAIT
    s = state(eager=110, handed=99, mode=HandoffMode.CATCH_UP)  # 10 pending > 8
    assert decide(s, K).action is Action.BATCH
    s = state(eager=106, handed=99, mode=HandoffMode.CATCH_UP)  # 6 pending <= 8
    assert decide(s, K).action is Action.FINAL


def test_a_busy_relay_decode_is_freed_at_once():
    d = decide(state(eager=100, rld_load=5), K)
    assert (d.action, d.mode) == (Action.FINAL, HandoffMode.ONE_SHOT)
    # mid catch-up, load rising: the next decision hands over whatever is pending
    s = state(eager=150, handed=99, mode=HandoffMode.CATCH_UP, rld_load=5)
    assert decide(s, K).action is Action.FINAL


def test_relay_decode_finishes_a_request_about_to_end():
    d = decide(state(remaining=1), K)
    assert d.action is Action.WAIT and "about to finish" in d.why


def test_a_pinned_handoff_fires_at_its_token_even_before_the_kv_is_held():
    s = state(eager=5, md_holds_kv=False, pinned_at=9, pinned_mode=HandoffMode.ONE_SHOT)
    assert decide(s, K).action is Action.WAIT
    s = state(eager=9, md_holds_kv=False, pinned_at=9, pinned_mode=HandoffMode.ONE_SHOT)
    assert (decide(s, K).action, decide(s, K).tokens) == (Action.FINAL, 8)
    # a pinned catch-up batches while MD holds the KV, and overtakes a batch in flight
    s = state(eager=20, handed=0, pinned_at=40, pinned_mode=HandoffMode.CATCH_UP)
    assert decide(s, K).action is Action.BATCH
    s = state(eager=40, handed=30, pinned_at=40, batch_in_flight=True, mode=HandoffMode.CATCH_UP)
    assert decide(s, K).action is Action.FINAL


def test_nothing_is_sent_before_the_channel_to_main_decode_is_open():
    """A pinned handoff at token 9 met a channel whose connect was still in its SYN's
    one-second retransmission (0.1% loss on default's WAN): the router wrote to no
    connection and the request failed (a bench's warm-up, 2026-12-05). It now waits,
    and fires at the first token after the channel opens."""
    pinned = dict(md_holds_kv=False, pinned_at=9, pinned_mode=HandoffMode.ONE_SHOT)
    s = state(eager=9, channel_open=False, **pinned)
    assert decide(s, K).action is Action.WAIT and "not open" in decide(s, K).why
    assert decide(state(eager=12, **pinned), K).action is Action.FINAL
    assert decide(state(eager=80, channel_open=False), K).action is Action.WAIT


def test_pinned_mode_header():
    assert pinned_mode(None) is None and pinned_mode("") is None
    assert pinned_mode("catch-up") is HandoffMode.CATCH_UP
    assert pinned_mode("one-shot") is HandoffMode.ONE_SHOT


def test_a_busy_main_decode_takes_even_a_few_dozen_tokens_in_bounded_batches():
    k = Knobs(catch_up_threshold=64, catch_up_done=8, md_busy_requests=3, catch_up_batch=16)
    calm = decide(state(eager=41, md_load=2), k)  # 40 pending, MD calm: one-shot
    assert (calm.action, calm.mode) == (Action.FINAL, HandoffMode.ONE_SHOT)
    busy = decide(state(eager=41, md_load=5), k)  # MD busy: no 40-token extend at once
    assert (busy.action, busy.mode, busy.tokens) == (Action.BATCH, HandoffMode.CATCH_UP, 16)
    # a busy relay decode still wins: it is freed at once
    both = decide(state(eager=41, md_load=5, rld_load=9), k)
    assert (both.action, both.mode) == (Action.FINAL, HandoffMode.ONE_SHOT)
    # the final batch carries everything pending, whatever the batch bound
    end = decide(state(eager=60, handed=52, mode=HandoffMode.CATCH_UP, md_load=5), k)
    assert (end.action, end.tokens) == (Action.FINAL, 7)


def test_a_settle_hands_a_busy_main_decode_its_tokens_in_bounded_batches():
    k = Knobs(catch_up_threshold=64, md_busy_requests=2, catch_up_batch=16)
    # MD serves one other request (two with this one, parked there): not busy, one batch
    assert settle_batches(40, md_load=2, k=k) == [40]
    # more than the catch-up threshold lacking: batches even with MD calm
    assert settle_batches(70, md_load=1, k=k) == [16, 16, 16, 16, 6]
    # busier: batches of at most 16, the rest last; nothing lost or repeated
    assert settle_batches(40, md_load=3, k=k) == [16, 16, 8]
    assert settle_batches(32, md_load=6, k=k) == [16, 16]
    # a few tokens go at once even to a busy MD, as a handoff's would (catch_up_done)
    assert settle_batches(8, md_load=6, k=k) == [8]
    # nothing lacking (a two-token output): one empty final batch still ends it
    assert settle_batches(0, md_load=6, k=k) == [0]


def test_a_settle_and_a_handoff_batch_the_same_tokens_alike():
    """One predicate decides both: a settle of N lacking tokens is batched exactly
    when a handoff with N pending (and relay decode calm) would catch up."""
    k = Knobs(catch_up_threshold=20, catch_up_done=4, md_busy_requests=2, catch_up_batch=8)
    for pending in range(1, 40):
        for md_load in range(0, 5):
            handoff = decide(state(eager=pending + 1, md_load=md_load), k)
            full, rest = divmod(pending, 8)
            batches = [8] * full + [rest] * (rest > 0)
            expected = batches if handoff.mode is HandoffMode.CATCH_UP else [pending]
            assert settle_batches(pending, md_load, k) == expected, (pending, md_load)
