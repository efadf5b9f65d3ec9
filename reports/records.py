"""RequestRecord: one row per request — the only thing the report reads.

Written by the router as JSON lines while a run goes; converted to parquet for the
run directory. Times are wall-clock seconds (``time.time()``), the same clock every
process on the host uses, so router, server and transfer logs line up.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class RequestRecord:
    request_id: str
    system: str  # colocated | same_site_pd | cross_site_pd | pdd ...
    endpoint: str  # /generate | /v1/completions | /v1/chat/completions
    session_id: str | None = None
    turn: int | None = None
    pipeline: str = ""  # colocated | P->D | P->MD | P->RLD->MD | RLD-only
    pipeline_reason: str = ""
    prefill_server: str | None = None
    decode_server: str | None = None
    room: int | None = None
    arrival: float = 0.0
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens_prefill: int | None = None  # prefix hit on P (or the colocated server)
    cached_tokens_decode: int | None = None  # prefix decode already held (decode_prefix_len)
    output_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)  # native /generate only
    eager_tokens: int = 0  # streamed by relay decode before the handoff
    handoff_tokens: int = 0  # token ids sent to main decode (all batches)
    handoff_mode: str | None = None  # one-shot | catch-up | none (relay finished) | failed
    handoff_batches: int = 0
    handoff_bytes: int = 0  # handoff frames on the wire (headers included)
    handoff_s: float | None = None  # last eager token → first main-decode token (client gap)
    handoff_sent: float | None = None  # wall time the final handoff frame left the router
    handoff_mismatch: bool = False  # main decode's echo of the eager tokens differed
    fallback: str | None = None  # why relay decode finished a request meant for MD
    predicted_wan_s: float | None = None  # the routing input: uncached KV / WAN rate
    kv_bytes: int | None = None  # KV payload moved for this request
    kv_wire_bytes: int | None = None
    kv_link: str | None = None  # lan | wan
    kv_transfer_s: float | None = None
    status: str = "ok"  # ok | error
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival


COLUMNS = [f.name for f in fields(RequestRecord)]


class RecordWriter:
    """Appends records as JSON lines; safe from several threads or tasks."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        line = json.dumps(asdict(record), separators=(",", ":"))
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")


def read_records(path: Path) -> list[RequestRecord]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            out.append(RequestRecord(**{k: v for k, v in data.items() if k in COLUMNS}))
    return out
