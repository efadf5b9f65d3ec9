"""Readers for public traces, registered by name; each returns a :class:`Trace`.

* ``mooncake`` — Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (cumulative prefix blocks of 512 tokens). No session
  ids: every request is its own session, replayed open-loop by arrival.
* ``azure`` — Azure LLM inference 2023 CSV: ``TIMESTAMP, ContextTokens,
  GeneratedTokens``. No prefix information: every prompt gets fresh blocks.
* ``tracelab`` — TraceLab round traces (agent steps): per step ``input_tokens_total``,
  ``prefix_tokens`` (cached), ``output_tokens``, timing events. A step's prompt
  reuses the session's blocks up to ``prefix_tokens``; think time is the gap from the
  previous step's last event to this step's first.
* ``pdd`` — this project's own schema (JSON lines or parquet).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from workloads.trace import Request, Trace

MOONCAKE_BLOCK = 512


def read_mooncake(path: Path) -> Trace:
    requests = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            d = json.loads(line)
            requests.append(
                Request(
                    request_id=f"r{i}",
                    session_id=f"r{i}",
                    turn=0,
                    hash_ids=tuple(d["hash_ids"]),
                    input_length=int(d["input_length"]),
                    output_length=max(1, int(d["output_length"])),
                    arrival_s=d["timestamp"] / 1000.0,
                )
            )
    return Trace(
        Path(path).stem, MOONCAKE_BLOCK, requests, {"source": "mooncake", "path": str(path)}
    )


def read_azure(path: Path, block_tokens: int = 512) -> Trace:
    requests, next_block, start = [], 0, None
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            t = _azure_time(row["TIMESTAMP"])
            start = t if start is None else start
            length = int(row["ContextTokens"])
            blocks = -(-length // block_tokens)
            requests.append(
                Request(
                    request_id=f"r{i}",
                    session_id=f"r{i}",
                    turn=0,
                    hash_ids=tuple(range(next_block, next_block + blocks)),
                    input_length=length,
                    output_length=max(1, int(row["GeneratedTokens"])),
                    arrival_s=t - start,
                )
            )
            next_block += blocks
    return Trace(Path(path).stem, block_tokens, requests, {"source": "azure", "path": str(path)})


def _azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than %f takes.
    whole, _, frac = text.partition(".")
    return datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp() + float(f"0.{frac or 0}")


def read_tracelab(path: Path, block_tokens: int = 64) -> Trace:
    with open(path) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    by_session: dict[str, list[dict]] = {}
    for s in steps:
        by_session.setdefault(s["session_id"], []).append(s)
    requests, next_block = [], 0
    for session, rounds in by_session.items():
        rounds.sort(key=lambda s: s["round_index"])
        blocks: list[int] = []
        prev_end = None
        for s in rounds:
            total, prefix = int(s["input_tokens_total"]), int(s["prefix_tokens"] or 0)
            keep = min(len(blocks), prefix // block_tokens)
            need = -(-total // block_tokens) - keep
            blocks = blocks[:keep] + list(range(next_block, next_block + need))
            next_block += need
            times = sorted(
                _iso(e["timestamp"]) for e in s.get("timing_events", []) if e.get("timestamp")
            )
            think = None if prev_end is None or not times else max(0.0, times[0] - prev_end)
            prev_end = times[-1] if times else prev_end
            requests.append(
                Request(
                    request_id=s.get("round_id") or f"{session}:{s['round_index']}",
                    session_id=session,
                    turn=int(s["round_index"]),
                    hash_ids=tuple(blocks),
                    input_length=total,
                    output_length=max(1, int(s["output_tokens"] or 1)),
                    think_time_s=think,
                )
            )
    return Trace(Path(path).stem, block_tokens, requests, {"source": "tracelab", "path": str(path)})


def _iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


READERS: dict[str, Callable[[Path], Trace]] = {
    "mooncake": read_mooncake,
    "azure": read_azure,
    "tracelab": read_tracelab,
    "pdd": Trace.load,
}


def read_trace(path: Path, fmt: str = "auto") -> Trace:
    """Read ``path`` with the named reader, or guess from the file."""
    path = Path(path)
    if fmt == "auto":
        fmt = guess_format(path)
    try:
        reader = READERS[fmt]
    except KeyError:
        raise ValueError(
            f"unknown trace format {fmt!r}; known: auto, {', '.join(READERS)}"
        ) from None
    return reader(path)


def guess_format(path: Path) -> str:
    if path.suffix == ".parquet":
        return "pdd"
    if path.suffix == ".csv":
        return "azure"
    with open(path) as f:
        first = json.loads(f.readline())
    if "trace" in first:
        return "pdd"
    if "hash_ids" in first:
        return "mooncake"
    if "input_tokens_total" in first:
        return "tracelab"
    raise ValueError(f"{path}: cannot tell the trace format; pass --format")
