"""PDD's routing decisions from their inputs alone (no servers): the bound on the
predicted WAN time, the MD prefix mirror, and the anomalous-traffic filter."""

from __future__ import annotations

import pytest

from protocol.names import Pipeline
from testbed.router.config import PddConfig, RouterConfig, ServerEntry
from testbed.router.mirror import PrefixMirror
from testbed.router.policies import Loads, PddPolicy


def policy(**pdd) -> PddPolicy:
    servers = [
        ServerEntry(name=n, url=f"http://{n}:1", role=r, host=n, site=s)
        for n, r, s in (
            ("p", "prefill", "A"),
            ("rld", "relay_decode", "A"),
            ("md", "main_decode", "B"),
        )
    ]
    pdd_config = PddConfig(wan_rate_mbit=100, kv_bytes_per_token=8192, **pdd)
    config = RouterConfig(
        system="pdd", policy="pdd", servers=servers, records="/dev/null", pdd=pdd_config
    )
    return PddPolicy(config)


def body(n_in: int, n_out: int = 64, start: int = 0) -> dict:
    return {
        "input_ids": list(range(start, start + n_in)),
        "sampling_params": {"max_new_tokens": n_out},
    }


def test_routing_follows_the_predicted_wan_time_on_both_sides_of_the_bound():
    p = policy(direct_wan_bound_s=0.1)  # 0.1 s at 100 Mbit/s = 152 tokens of 8 KB
    below, above = p.choose(body(152), Loads()), p.choose(body(153), Loads())
    assert below.pipeline == Pipeline.P_MD and below.stream_from.name == "md"
    assert above.pipeline == Pipeline.P_RLD_MD and above.main_decode.name == "md"
    assert above.stream_from.name == "rld" and above.predicted_wan_s > 0.1


def test_the_mirror_of_mds_cache_makes_a_long_follow_up_turn_cheap():
    p = policy(direct_wan_bound_s=0.1)
    first = body(2000)
    assert p.choose(first, Loads(), "s").pipeline == Pipeline.P_RLD_MD
    p.mirror.add(first["input_ids"] + [7] * 50, "s")  # MD cached the exchange
    follow = {**first, "input_ids": first["input_ids"] + [7] * 50 + [9] * 100}
    route = p.choose(follow, Loads(), "s")
    assert route.pipeline == Pipeline.P_MD and "100 uncached" in route.reason


def test_anomalous_requests_are_finished_on_relay_decode():
    p = policy(anomalous_min_input=1000, anomalous_max_output=8)
    assert p.choose(body(1000, 8), Loads()).pipeline == Pipeline.RLD_ONLY
    assert p.choose(body(1000, 9), Loads()).pipeline == Pipeline.P_RLD_MD
    assert p.choose(body(999, 8), Loads()).pipeline == Pipeline.P_RLD_MD


def test_a_pinned_pipeline_overrides_the_policy_and_says_so():
    p = policy(direct_wan_bound_s=0.1)
    pinned = p.choose(body(2000), Loads(), pinned=Pipeline.P_MD)
    assert pinned.pipeline == Pipeline.P_MD and pinned.stream_from.name == "md"
    assert "pinned" in pinned.reason and Pipeline.P_RLD_MD in pinned.reason  # what the policy chose
    relayed = p.choose(body(10), Loads(), pinned=Pipeline.P_RLD_MD)
    assert (relayed.stream_from.name, relayed.main_decode.name) == ("rld", "md")
    with pytest.raises(ValueError, match="unknown pipeline"):
        p.choose(body(10), Loads(), pinned="P->X")
    with pytest.raises(ValueError, match="token ids"):
        p.choose({"text": "hello", "max_tokens": 4}, Loads(), pinned=Pipeline.P_RLD_MD)


def test_a_sessions_next_turn_waits_only_for_its_own_previous_turn():
    """A turn whose bookkeeping ends after the next turn arrived must still release
    that next turn (it once resolved the next turn's own future, a 30 s stall)."""
    import asyncio

    from protocol.records import RequestRecord
    from testbed.router.after import AfterRequest

    async def two_turns():
        after = AfterRequest(PddConfig(turn_wait_s=30), PrefixMirror(), None)
        first = await after.before("s")
        second = asyncio.create_task(after.before("s"))  # the next turn arrives early
        await asyncio.sleep(0.01)
        assert not second.done()  # it waits for the first turn's alignment
        record = RequestRecord(
            request_id="r", system="pdd", endpoint="/generate", arrival=0, session_id="s"
        )
        after.after(None, {}, record, first)  # no route: nothing to align
        mine = await asyncio.wait_for(second, 1.0)
        after.after(None, {}, record, mine)
        assert after.pending == {}  # a session's bookkeeping ends with its last turn

    asyncio.run(two_turns())


def test_a_next_turn_waits_for_its_previous_turn_to_settle_on_md():
    """When relay decode finished a turn, MD and then P learn its exchange off the
    client's path (settle_on_md); the session's next turn must wait for that, or P and
    MD would serve it from different caches. The settle task here is a stand-in that
    only sleeps."""
    import asyncio

    from protocol.records import RequestRecord
    from testbed.router.after import AfterRequest

    async def two_turns():
        after = AfterRequest(PddConfig(turn_wait_s=30), PrefixMirror(), None)
        first = await after.before("s")
        record = RequestRecord(
            request_id="r", system="pdd", endpoint="/generate", arrival=0, session_id="s"
        )
        settle = asyncio.create_task(asyncio.sleep(0.3))
        after.settling[id(record)] = settle
        after.after(None, {}, record, first)  # the client's stream is done
        second = asyncio.create_task(after.before("s"))
        await asyncio.sleep(0.1)
        assert not second.done()  # still settling
        await asyncio.wait_for(second, 1.0)
        assert settle.done() and after.settling == {}

    asyncio.run(two_turns())


def test_a_next_turn_stops_waiting_for_a_slow_settle_after_turn_wait_s():
    """A settle stuck behind a busy WAN must not stall the session: past turn_wait_s the
    next turn goes on (routed on what the mirror knows), while the settle runs on."""
    import asyncio

    from protocol.records import RequestRecord
    from testbed.router.after import AfterRequest

    async def two_turns():
        after = AfterRequest(PddConfig(turn_wait_s=0.05), PrefixMirror(), None)
        first = await after.before("s")
        record = RequestRecord(
            request_id="r", system="pdd", endpoint="/generate", arrival=0, session_id="s"
        )
        settle = asyncio.create_task(asyncio.sleep(5))
        after.settling[id(record)] = settle
        after.after(None, {}, record, first)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(after.before("s"), 1.0)
        waited = asyncio.get_running_loop().time() - started
        assert 0.04 <= waited < 1.0 and not settle.done()
        settle.cancel()

    asyncio.run(two_turns())


def test_a_transfer_in_flight_pushes_the_next_request_to_relay_decode():
    """Queue-aware: 100 uncached tokens alone go P->MD, sharing the line with 10 MB they
    are relayed."""
    p = policy(direct_wan_bound_s=0.1)
    assert p.choose(body(100), Loads()).pipeline == Pipeline.P_MD
    p.wan.start(room=1, nbytes=10_000_000)
    route = p.choose(body(100, start=5000), Loads())
    assert route.pipeline == Pipeline.P_RLD_MD and route.wan.queued_bytes >= 9_000_000
    # the line is shared: it pays for its own bytes and as many of the other's
    assert "behind" in route.reason and route.predicted_wan_s == pytest.approx(2 * 0.8192 / 12.5)


def test_an_overloaded_relay_decode_sends_the_request_where_ttft_is_lower():
    p = policy(direct_wan_bound_s=0.1, rld_max_requests=2, rld_step_s=0.05)
    loads = Loads()
    loads.in_flight["rld"] = 1
    assert p.choose(body(200), loads).pipeline == Pipeline.P_RLD_MD  # within its bound
    loads.in_flight["rld"] = 4  # three over: a 150 ms wait against ~131 ms on the WAN
    route = p.choose(body(200), loads)
    assert route.pipeline == Pipeline.P_MD and "P->MD is faster" in route.reason
    route = p.choose(body(2000), loads)  # 1.3 s on the WAN: relaying still wins
    assert route.pipeline == Pipeline.P_RLD_MD and "still faster" in route.reason


def test_threshold_policy_routes_by_uncached_length_alone():
    from testbed.router.policies import ThresholdPolicy

    config = policy().config.model_copy(
        update={"policy": "threshold", "pdd": PddConfig(threshold_tokens=300)}
    )
    p = ThresholdPolicy(config)
    p.wan.start(room=1, nbytes=50_000_000)  # a busy line does not change its mind
    assert p.choose(body(300), Loads()).pipeline == Pipeline.P_MD
    relayed = p.choose(body(301), Loads())
    assert relayed.pipeline == Pipeline.P_RLD_MD and relayed.wan.queued_bytes > 0
    assert p.choose(body(5000, 4), Loads()).pipeline == Pipeline.P_RLD_MD  # no anomaly filter


def test_with_relay_decode_out_of_rotation_requests_go_p_to_md():
    p = policy(direct_wan_bound_s=0.1)
    loads = Loads()
    loads.down["rld"] = "/health failed"
    route = p.choose(body(2000), loads)  # would be relayed
    assert route.pipeline == Pipeline.P_MD and "no healthy relay_decode server" in route.reason
    loads.down["md"] = "/health failed"
    with pytest.raises(LookupError, match="no healthy main_decode server"):
        p.choose(body(2000), loads)


def test_the_md_mirror_holds_no_more_than_md_can_and_forgets_the_oldest_session():
    mirror = PrefixMirror(recent=2, capacity_tokens=1000)
    a, b, c = ([k] * 400 for k in (1, 2, 3))
    mirror.add(a, "a")
    mirror.add(b, "b")
    assert mirror.predicted_hit(a + [9], "a") == 400
    mirror.add(c, "c")  # 1200 tokens > 1000: session a (least recently used) goes
    assert "a" not in mirror.by_session and mirror._tokens == 800
    assert mirror.predicted_hit(a + [9], "a") == 0  # nor among the 2 recent ones
    assert mirror.predicted_hit(b[:100] + [7], "b") == 100
    mirror.add(b + [5] * 100, "b")  # a session's next exchange replaces its last one
    assert mirror._tokens == 900 and list(mirror.by_session) == ["c", "b"]


def test_a_relayed_turn_counts_in_the_next_turns_hit_once_main_decode_cached_it():
    """A relayed turn's KV landing on MD is not MD's cache: MD's request waits, parked,
    for the handoff or the settle, and its prefix cache takes the exchange only when
    that request ends (default run 212454: a next turn routed 30 ms after its
    predecessor's 6.4 MB landed was predicted with 64 uncached tokens and routed P->MD;
    MD lacked 850 and the transfer took 2.7 s). The mirror learns it then, for every
    session; a prompt relay decode alone finished never reaches MD."""
    from testbed.router.after import AfterRequest

    p = policy(direct_wan_bound_s=0.1)
    after = AfterRequest(PddConfig(), p.mirror, None)
    first = body(2000)
    route = p.choose(first, Loads(), "s")
    assert route.pipeline == Pipeline.P_RLD_MD
    follow = {**first, "input_ids": first["input_ids"] + [9] * 100}
    assert "(2100 uncached" in p.choose(follow, Loads(), "s").reason  # routed, landed: not yet
    assert after.remember(route, first, "s", [9]) is None  # MD ended it (no P alignment here)
    assert "(100 uncached" in p.choose(follow, Loads(), "s").reason
    other = {**first, "input_ids": first["input_ids"] + [8] * 10}
    assert p.mirror.predicted_hit(other["input_ids"], "t") == 2000

    alone = body(3000, start=5000)
    p.choose(alone, Loads(), "t", pinned=Pipeline.RLD_ONLY)
    assert p.mirror.predicted_hit(alone["input_ids"], "t") == 0


def test_an_exchange_md_is_finishing_counts_once_the_next_turn_reaches_md_after_it():
    """Relay decode ended a turn's stream; MD still finishes it (a drain after the
    handoff, or a settle). MD holds the prompt and the tokens it extended now, the whole
    exchange once it ends. Routed on the exchange before, hetero run 092139 predicted
    4.3 MB for a turn whose MD lacked 0.4 MB. The next turn's request reaches MD
    ``lead_s`` after routing: what MD holds by then counts."""
    from testbed.router.after import AfterRequest

    p = policy(direct_wan_bound_s=0.1)
    after = AfterRequest(PddConfig(), p.mirror, None)
    first = body(2000)
    output = [9] * 200
    follow = {**first, "input_ids": first["input_ids"] + output + [7] * 50}
    now = p.wan.clock()
    # the prompt, t1 and 20 handed off: in MD's tree while the request runs there
    after.expect(first, "s", output, held=2021, ready_at=now + 5)
    assert "(229 uncached" in p.choose(follow, Loads(), "s").reason  # 250 - 21
    p.wan.leads.append(6.0)  # requests reach MD 6 s after routing: after MD ended it
    assert "(51 uncached" in p.choose(follow, Loads(), "s").reason  # its last token has no KV
    # another session's prompt never matches an exchange MD has not ended yet
    assert p.mirror.predicted_hit(follow["input_ids"], "t", now + 10) == 0

    after.forget(first, "s", [8] * 200)  # another exchange's failure: this one stays
    assert p.mirror.predicted_hit(follow["input_ids"], "s", now + 10) == 2199
    after.forget(first, "s", output)  # its drain failed: MD will not hold it
    assert p.mirror.predicted_hit(follow["input_ids"], "s", now + 10) == 0

    after.expect(first, "s", output, held=2021, ready_at=now + 5)
    assert after.remember(p.choose(first, Loads()), first, "s", output) is None
    assert p.mirror.expected == {}  # MD ended it: learned for good, for every session
    assert p.mirror.predicted_hit(follow["input_ids"], "t") == 2199


@pytest.mark.parametrize("md_agrees", [True, False])
def test_a_settle_is_expected_in_mds_cache_only_once_md_holds_its_kv(monkeypatch, md_agrees):
    """Relay decode finished the turn before MD held its KV: the settle gives MD the
    eager tokens once it does. Expected from the predicted landing, a next turn routed
    while the KV was late went P->MD and waited 2.8 s (default run 115030); so nothing
    is expected until MD holds the KV, then the exchange, which MD ending it confirms
    and a disagreeing MD withdraws. While parked, MD's tree holds none of it; it is
    expected after the batches' recent time to EXTENDED (hetero: 2-3 s, where a decode
    step is 0.1 s) and a step. The request and MD's stream are stand-ins (the real
    servers' settle runs in tests/testbed/test_pdd.py)."""
    import asyncio
    import json
    from types import SimpleNamespace

    import testbed.router.settle as settle_module
    from protocol.stream import Chunk
    from testbed.router.after import AfterRequest
    from testbed.router.handoff_decision import Knobs

    p = policy(direct_wan_bound_s=0.1)
    first, tokens = body(2000), [9] * 50
    answer = tokens if md_agrees else [8] * 50
    md_answers = asyncio.Event()

    async def md_stream(_):
        await md_answers.wait()
        data = {"output_ids": answer, "meta_info": {"completion_tokens": len(answer)}}
        data["meta_info"]["finish_reason"] = {"type": "length"}
        yield Chunk.parse(f"data: {json.dumps(data)}")

    async def handoff(batch, final):
        return 0

    async def scenario():
        loop = asyncio.get_running_loop()
        md = loop.create_future()
        md.set_result(None)
        loads = Loads()
        loads.itl["md"], loads.extend_s["md"] = 0.1, 3.0
        req = SimpleNamespace(
            p=SimpleNamespace(
                pdd=PddConfig(settle_timeout_s=5),
                knobs=Knobs(),  # 48 tokens lacking, MD idle: one final batch
                loads=loads,
                after=AfterRequest(PddConfig(), p.mirror, None),
            ),
            route=SimpleNamespace(main_decode=SimpleNamespace(name="md", transfer_log=None)),
            record=SimpleNamespace(room=1, session_id="s"),
            ready=loop.create_future(),
            inflight=None,
            handed=0,
            md=md,
            body=first,
            channel=SimpleNamespace(handoff=handoff, extend_seen=lambda: None),
            release=lambda: None,
        )
        settling = asyncio.create_task(settle_module.settle(req, tokens))
        await asyncio.sleep(0.3)
        assert p.mirror.expected == {}  # the KV is still on its way
        req.ready.set_result(None)
        await asyncio.sleep(0.05)
        expected = p.mirror.expected["s"]
        assert len(expected.ids) == 2049  # MD holds the KV: expected
        follow = first["input_ids"] + tokens + [7] * 10
        assert p.mirror.predicted_hit(follow, "s") == 0  # parked: not in MD's tree yet
        assert expected.ready_at - p.wan.clock() == pytest.approx(3.0 + 0.1, abs=0.1)
        assert p.mirror.predicted_hit(follow, "s", p.wan.clock() + 3.2) == 2049
        md_answers.set()
        await settling
        assert p.mirror.expected == {}  # confirmed (learned) or withdrawn
        assert p.mirror.predicted_hit(follow, "s") == (2049 if md_agrees else 0)

    monkeypatch.setattr(settle_module, "chunks", md_stream)
    asyncio.run(scenario())


def test_the_md_mirror_keeps_as_many_recent_prompts_as_mds_pool_holds():
    """A low-hit trace's requests share prefixes across sessions far apart (Mooncake's
    window: 18 of 120 requests matched a prompt more than 32 requests back). The mirror
    keeps every prompt MD's pool can hold for any session to match, and forgets the
    oldest once they hold more tokens than the pool."""
    mirror = PrefixMirror(capacity_tokens=10_000)
    shared = list(range(100, 300))  # 200 tokens, the first session's
    mirror.add(shared, "s0")
    for i in range(1, 40):  # 39 sessions of 200 tokens each since: 8,000 tokens in all
        mirror.add([5000 + i] * 200, f"s{i}")
    assert mirror.predicted_hit(shared + [7], "new") == 200
    for i in range(40, 51):  # 2,200 more: past the pool, the oldest goes
        mirror.add([5000 + i] * 200, f"s{i}")
    assert mirror.predicted_hit(shared + [7], "new") == 0
    assert mirror._recent_tokens <= 10_000
