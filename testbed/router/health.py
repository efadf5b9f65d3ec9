"""Active health checks: which servers are in the router's rotation.

Lifecycle: :meth:`Health.run` starts with the router and probes every server's
``/ping`` each ``interval_s`` (SGLang's flag check: its ``/health`` runs a generation
and takes a second or more), all at once, on a session of its own so probes never
queue behind requests. A probe the server refuses or answers with an error takes it
out of rotation at once (``Loads.down`` says why): a server that died is out within
``interval_s``. A probe that times out does not: across a WAN busy with KV (and
dilated under emulation) a far server's answer can take seconds and it still serves;
late probes are counted (``slow``) and shown by the router's ``/health``. The next good
probe brings a server back.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientError, ClientSession, ClientTimeout

from testbed.router.config import ServerEntry
from testbed.router.policies import Loads

logger = logging.getLogger("pdd.router")
PROBE = "/ping"


class Health:
    def __init__(
        self,
        servers: list[ServerEntry],
        loads: Loads,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        self.servers, self.loads = servers, loads
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.slow: dict[str, int] = {}  # server → probes timed out in a row

    async def run(self) -> None:
        async with ClientSession(timeout=ClientTimeout(total=self.timeout_s)) as session:
            while True:
                await asyncio.gather(*(self._probe(session, s) for s in self.servers))
                await asyncio.sleep(self.interval_s)

    async def _probe(self, session: ClientSession, server: ServerEntry) -> None:
        try:
            async with session.get(server.url + PROBE) as r:
                why = None if r.status == 200 else f"{PROBE} answered {r.status}"
        except TimeoutError:
            self.slow[server.name] = self.slow.get(server.name, 0) + 1
            return  # slow is not dead (see above)
        except (ClientError, OSError) as exc:
            why = f"{PROBE} failed: {exc!r}"[:200]
        self.slow.pop(server.name, None)
        down = self.loads.down
        if why is not None and server.name not in down:
            logger.warning("server %s out of rotation: %s", server.name, why)
            down[server.name] = why
        elif why is None and server.name in down:
            logger.warning("server %s back in rotation", server.name)
            del down[server.name]
