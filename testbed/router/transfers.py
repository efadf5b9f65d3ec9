"""Finds a request's KV transfer in the servers' transfer logs, by bootstrap room."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from protocol.records import TransferRecord, from_dict


class TransferIndex:
    """Reads the decode-side transfer logs incrementally; looks records up by room."""

    def __init__(self, paths: list[Path]) -> None:
        self._offsets = {Path(p): 0 for p in paths}
        self._by_room: dict[tuple[Path, int], TransferRecord] = {}

    def _refresh(self) -> None:
        for path, offset in self._offsets.items():
            try:
                with open(path) as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind("\n") + 1]
            self._offsets[path] = offset + len(complete.encode())
            for line in complete.splitlines():
                data = json.loads(line)
                if data.get("side") == "decode":
                    self._by_room[(path, data["room"])] = from_dict(TransferRecord, data)

    async def lookup(self, room: int, log: Path, wait_s: float = 1.0) -> TransferRecord | None:
        """The decode side's record for ``room`` in ``log`` (a dual-path room has one
        per destination); waits briefly for it to be written."""
        deadline = asyncio.get_running_loop().time() + wait_s
        key = (Path(log), room)
        while True:
            self._refresh()
            if key in self._by_room:
                return self._by_room.pop(key)
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.05)

    def peek(self, room: int, log: Path) -> TransferRecord | None:
        """The record for ``room`` if it is written yet, left in place for ``lookup``."""
        self._refresh()
        return self._by_room.get((Path(log), room))
