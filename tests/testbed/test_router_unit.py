"""The router on its own: a dead upstream gives the client a clear error and a record."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from protocol.names import Pipeline
from protocol.records import RequestRecord
from testbed.router.app import Router
from testbed.router.config import RouterConfig, ServerEntry
from testbed.router.policies import Loads, Route
from tests.testbed.router_process import colocated_config, free_port, running_router


def test_unreachable_server_is_a_clear_502_and_an_error_record(tmp_path):
    config = colocated_config(tmp_path, {"gone": free_port()})
    with running_router(config, tmp_path) as url:
        r = httpx.post(
            f"{url}/generate",
            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}},
            timeout=30,
        )
        # 502 if the request came before the first health probe, 503 once the router
        # knows the server is down: either way a JSON error naming it.
        assert r.status_code in (502, 503) and "gone" in r.json()["error"]["message"]
        bad = httpx.post(f"{url}/generate", content=b"{not json", timeout=30)
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        time.sleep(0.2)
        records = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
        assert records[0]["status"] in ("upstream_error", "rejected")
        assert records[1]["status"] == "rejected" and "gone" in records[0]["error"]


def test_loads_learn_a_decoders_interval_from_requests_it_decoded_alone():
    loads = Loads()
    loads.learn_itl("md", [0.0, 0.05, 0.10, 0.15, 0.30], switched=False)  # median gap 0.05
    assert loads.itl["md"] == pytest.approx(0.05)
    loads.learn_itl("md", [0.0, 0.2, 0.4, 0.6], switched=True)  # two servers' gaps: ignored
    loads.learn_itl("md", [0.0, 0.1], switched=False)  # one gap says too little
    assert loads.itl["md"] == pytest.approx(0.05)
    loads.learn_itl("md", [0.0, 0.15, 0.30, 0.45], switched=False)  # decays towards 0.15
    assert loads.itl["md"] == pytest.approx(0.05 + Loads.ITL_WEIGHT * 0.10)


def test_loads_learn_main_decodes_catch_up_batch_time_from_each_extended_answer():
    """A handoff channel times each catch-up batch, its send to MD's EXTENDED, into the
    router's loads. MD's handoff listener is a stand-in (a local socket answering
    EXTENDED after 0.2 s); the real one runs in tests/testbed/test_pdd.py."""
    from protocol.frames import MsgType, read_frame, write_frame
    from protocol.handoff import Extended
    from testbed.router.handoff_channel import HandoffChannel

    loads = Loads()

    async def md_listener(reader, writer):
        while True:
            kind, room, _ = await read_frame(reader)
            if kind == MsgType.HANDOFF:
                await asyncio.sleep(0.2)
                await write_frame(
                    writer, MsgType.EXTENDED, room, Extended(3, 3, 5, 0.1, False).encode()
                )

    async def scenario():
        server = await asyncio.start_server(md_listener, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        learn = lambda seconds: loads.learn_extend("md", seconds)  # noqa: E731
        channel = HandoffChannel("127.0.0.1", port, 7, loads.extending, "md", learn)
        channel.reader, channel.writer = await asyncio.open_connection("127.0.0.1", port)
        await channel.handoff([1, 2, 3], final=False)
        assert loads.extending["md"] == 1 and "md" not in loads.extend_s
        await channel.extended()
        channel.close()
        server.close()

    asyncio.run(scenario())
    assert loads.extending["md"] == 0
    assert 0.2 <= loads.extend_s["md"] < 1.0
    loads.learn_extend("md", 3.0)  # decays towards the newest
    assert 1.0 < loads.extend_s["md"] < 3.0


def test_a_records_late_prefill_answer_is_awaited_never_cut(tmp_path):
    """Relay decode may end the client's stream long before P answers (P answers once
    its WAN leg to main decode has ended). The record waits for that answer however long
    the leg takes: cancelling it would close P's connection and P would abort the leg.
    Here a stand-in for P's call answers 0.3 s late with its prefix hit."""
    router = Router(colocated_config(tmp_path, {"s": free_port()}))
    record = RequestRecord(request_id="r1", system="colocated", endpoint="/generate")
    route = Route(Pipeline.COLOCATED, "test", router.config.servers[0])

    async def late_answer():
        await asyncio.sleep(0.3)
        record.cached_tokens_prefill = 7

    async def main():
        answer = asyncio.create_task(late_answer())
        await router._write(route, record, after=answer)
        return answer

    answer = asyncio.run(main())
    assert answer.done() and not answer.cancelled()
    written = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert written["cached_tokens_prefill"] == 7


def test_a_failed_requests_transfer_leaves_the_wan_model_when_its_record_is_written(tmp_path):
    """A P->MD request that failed before main decode took a connection for its KV (a
    server died, the client left) never puts its bytes on the WAN: when its record is
    written, its transfer leaves the router's model of the line (it held a pooled
    connection and its bytes in the backlog, and MD's expected cache, for minutes). A
    request that ended well keeps its transfer there until main decode's log settles it.
    The servers here are never reached: only the router's bookkeeping runs."""
    servers = [
        ServerEntry(name="p", url="http://127.0.0.1:1", role="prefill", site="A", host="p"),
        ServerEntry(name="rld", url="http://127.0.0.1:2", role="relay_decode", host="r"),
        ServerEntry(name="md", url="http://127.0.0.1:3", role="main_decode", site="B", host="m"),
    ]
    config = RouterConfig(
        system="pdd", policy="pdd", servers=servers, records=tmp_path / "records.jsonl"
    )
    router = Router(config)
    wan, mirror = router.policy.wan, router.policy.mirror
    route = Route(Pipeline.P_MD, "test", servers[2], servers[0])
    for room, status in ((1, "upstream_error"), (2, "ok")):
        wan.start(room, 1_000_000)
        mirror.coming(room, [5, 6, 7])
        record = RequestRecord(request_id=f"r{room}", system="pdd", endpoint="/generate")
        record.room, record.status = room, status
        asyncio.run(router._write(route, record))
    assert list(wan.outstanding) == [2] and list(mirror.on_its_way) == [2]


def test_a_record_waiting_for_p_at_shutdown_is_written_whole_or_says_it_was_cut(
    tmp_path, monkeypatch
):
    """Records still waiting for P's answer count in ``/pdd/stats`` (a harness waits for
    none before it stops the router: the small bench's last relayed record lost its KV
    stamps when the router was stopped 1 s after the last token). At shutdown the router
    gives them ``SHUTDOWN_WRITE_S``: one whose answer comes in time is written whole, one
    past it is written saying it was cut short. Stand-ins for P's calls answer 0.1 s and
    30 s late."""
    from testbed.router import app as app_module

    monkeypatch.setattr(app_module, "SHUTDOWN_WRITE_S", 1.0)
    router = Router(colocated_config(tmp_path, {"s": free_port()}))
    route = Route(Pipeline.COLOCATED, "test", router.config.servers[0])
    records = [RequestRecord(request_id=f"r{i}", system="x", endpoint="/generate") for i in (1, 2)]

    async def late_answer(seconds: float, record: RequestRecord):
        await asyncio.sleep(seconds)
        record.cached_tokens_prefill = 7

    async def main():
        delays = zip((0.1, 30), records, strict=True)
        answers = [asyncio.create_task(late_answer(s, r)) for s, r in delays]
        for record, answer in zip(records, answers, strict=True):
            router._write_later(route, record, answer)
        pending = json.loads((await router.stats(None)).text)["records_pending"]
        started = time.monotonic()
        await router._stop(None)
        answers[1].cancel()
        return pending, time.monotonic() - started

    pending, stop_s = asyncio.run(main())
    assert pending == 2 and stop_s < 5
    written = {
        d["request_id"]: d
        for d in map(json.loads, (tmp_path / "records.jsonl").read_text().splitlines())
    }
    assert written["r1"]["cached_tokens_prefill"] == 7 and written["r1"]["fallback"] is None
    assert written["r2"]["cached_tokens_prefill"] is None  # P never answered
    assert "before its KV transfer was joined" in written["r2"]["fallback"]
