"""Main decode's drain after a switch that did not complete (no servers): the request
and MD's stream are stand-ins for the router's relayed request and MD's HTTP stream
(the real servers' drain runs in tests/testbed/test_pdd.py)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace

from protocol.stream import Chunk
from testbed.router.handoff_channel import HandoffChannel
from testbed.router.settle import drain_main_decode


def chunk(ids: list[int], finished: bool = False) -> Chunk:
    meta = {"completion_tokens": len(ids)}
    if finished:
        meta["finish_reason"] = {"type": "length"}
    return Chunk.parse(f"data: {json.dumps({'output_ids': ids, 'meta_info': meta})}")


def test_a_drain_stops_counting_its_final_batch_as_an_extend_once_md_decodes_past_it():
    """Other rooms' switches hold relay decode on while MD is about to pause for an
    extend (``Loads.extending``). The final batch of a request MD now drains was
    extended once MD streams past it: counted on until the drain ended, every switch
    on that MD meanwhile cushioned a pause that never came."""
    extending: Counter = Counter()
    channel = HandoffChannel("md", 1, room=7, extending=extending, md="md")
    channel.pending, extending["md"] = 1, 1  # the final handoff, sent
    more = asyncio.Event()
    released = []

    async def md_stream():
        await more.wait()
        yield chunk([1, 2, 3, 4], finished=True)

    async def scenario():
        loop = asyncio.get_running_loop()
        first = loop.create_future()
        after = SimpleNamespace(remember=lambda *a: None, forget=lambda *a: None)
        req = SimpleNamespace(
            p=SimpleNamespace(after=after),
            route=None,
            body={},
            record=SimpleNamespace(session_id="s", room=7),
            tokens=[1, 2, 3, 4],
            channel=channel,
            release=lambda: released.append(True),
        )
        draining = asyncio.create_task(drain_main_decode(req, first, md_stream()))
        await asyncio.sleep(0.05)
        assert extending["md"] == 1  # MD has not streamed past the batch yet
        first.set_result(chunk([1, 2, 3]))
        await asyncio.sleep(0.05)
        assert extending["md"] == 0 and not draining.done()  # past it, still draining
        more.set()
        await draining
        assert released == [True] and extending["md"] == 0

    asyncio.run(scenario())
