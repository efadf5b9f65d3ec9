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
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from workloads.trace import MAX_PROMPT_TOKENS, Request, Trace, TraceError, parse_lines

MOONCAKE_BLOCK = 512


def read_mooncake(path: Path) -> Trace:
    def parse(d: dict, number: int) -> Request:
        return Request(
            request_id=f"r{number}",
            session_id=f"r{number}",
            turn=0,
            hash_ids=_block_ids(d["hash_ids"]),
            input_length=_count(d["input_length"], "input_length"),
            output_length=max(1, _count(d["output_length"], "output_length")),
            arrival_s=_number(d["timestamp"], "timestamp") / 1000.0,
        )

    requests = parse_lines(path, parse)
    return _trace(path, MOONCAKE_BLOCK, requests, "mooncake")


def _trace(path: Path, block: int, requests: list[Request], source: str) -> Trace:
    if not requests:
        raise TraceError(f"{path}: the trace holds no requests")
    try:
        return Trace(Path(path).stem, block, requests, {"source": source, "path": str(path)})
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None


def _count(value, name: str) -> int:
    """A token count: a non-negative integer (a whole float such as 12.0 too), at most
    ``MAX_PROMPT_TOKENS``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TraceError(f"{name} must be an integer, got {value!r}")
    if not 0 <= value <= MAX_PROMPT_TOKENS:
        raise TraceError(f"{name} must be within 0..{MAX_PROMPT_TOKENS:,}, got {value!r}")
    return int(value)


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _block_ids(value) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise TraceError(f"hash_ids must be a non-empty list of block ids, got {value!r}")
    return tuple(value)


def read_azure(path: Path, block_tokens: int = 512) -> Trace:
    requests, next_block, start = [], 0, None
    with open(path, newline="") as f:
        for number, row in enumerate(csv.DictReader(f), 2):
            try:
                t = _azure_time(row["TIMESTAMP"])
                length = _count(int(row["ContextTokens"]), "ContextTokens")
                out = _count(int(row["GeneratedTokens"]), "GeneratedTokens")
            except (KeyError, TypeError, ValueError) as exc:
                what = f"missing column {exc}" if isinstance(exc, KeyError) else str(exc)
                raise TraceError(f"{path}:{number}: {what}") from None
            start = t if start is None else start
            blocks = -(-length // block_tokens)
            try:
                requests.append(
                    Request(
                        request_id=f"r{number}",
                        session_id=f"r{number}",
                        turn=0,
                        hash_ids=tuple(range(next_block, next_block + blocks)),
                        input_length=length,
                        output_length=max(1, out),
                        arrival_s=t - start,
                    )
                )
            except ValueError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None
            next_block += blocks
    return _trace(path, block_tokens, requests, "azure")


def _azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than %f takes.
    whole, _, frac = text.partition(".")
    return datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp() + float(f"0.{frac or 0}")


def read_tracelab(path: Path, block_tokens: int = 64) -> Trace:
    steps = parse_lines(path, lambda d, number: {**d, "_line": number})
    by_session: dict[str, list[dict]] = {}
    for s in steps:
        by_session.setdefault(str(s.get("session_id")), []).append(s)
    requests, next_block = [], 0
    for session, rounds in by_session.items():
        try:
            rounds.sort(key=lambda s: _count(s["round_index"], "round_index"))
        except (KeyError, TraceError) as exc:
            raise TraceError(f"{path}: session {session}: {exc}") from None
        blocks: list[int] = []
        prev_end = None
        for s in rounds:
            try:
                total = _count(s["input_tokens_total"], "input_tokens_total")
                prefix = _count(s["prefix_tokens"] or 0, "prefix_tokens")
                keep = min(len(blocks), prefix // block_tokens)
                need = -(-total // block_tokens) - keep
                blocks = blocks[:keep] + list(range(next_block, next_block + need))
                next_block += need
                times = sorted(
                    _iso(e["timestamp"]) for e in s.get("timing_events") or [] if e.get("timestamp")
                )
                think = None if prev_end is None or not times else max(0.0, times[0] - prev_end)
                prev_end = times[-1] if times else prev_end
                requests.append(
                    Request(
                        request_id=str(s.get("round_id") or f"{session}:{s['round_index']}"),
                        session_id=session,
                        turn=int(s["round_index"]),
                        hash_ids=tuple(blocks),
                        input_length=total,
                        output_length=max(1, _count(s["output_tokens"] or 1, "output_tokens")),
                        think_time_s=think,
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise TraceError(f"{path}:{s['_line']}: {what}") from None
    return _trace(path, block_tokens, requests, "tracelab")


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
        line = next((x for x in f if x.strip()), None)
    if line is None:
        raise TraceError(f"{path}: empty file")
    try:
        first = json.loads(line)
    except json.JSONDecodeError:
        raise TraceError(f"{path}: the first line is not JSON; pass --format") from None
    if not isinstance(first, dict):
        raise TraceError(f"{path}: the first line is not a JSON object")
    if "trace" in first:
        return "pdd"
    if "hash_ids" in first:
        return "mooncake"
    if "input_tokens_total" in first:
        return "tracelab"
    raise TraceError(f"{path}: cannot tell the trace format; pass --format")
