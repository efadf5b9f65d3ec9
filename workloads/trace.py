"""The trace model: sessions → turns → requests, each prompt a list of prefix blocks.

A request's prompt is ``hash_ids``: block ids, ``block_tokens`` tokens each (the last
block may be partial; ``input_length`` is exact). Equal block ids at equal positions
mean equal tokens, so prefix sharing is exact (the Mooncake convention). For a turn
after the first, ``output_hash_ids`` of the previous request name the blocks that
stand for that turn's model output, so a closed-loop replay can put the real output
there instead (see :mod:`workloads.replay`).

File format (JSON lines, schema version 1): a header line ``{"trace": {...}}`` with
``name``, ``block_tokens``, ``schema_version`` and free ``metadata`` (source, seeds,
scaling), then one request object per line with the fields of :class:`Request`.
Parquet holds the same columns, the header in the file's key-value metadata.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Request:
    request_id: str
    session_id: str
    turn: int
    hash_ids: tuple[int, ...]
    input_length: int
    output_length: int
    arrival_s: float | None = None  # open loop: seconds since the trace started
    think_time_s: float | None = None  # closed loop: after the previous turn finished
    output_hash_ids: tuple[int, ...] = ()  # blocks standing for this request's output
    anomalous: bool = False  # very long input, very short output

    def __post_init__(self) -> None:
        if self.input_length < 1 or self.output_length < 1:
            raise ValueError(f"{self.request_id}: input and output lengths must be >= 1")


@dataclass
class Trace:
    name: str
    block_tokens: int
    requests: list[Request]
    metadata: dict = field(default_factory=dict)

    def sessions(self) -> dict[str, list[Request]]:
        out: dict[str, list[Request]] = defaultdict(list)
        for r in self.requests:
            out[r.session_id].append(r)
        for turns in out.values():
            turns.sort(key=lambda r: r.turn)
        return dict(out)

    # -- JSON lines -------------------------------------------------------------------
    def to_jsonl(self, path: Path) -> None:
        header = {
            "trace": {
                "name": self.name,
                "block_tokens": self.block_tokens,
                "schema_version": SCHEMA_VERSION,
                "metadata": self.metadata,
            }
        }
        with open(path, "w") as f:
            f.write(json.dumps(header) + "\n")
            for r in self.requests:
                f.write(json.dumps(asdict(r), separators=(",", ":")) + "\n")

    @classmethod
    def from_jsonl(cls, path: Path) -> Trace:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
        if not lines or "trace" not in json.loads(lines[0]):
            raise ValueError(f"{path}: not a pdd-testbed trace (no header line with 'trace')")
        head = json.loads(lines[0])["trace"]
        if head.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: schema version {head.get('schema_version')}, expected {SCHEMA_VERSION}"
            )
        requests = [_request(json.loads(line)) for line in lines[1:]]
        return cls(head["name"], head["block_tokens"], requests, head.get("metadata", {}))

    # -- parquet --------------------------------------------------------------------
    def to_parquet(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([asdict(r) for r in self.requests])
        header = {
            "name": self.name,
            "block_tokens": self.block_tokens,
            "schema_version": SCHEMA_VERSION,
            "metadata": self.metadata,
        }
        table = table.replace_schema_metadata({b"pdd_trace": json.dumps(header).encode()})
        pq.write_table(table, path)

    @classmethod
    def from_parquet(cls, path: Path) -> Trace:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        head = json.loads(table.schema.metadata[b"pdd_trace"])
        requests = [_request(row) for row in table.to_pylist()]
        return cls(head["name"], head["block_tokens"], requests, head.get("metadata", {}))

    @classmethod
    def load(cls, path: Path) -> Trace:
        path = Path(path)
        return cls.from_parquet(path) if path.suffix == ".parquet" else cls.from_jsonl(path)

    def save(self, path: Path) -> None:
        path = Path(path)
        self.to_parquet(path) if path.suffix == ".parquet" else self.to_jsonl(path)


def _request(d: dict) -> Request:
    d = dict(d)
    d["hash_ids"] = tuple(d["hash_ids"])
    d["output_hash_ids"] = tuple(d.get("output_hash_ids") or ())
    return Request(**d)
