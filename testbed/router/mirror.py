"""What the router believes main decode's prefix cache holds, to predict its hit.

Main decode caches every exchange it finished (prompt + output). The router keeps
the last exchange per session and the recent ones overall, and predicts MD's hit
for a new prompt as the longest common prefix with any of them. An over-estimate
is harmless: MD tells prefill its real prefix length and only missing pages move.

Bounded like the cache it mirrors: at most ``capacity_tokens`` (MD's KV pool) over all
sessions, least recently used sessions forgotten first, and as many tokens of recent
exchanges (at most ``recent`` of them), each kept as 4-byte token ids, so a long soak
does not grow the router's memory. Recent ones by count alone (32) missed the reuse of
a low-hit trace, whose requests share prefixes across sessions far apart: the
Mooncake window (run ``bench-mooncake_lowhit-20261207-113934``) had 18 of 120
requests predicted to hit nothing where MD held all but a block of them (22% of its
transfers' bytes mispredicted, WAN error P95 4982%); replayed by the trace's blocks
with the bound of MD's pool, none.

An exchange MD is still finishing after relay decode ended the client's stream (a
drain, or a settle: :mod:`testbed.router.settle`) is *expected*: MD holds part of it
now (the prompt and the tokens it extended; SGLang's radix tree takes a running
request's extended tokens, the ones it decodes itself only when it ends) and all of it
from a predicted time. A next turn's prediction counts what MD will hold when that
turn's request reaches it (``at``). Until then the router predicted from the exchange
before: hetero run 092139 predicted 4.3 MB where MD lacked 0.4 MB, four times, and
those four were the run's WAN-error tail (2.4 to 23 times the measured time).

A prompt whose KV is on its way to MD (``coming``, a transfer routed there) is in MD's
cache from when that transfer ends (``arrived``): MD's prefix cache takes a transferred
prompt at once. Until then a request sharing enough of what MD lacks of it is held back
by MD (``held_for``; :mod:`engine_patches.kv_transfer.prefix_wait`) and then lacks only
the rest.

Lifecycle of one session's entries::

    expect(exchange, held, ready_at) ─▶ add(exchange)   MD ended it: learned for good
                                     └▶ forget()         the drain or settle failed
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from protocol.kv import common_prefix, holds_back

MAX_EXPECTED = 1024  # sessions with an exchange MD is finishing (a bound, never reached)


@dataclass(frozen=True)
class Expected:
    """An exchange MD is finishing: ``held`` tokens of it cached now, all from
    ``ready_at`` (the router's clock)."""

    ids: np.ndarray
    held: int
    ready_at: float

    def cached_at(self, at: float | None) -> np.ndarray:
        return self.ids if at is not None and at >= self.ready_at else self.ids[: self.held]


class PrefixMirror:
    def __init__(self, recent: int = 256, capacity_tokens: int = 65536) -> None:
        self.by_session: OrderedDict[str, np.ndarray] = OrderedDict()
        self.expected: OrderedDict[str, Expected] = OrderedDict()
        # room: its prompt, and the main decode it goes to
        self.on_its_way: OrderedDict[int, tuple[np.ndarray, str | None]] = OrderedDict()
        self.recent: list[np.ndarray] = []  # newest first
        self._recent_tokens = 0
        self.capacity = recent
        self.capacity_tokens = capacity_tokens
        self._tokens = 0  # held in by_session

    def coming(self, room: int, prompt: list[int], server: str | None = None) -> None:
        """``prompt``'s KV is on its way to MD (transfer ``room``; to ``server``)."""
        ids = np.asarray(prompt, dtype=np.int32)[: self.capacity_tokens]
        self.on_its_way[room] = (ids, server)
        while len(self.on_its_way) > MAX_EXPECTED:
            self.on_its_way.popitem(last=False)

    def arrived(self, room: int, ok: bool) -> None:
        """Transfer ``room`` ended: MD's prefix cache holds its prompt from now (SGLang's
        merge, or parking, puts a transferred prompt there), unless it failed."""
        coming = self.on_its_way.pop(room, None)
        if coming is not None and ok:
            self._add_recent(coming[0])

    def held_for(
        self, prompt: list[int], hit: int, rooms, server: str | None = None
    ) -> tuple[int, int | None]:
        """MD (``server``) holds a request back while enough of what it lacks is on its way
        to it in another transfer (``protocol.kv.holds_back``; ``rooms``: those still on
        the line): the tokens MD then holds beyond ``hit``, and the transfer it waits
        for (the router names it in the request: ``protocol.rooms.with_after``)."""
        on_way = [
            r for r in rooms if r in self.on_its_way and self.on_its_way[r][1] in (None, server)
        ]
        extra, which = holds_back(prompt, hit, [self.on_its_way[r][0] for r in on_way])
        return (extra, on_way[which]) if extra else (0, None)

    def clear(self) -> None:
        """Main decode's cache was flushed: it holds nothing now."""
        self.by_session.clear()
        self.expected.clear()
        self.recent.clear()
        self._tokens = self._recent_tokens = 0

    def expect(self, tokens: list[int], session: str | None, held: int, ready_at: float) -> None:
        """MD is finishing ``session``'s exchange ``tokens``: it holds the first ``held``
        now, and all from ``ready_at``. ``add`` (MD ended it) or ``forget`` follows."""
        if not session:
            return
        ids = np.asarray(tokens, dtype=np.int32)[: self.capacity_tokens]
        self.expected.pop(session, None)
        self.expected[session] = Expected(ids, min(held, len(ids)), ready_at)
        while len(self.expected) > MAX_EXPECTED:
            self.expected.popitem(last=False)

    def forget(self, tokens: list[int], session: str | None) -> None:
        """MD will not hold ``tokens``, which ``expect`` announced (its drain or settle
        failed); a later exchange of the session expected since stays."""
        entry = self.expected.get(session or "")
        if entry is not None and np.array_equal(entry.ids, np.asarray(tokens)[: len(entry.ids)]):
            del self.expected[session]

    def add(self, tokens: list[int], session: str | None, shared: bool = True) -> None:
        """MD caches ``tokens`` (``shared``: for every session's prompts to match; else
        only for the session's own next turn)."""
        ids = np.asarray(tokens, dtype=np.int32)[: self.capacity_tokens]
        if session:
            self.expected.pop(session, None)
            old = self.by_session.pop(session, None)
            self._tokens += len(ids) - (len(old) if old is not None else 0)
            self.by_session[session] = ids
            while self._tokens > self.capacity_tokens:
                _, dropped = self.by_session.popitem(last=False)
                self._tokens -= len(dropped)
        if shared:
            self._add_recent(ids)

    def _add_recent(self, ids: np.ndarray) -> None:
        """``ids`` first among what any session's prompt may match; the oldest go once
        the recent ones hold more tokens than MD's pool (or number over ``recent``)."""
        self.recent.insert(0, ids)
        self._recent_tokens += len(ids)
        while len(self.recent) > 1 and (
            len(self.recent) > self.capacity or self._recent_tokens > self.capacity_tokens
        ):
            self._recent_tokens -= len(self.recent.pop())

    def predicted_hit(self, prompt: list[int], session: str | None, at: float | None = None) -> int:
        """MD's predicted prefix hit for ``prompt`` when its request reaches MD (``at``;
        None: an exchange MD is finishing counts only with what it holds now)."""
        candidates = list(self.recent)
        if session and session in self.by_session:
            candidates.insert(0, self.by_session[session])
        if session and session in self.expected:
            candidates.insert(0, self.expected[session].cached_at(at))
        ids = np.asarray(prompt, dtype=np.int32)
        return max((common_prefix(ids, c) for c in candidates), default=0)
