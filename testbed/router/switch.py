"""The switch from relay decode to main decode after the final handoff, without a gap
in the client's stream (greedy requests; see :func:`switch_streams`)."""

from __future__ import annotations

import asyncio
import time

from testbed.router.upstream import UpstreamError


async def switch_streams(req, rld_stream, close_rld, md_stream) -> bool:
    """After the final handoff, without a gap: relay decode keeps streaming while
    main decode takes over. Both streams carry the same tokens (greedy decoding only);
    each token goes to the client from whichever stream has it first. Once main decode
    has every token the client has, relay decode's request is aborted (``close_rld``)
    and main decode's stream goes on alone; a main decode that never catches up leaves
    relay decode streaming to the end. If main decode fails meanwhile, relay decode
    finishes the request (``fallback``); if relay decode's stream dies, main decode
    does. Returns True if the client's stream ended here without main decode; main
    decode's side is then released here or, while it still decodes the request (its
    cache should hold the exchange), by a drain in the background.

    ``handoff_s`` is the longest gap the client saw from the final handoff until the
    switch is complete (relay decode stopped and main decode caught up with the
    client), any wait for main decode included."""
    from_rld = asyncio.ensure_future(anext(rld_stream, None))
    from_md = asyncio.ensure_future(anext(md_stream, None))
    last_sent, md_count = req.record.token_times[-1], 0
    rld_open, md_open, md_failed, finished = True, True, False, False
    switching = True

    async def send(chunk) -> bool:
        """Give the client the tokens of ``chunk`` it lacks; whether it ended the request."""
        nonlocal last_sent, switching
        new = chunk.new_ids(len(req.tokens))
        ends = chunk.finished or chunk.done
        if not new and not ends:
            return False
        req.tokens += new
        if switching:  # the client-visible gap while switching
            gap = time.time() - last_sent
            req.record.handoff_s = max(req.record.handoff_s or 0.0, gap)
        await req.out.emit(chunk, len(new))
        last_sent = time.time()
        switching = rld_open or md_failed or md_count < len(req.tokens)
        return ends

    try:
        while not finished:
            if rld_open and not md_failed and md_count >= len(req.tokens):  # caught up
                from_rld.cancel()
                close_rld()
                rld_open = False
                req.record.decode_server = req.route.main_decode.name
            waits = {t for t, open_ in ((from_rld, rld_open), (from_md, md_open)) if open_}
            if not waits:
                break
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if rld_open and from_rld.done():
                chunk = from_rld.result()
                if chunk is None or chunk.error:  # relay decode is gone: main decode alone
                    rld_open = False
                    req.record.decode_server = req.route.main_decode.name
                else:
                    req.record.eager_tokens = max(
                        req.record.eager_tokens, int(chunk.meta.get("completion_tokens", 0))
                    )
                    finished = await send(chunk)
                    rld_open = not (chunk.finished or chunk.done)
                    from_rld = asyncio.ensure_future(anext(rld_stream, None))
            if md_open and from_md.done() and not finished:
                chunk = from_md.result()
                if chunk is None or chunk.error:
                    what = chunk.error if chunk is not None else "stream ended"
                    req.record.fallback = f"main decode after the handoff: {what}"[:300]
                    md_open, md_failed = False, True
                    continue
                req.check_echo(chunk)
                md_count = max(md_count, int(chunk.meta.get("completion_tokens", 0)))
                finished = await send(chunk)
                md_open = not (chunk.finished or chunk.done)
                if md_open:
                    from_md = asyncio.ensure_future(anext(md_stream, None))
        if not finished:
            raise UpstreamError("relay and main decode both ended before the request did")
        if req.record.decode_server == req.route.main_decode.name:
            return False  # switched; main decode's stream is consumed here to its end
        await req.out.finish()
        if md_open:  # main decode still decodes the request: let it finish, then release
            req.start_drain(from_md, md_stream)
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
