"""What the router answers for its servers: their own word on the model (``/v1/models``,
``/model_info``, ``/server_info``, from the first healthy one) and ``/flush_cache``
fanned out to every one."""

from __future__ import annotations

import asyncio

from aiohttp import ClientError, web

from protocol.stream import error_body
from testbed.router.config import ServerEntry


async def first_healthy(request: web.Request, servers: list[ServerEntry], loads, upstream):
    """The first healthy server's answer to the same GET, as it gave it."""
    up = [s for s in servers if s.name not in loads.down]
    if not up:
        return web.json_response(error_body("no healthy server", 503, "overloaded"), status=503)
    try:
        async with upstream.session(up[0].role).get(up[0].url + request.path) as r:
            body = await r.read()
            return web.Response(body=body, status=r.status, content_type=r.content_type)
    except (TimeoutError, ClientError, OSError) as exc:
        message = f"{up[0].name}: {exc!r}"
        return web.json_response(error_body(message, 502, "upstream_error"), status=502)


async def flush_all(servers: list[ServerEntry], upstream, mirror) -> web.Response:
    """Every server's prefix cache emptied (SGLang's /flush_cache on each), and the
    router's mirror of main decode's cache (``mirror``, if any) with them."""

    async def one(server: ServerEntry) -> tuple[str, str | None]:
        try:
            async with upstream.session(server.role).post(server.url + "/flush_cache") as r:
                text = await r.text()
                return server.name, None if r.status == 200 else f"{r.status}: {text[:200]}"
        except (TimeoutError, ClientError, OSError) as exc:
            return server.name, repr(exc)[:200]

    results = dict(await asyncio.gather(*(one(s) for s in servers)))
    if mirror is not None:
        mirror.clear()
    failed = {name: why for name, why in results.items() if why}
    if failed:
        message = "; ".join(f"{name}: {why}" for name, why in failed.items())
        return web.json_response(error_body(message, 502, "upstream_error"), status=502)
    return web.json_response({"flushed": sorted(results)})
