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
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

SCHEMA_VERSION = 1


# A prompt longer than any model's context (a hostile or corrupt trace line: 10^12
# tokens made its block list exhaust memory), refused where it is read or generated.
MAX_PROMPT_TOKENS = 10_000_000


class TraceError(ValueError):
    """A trace that cannot be replayed as it is: says which file, line and field."""


def parse_lines(path: Path, parse) -> list:
    """``parse(line_dict, index)`` for every non-blank JSON line of ``path``; any error
    becomes a :class:`TraceError` naming the file and line. An empty result is one too."""
    out = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise TraceError("expected a JSON object")
                item = parse(data, number)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{number}: not JSON ({exc})") from None
            except (KeyError, TypeError, ValueError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise TraceError(f"{path}:{number}: {what}") from None
            if item is not None:
                out.append(item)
    return out


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
        def bad(what: str) -> TraceError:
            return TraceError(f"request {self.request_id!r}: {what}")

        for name in ("input_length", "output_length", "turn"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(f"{name} must be an integer, got {value!r}")
        if self.input_length < 1 or self.output_length < 1:
            raise bad("input and output lengths must be >= 1")
        if max(self.input_length, self.output_length) > MAX_PROMPT_TOKENS:
            raise bad(f"input and output lengths must be at most {MAX_PROMPT_TOKENS:,}")
        if self.turn < 0:
            raise bad(f"turn must be >= 0, got {self.turn}")
        for name in ("hash_ids", "output_hash_ids"):
            ids = getattr(self, name)
            if any(not isinstance(b, int) or isinstance(b, bool) for b in ids):
                raise bad(f"{name} must be integers")
        for name in ("arrival_s", "think_time_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise bad(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass
class Trace:
    name: str
    block_tokens: int
    requests: list[Request]
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """A prompt longer than its blocks would be filled with tokens no block names
        (and a hostile length, 10^8 tokens on two blocks, hung the planner)."""
        block = self.block_tokens
        if not isinstance(block, int) or isinstance(block, bool) or not 0 < block <= 2**20:
            raise TraceError(f"block_tokens must be an integer within 1..2**20, got {block!r}")
        for r in self.requests:
            if r.input_length > len(r.hash_ids) * block:
                raise TraceError(
                    f"request {r.request_id!r}: input_length {r.input_length} is more than "
                    f"its {len(r.hash_ids)} blocks of {block} tokens hold"
                )

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
        heads: list[dict] = []

        def parse(d: dict, number: int):
            if number == 1 or not heads:
                if not isinstance(d.get("trace"), dict):
                    raise TraceError("not a pdd-testbed trace (no header line with 'trace')")
                heads.append(d["trace"])
                return None
            return _request(d)

        requests = parse_lines(path, parse)
        if not heads:
            raise TraceError(f"{path}: empty file, not a pdd-testbed trace")
        head = heads[0]
        if head.get("schema_version") != SCHEMA_VERSION:
            raise TraceError(
                f"{path}: schema version {head.get('schema_version')}, expected {SCHEMA_VERSION}"
            )
        return cls._checked(path, head, requests)

    @classmethod
    def _checked(cls, path: Path, head: dict, requests: list[Request]) -> Trace:
        if not requests:
            raise TraceError(f"{path}: the trace holds no requests")
        name = str(head.get("name", Path(path).stem))
        try:
            return cls(name, head.get("block_tokens"), requests, head.get("metadata", {}))
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None

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
        meta = table.schema.metadata or {}
        if b"pdd_trace" not in meta:
            raise TraceError(f"{path}: not a pdd-testbed trace (no pdd_trace metadata)")
        head = json.loads(meta[b"pdd_trace"])
        requests = []
        for number, row in enumerate(table.to_pylist(), 1):
            try:
                requests.append(_request(row))
            except (KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{path}: row {number}: {exc}") from None
        return cls._checked(path, head, requests)

    @classmethod
    def load(cls, path: Path) -> Trace:
        path = Path(path)
        return cls.from_parquet(path) if path.suffix == ".parquet" else cls.from_jsonl(path)

    def save(self, path: Path) -> None:
        path = Path(path)
        self.to_parquet(path) if path.suffix == ".parquet" else self.to_jsonl(path)


def _request(d: dict) -> Request:
    d = dict(d)
    d.setdefault("output_hash_ids", None)
    d["output_hash_ids"] = d["output_hash_ids"] or ()
    for name in ("hash_ids", "output_hash_ids"):
        value = d[name]
        if not isinstance(value, list | tuple) or (name == "hash_ids" and not value):
            raise TraceError(f"{name} must be a list of block ids, got {value!r}")
        d[name] = tuple(value)
    known = {f.name for f in fields(Request)}
    if unknown := set(d) - known:
        raise TraceError(f"unknown fields {sorted(unknown)}")
    return Request(**d)
