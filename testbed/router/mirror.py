"""What the router believes main decode's prefix cache holds, to predict its hit.

Main decode caches every exchange it finished (prompt + output). The router keeps
the last exchange per session and a few recent ones overall, and predicts MD's hit
for a new prompt as the longest common prefix with any of them. An over-estimate
is harmless: MD tells prefill its real prefix length and only missing pages move.
"""

from __future__ import annotations

import os
from collections import OrderedDict


class PrefixMirror:
    def __init__(self, recent: int = 32) -> None:
        self.by_session: OrderedDict[str, list[int]] = OrderedDict()
        self.recent: list[list[int]] = []
        self.capacity = recent

    def clear(self) -> None:
        """Main decode's cache was flushed: it holds nothing now."""
        self.by_session.clear()
        self.recent.clear()

    def add(self, tokens: list[int], session: str | None) -> None:
        tokens = list(tokens)
        if session:
            self.by_session[session] = tokens
            self.by_session.move_to_end(session)
            while len(self.by_session) > 4096:
                self.by_session.popitem(last=False)
        self.recent = [tokens, *self.recent[: self.capacity - 1]]

    def predicted_hit(self, prompt: list[int], session: str | None) -> int:
        candidates = list(self.recent)
        if session and session in self.by_session:
            candidates.insert(0, self.by_session[session])
        return max((len(os.path.commonprefix([prompt, c])) for c in candidates), default=0)
