"""What follows each request of a pdd router: DRC alignment and the MD prefix mirror.

After a request that ended on MD (or was settled there), ``remember`` tells the MD
prefix mirror what MD now caches and, with ``align_prefill_cache``,
has P cache the same exchange (a prefill with SGLang's fake transfer: nothing is
sent), so P's and MD's hit ratios stay aligned over a session. A session's next
request waits for the previous one's alignment, or for its settling on MD when relay
decode finished it (``before``/``after``), but at most ``turn_wait_s``: past that it
is routed on what the mirror knows then (MD lacking the exchange: a conservative WAN
prediction, and P recomputes what it has not cached yet), so a slow settle behind a
busy WAN never stalls the session's next first token.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.names import HandoffMode, Pipeline
from protocol.records import RequestRecord
from protocol.rooms import align_rid, new_room
from testbed.router.config import PddConfig
from testbed.router.mirror import PrefixMirror
from testbed.router.policies import Route
from testbed.router.upstream import Upstream

logger = logging.getLogger("pdd.router")
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's: prefill runs, its transfer is a no-op


class AfterRequest:
    """DRC alignment and the MD prefix mirror, after each request of a pdd router."""

    def __init__(self, pdd: PddConfig, mirror: PrefixMirror, upstream: Upstream | None) -> None:
        self.pdd, self.mirror, self.upstream = pdd, mirror, upstream
        # session → done once P caches the session's last exchange (set when the
        # request starts, so a next turn sent the moment the stream ends still waits)
        self.pending: dict[str, asyncio.Future] = {}
        # id(record) → settle_on_md's task, for requests relay decode finished first
        self.settling: dict[int, asyncio.Task] = {}
        self.wait_s = pdd.turn_wait_s  # how long a next turn waits for them

    async def before(self, session: str | None) -> asyncio.Future | None:
        """Wait until P caches the session's previous exchange; returns this request's
        own future, which ``after`` resolves (a later turn may already have replaced it
        in ``pending`` when this request's bookkeeping ends)."""
        if not session:
            return None
        previous = self.pending.get(session)
        mine = self.pending[session] = asyncio.get_running_loop().create_future()
        if previous is not None:
            try:
                await asyncio.wait_for(asyncio.shield(previous), self.wait_s)
            except TimeoutError:  # routed on what the mirror knows now
                logger.info(
                    "session %s: previous turn still aligning after %.2f s", session, self.wait_s
                )
            except Exception as exc:  # alignment is an optimisation; never fail a request
                logger.warning("aligning P's cache for session %s: %r", session, exc)
        return mine

    def after(
        self, route: Route | None, body: dict, record: RequestRecord, done: asyncio.Future | None
    ) -> None:
        task = self.settling.pop(id(record), None)
        if task is None and route is not None:
            task = self._after(route, body, record)
        if done is None or done.done():
            return
        if task is None:
            self._resolve(record.session_id, done)
        else:
            task.add_done_callback(lambda _: self._resolve(record.session_id, done))

    def _resolve(self, session: str, done: asyncio.Future) -> None:
        if not done.done():
            done.set_result(None)
        if self.pending.get(session) is done:  # no later turn waits on it: forget it
            del self.pending[session]

    def _after(self, route: Route, body: dict, record: RequestRecord) -> asyncio.Task | None:
        prompt = body.get("input_ids")
        ids = record.output_ids
        ended_on_md = record.status == "ok" and (
            route.pipeline == Pipeline.P_MD
            or (record.handoff_mode is not None and HandoffMode(record.handoff_mode).ended_on_md)
        )
        if not ended_on_md or not isinstance(prompt, list) or not ids:
            return None
        return self.remember(route, body, record.session_id, ids)

    def expect(self, body: dict, session: str | None, ids: list[int], held: int, ready_at: float):
        """MD is finishing the exchange (prompt + ``ids``) after relay decode ended the
        client's stream: its cache holds the first ``held`` tokens of the exchange now,
        all from ``ready_at``; ``remember`` or ``forget`` follows."""
        self.mirror.expect(_cached(_exchange(body, ids)), session, held, ready_at)

    def forget(self, body: dict, session: str | None, ids: list[int]) -> None:
        """The exchange (prompt + ``ids``) ``expect`` announced will not be in MD's cache."""
        self.mirror.forget(_cached(_exchange(body, ids)), session)

    def remember(self, route: Route, body: dict, session: str | None, ids: list[int]):
        """MD now caches prompt + output: tell the mirror, and have P cache it too."""
        exchange = _exchange(body, ids)
        self.mirror.add(_cached(exchange), session)
        if not self.pdd.align_prefill_cache or self.upstream is None:
            return None
        return asyncio.create_task(self._cache_on_prefill(route, exchange))

    async def _cache_on_prefill(self, route: Route, exchange: list[int]) -> None:
        room = new_room()
        body = {
            "rid": align_rid(room),  # P inserts it into its prefix cache
            "input_ids": exchange,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "bootstrap_host": FAKE_BOOTSTRAP_HOST,
            "bootstrap_room": room,
        }
        try:
            async with self.upstream.post(route.prefill, "/generate", body) as r:
                await r.read()
        except Exception as exc:  # an optimisation off every client's path: log it
            logger.warning("aligning P's cache (room %s): %r", room, exc)


def _exchange(body: dict, ids: list[int]) -> list[int]:
    """A request's prompt and output: the next turn's prompt starts with it."""
    return list(body["input_ids"]) + list(ids)


def _cached(exchange: list[int]) -> list[int]:
    """What MD's cache holds of an exchange it ended: all but the last token (no KV)."""
    return exchange[:-1]
