"""What the router believes main decode's prefix cache holds, to predict its hit.

Main decode caches every exchange it finished (prompt + output). The router keeps
the last exchange per session and a few recent ones overall, and predicts MD's hit
for a new prompt as the longest common prefix with any of them. An over-estimate
is harmless: MD tells prefill its real prefix length and only missing pages move.

Bounded like the cache it mirrors: at most ``capacity_tokens`` (MD's KV pool) over all
sessions, least recently used sessions forgotten first, each exchange kept as 4-byte
token ids, so a long soak does not grow the router's memory.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixMirror:
    def __init__(self, recent: int = 32, capacity_tokens: int = 65536) -> None:
        self.by_session: OrderedDict[str, np.ndarray] = OrderedDict()
        self.recent: list[np.ndarray] = []
        self.capacity = recent
        self.capacity_tokens = capacity_tokens
        self._tokens = 0  # held in by_session

    def clear(self) -> None:
        """Main decode's cache was flushed: it holds nothing now."""
        self.by_session.clear()
        self.recent.clear()
        self._tokens = 0

    def add(self, tokens: list[int], session: str | None, shared: bool = True) -> None:
        """MD caches ``tokens`` (``shared``: for every session's prompts to match; else
        only for the session's own next turn)."""
        ids = np.asarray(tokens, dtype=np.int32)[: self.capacity_tokens]
        if session:
            old = self.by_session.pop(session, None)
            self._tokens += len(ids) - (len(old) if old is not None else 0)
            self.by_session[session] = ids
            while self._tokens > self.capacity_tokens:
                _, dropped = self.by_session.popitem(last=False)
                self._tokens -= len(dropped)
        if shared:
            self.recent = [ids, *self.recent[: self.capacity - 1]]

    def predicted_hit(self, prompt: list[int], session: str | None) -> int:
        candidates = list(self.recent)
        if session and session in self.by_session:
            candidates.insert(0, self.by_session[session])
        ids = np.asarray(prompt, dtype=np.int32)
        return max((common_prefix(ids, c) for c in candidates), default=0)
