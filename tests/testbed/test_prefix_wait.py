"""Main decode waits for a prompt prefix already on its way instead of having prefill
send it again (engine_patches.kv_transfer.prefix_wait), on real SGLang servers over the
emulated WAN (the ``pdd`` deployment of tests/testbed/conftest.py: 100 Mbit/s, 5 ms)."""

from __future__ import annotations

import random
import threading
import time

import pandas as pd
import pytest

from engine_patches.kv_transfer.line_share import HEADROOM
from protocol import headers
from protocol.metrics import TtftPart
from protocol.names import Pipeline, Role
from protocol.records import TransferRecord, from_dict, read_jsonl
from reports import ttft
from tests.conftest import reference_output
from tests.testbed.pdd_deployment import record_of, stream
from tests.testbed.test_pdd import md_log, md_transfers

pytestmark = [pytest.mark.sglang, pytest.mark.netns]

P_MD = {headers.PIPELINE: Pipeline.P_MD}


def prompts(seed: str, shared: int, own: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)  # fresh tokens: nothing of them cached anywhere
    prefix = [rng.randrange(10, 4000) for _ in range(shared)]
    return [prefix + [rng.randrange(10, 4000) for _ in range(own)] for _ in range(n)]


def prefill_sent(pdd, room: int):
    """Prefill's sender line for ``room``'s WAN leg (written once its connection settled)."""
    (p,) = [s for s in pdd.servers if s.role == Role.PREFILL]
    (md,) = [s for s in pdd.servers if s.role == Role.MAIN_DECODE]
    md_address = pdd.net.address(md.host)
    deadline = time.monotonic() + 10
    while True:
        lines = read_jsonl(pdd.transfer_log(p.name)) if pdd.transfer_log(p.name).exists() else []
        mine = [
            from_dict(TransferRecord, d)
            for d in lines
            if d.get("side") == "prefill"
            and d["room"] == room
            and d["peer"].rsplit(":", 1)[0] == md_address
        ]
        if mine or time.monotonic() > deadline:
            return mine[-1]
        time.sleep(0.2)


def md_transfer(pdd, session: str):
    rec = record_of(pdd, session)
    deadline = time.monotonic() + 10
    while not md_transfers(pdd, rec.room) and time.monotonic() < deadline:
        time.sleep(0.2)
    (transfer,) = md_transfers(pdd, rec.room)
    assert transfer.ok
    return transfer


def test_two_requests_opening_with_one_prefix_send_it_over_the_wan_once(pdd, colocated):
    """Two P->MD requests share 1500 of their 1600 tokens (12 MB of KV, ~1 s on the
    line); the second reaches main decode while the first's KV is on the WAN. Main
    decode holds it until that KV is in its prefix cache: the second transfer carries
    its own 100 tokens, not the prefix again, and both streams stay token-exact."""
    first, second = prompts("opening", 1500, 100, 2)
    # B's hold is bounded by the router's prediction of its KV, from MD's arrival: the
    # router learns from a first transfer how long prefill takes to the first KV byte
    (warm,) = prompts("opening-warm-up", 1500, 100, 1)
    stream(pdd, warm, 2, "open-warm", pins=P_MD)
    out = {}

    def run(name, prompt):
        out[name] = stream(pdd, prompt, 16, name, pins=P_MD)

    threads = [threading.Thread(target=run, args=("open-a", first))]
    threads[0].start()
    time.sleep(0.3)  # A's KV is on its way to main decode when B's request reaches it
    threads.append(threading.Thread(target=run, args=("open-b", second)))
    threads[1].start()
    for t in threads:
        t.join(300)
    assert out["open-a"] == reference_output(colocated, first, 16)
    assert out["open-b"] == reference_output(colocated, second, 16)
    a, b = md_transfer(pdd, "open-a"), md_transfer(pdd, "open-b")
    assert a.decode_prefix_len == 0  # A's prefix crossed once...
    per_token = a.kv_bytes / 1600
    assert b.decode_prefix_len >= 1500 // b.page_size * b.page_size  # ...B matched it at MD
    assert b.kv_bytes <= (1600 - b.decode_prefix_len) * per_token + 1
    assert b.first_byte >= a.end  # B's KV moved once A's was in
    # servers.kv_line_share (the fixture's): prefill paced each send across the WAN at
    # its share of the line, A's alone (B held back) at all of it
    line = HEADROOM * pdd.scenario.network.wan.rate_mbit * 1e6 / 8
    sent_a, sent_b = prefill_sent(pdd, a.room), prefill_sent(pdd, b.room)
    assert sent_a.paced_bytes_s == int(line)
    assert sent_b.paced_bytes_s in (int(line), int(line / 2))
    # MD's pool lines name the connection each transfer ran on, as prefill's log does
    # (the router's WAN model mirrors MD's pool from them), before its KV came
    checkouts = {x.room: x for x in md_log(pdd, "pool") if x.event == "checkout"}
    assert checkouts[a.room].conn == sent_a.peer and checkouts[b.room].conn == sent_b.peer
    assert checkouts[b.room].time <= b.first_byte
    # P computed B long before MD asked for its KV: the TTFT breakdown says so
    rec = record_of(pdd, "open-b")
    assert b.computed is not None and rec.prefill_computed == pytest.approx(b.computed)
    part = ttft.parts(pd.DataFrame([rec.__dict__])).iloc[0]
    assert part[TtftPart.ASK] > 0.1
    assert part[TtftPart.ASK] == pytest.approx(rec.prefill_first_byte - rec.prefill_computed)
    total = sum(part[x.value] for x in TtftPart if not pd.isna(part[x.value]))
    assert total == pytest.approx(part["ttft_s"], abs=1e-6)


def test_a_parked_requests_prompt_is_in_main_decodes_prefix_cache(pdd, colocated):
    """A relayed request's KV waits on main decode, parked, until its handoff; its prompt
    is in main decode's prefix cache from when it arrived, so a P->MD request sharing
    it (sent while the first still streams from relay decode) has only its own tokens
    sent."""
    first, second = prompts("parked", 1200, 80, 2)
    pin = {headers.PIPELINE: Pipeline.P_RLD_MD, headers.HANDOFF_AT: "150"}
    out, before = {}, len(md_log(pdd, "decode"))
    relayed = threading.Thread(
        target=lambda: out.setdefault("a", stream(pdd, first, 200, "parked-a", pins=pin))
    )
    relayed.start()
    try:
        deadline = time.monotonic() + 60
        while len(md_log(pdd, "decode")) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        (a,) = md_log(pdd, "decode")[before:]  # A's KV is on MD, parked until its handoff
        assert a.ok and a.decode_prefix_len == 0
        assert stream(pdd, second, 16, "parked-b", pins=P_MD) == reference_output(
            colocated, second, 16
        )
    finally:
        relayed.join(300)
    assert out["a"] == reference_output(colocated, first, 200)
    assert record_of(pdd, "parked-a").handoff_mode in ("one-shot", "catch-up")
    b = md_transfer(pdd, "parked-b")
    assert b.first_byte < record_of(pdd, "parked-a").handoff_sent  # before A's handoff
    assert b.decode_prefix_len >= 1200 // b.page_size * b.page_size
    assert b.kv_bytes <= (1280 - b.decode_prefix_len) * a.kv_bytes / 1280 + 1


def test_two_openings_sent_at_once_send_their_prefix_once_whichever_reaches_md_first(
    pdd, colocated
):
    """Two P->MD openings sharing 1500 of 1600 tokens leave the client together; the
    router predicts the second it routes held for the first's KV and names that room in
    main decode's request. Their legs reach main decode in either order (default run
    030404: the later one 40 ms first, and it sent its whole 10 MB beside the first's);
    either way the second crosses after the first, with its own tokens only."""
    prompt = dict(zip(("both-a", "both-b"), prompts("at-once", 1500, 100, 2), strict=True))
    out, go = {}, threading.Barrier(2)

    def run(name):
        go.wait()
        out[name] = stream(pdd, prompt[name], 16, name, pins=P_MD)

    threads = [threading.Thread(target=run, args=(name,)) for name in prompt]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for name in prompt:
        assert out[name] == reference_output(colocated, prompt[name], 16)
    records = {name: record_of(pdd, name) for name in prompt}
    (second,) = [n for n, r in records.items() if r.wan_held_for is not None]
    (first,) = set(prompt) - {second}
    assert records[second].wan_held_for == records[first].room  # named to main decode
    a, b = md_transfer(pdd, first), md_transfer(pdd, second)
    assert a.decode_prefix_len == 0 and b.decode_prefix_len >= 1500 // b.page_size * b.page_size
    assert b.kv_bytes <= (1600 - b.decode_prefix_len) * a.kv_bytes / 1600 + 1
    assert b.first_byte >= a.end
