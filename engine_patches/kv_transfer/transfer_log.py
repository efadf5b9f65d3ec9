"""One JSON line per KV transfer, per side: what crossed the wire, when, and how it ended.

Written to the file named by ``PDD_KV_TRANSFER_LOG`` (set per server by the testbed);
the router's per-request records join it by ``room`` (the bootstrap room).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass

ENV = "PDD_KV_TRANSFER_LOG"


@dataclass
class TransferRecord:
    room: int
    side: str  # "prefill" (sender) or "decode" (receiver)
    peer: str
    start: float  # wall clock (s), same clock for every process on the host
    end: float | None = None
    first_byte: float | None = None  # first KV chunk on the wire: end - first_byte is transfer time
    status: str = "running"  # success | failed
    reason: str | None = None
    pages: int = 0
    kv_bytes: int = 0  # KV page payload
    wire_bytes: int = 0  # every frame, headers included (TCP/IP headers excluded)
    decode_prefix_len: int = 0
    page_size: int = 1


class TransferLog:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> TransferLog:
        return cls(os.environ.get(ENV))

    def write(self, record: TransferRecord) -> None:
        if not self.path:
            return
        line = json.dumps(asdict(record), separators=(",", ":"))
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")
