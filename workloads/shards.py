"""A distributed load's records: each Locust worker writes its own file, merged after
(every request once). No Locust import here: the bench process must not be
monkey-patched by gevent."""

from __future__ import annotations

import json
from pathlib import Path


def shard_path(records: str, shard: int, shards: int) -> str:
    """Each worker of a distributed run writes its own records file (merged after)."""
    if not records or shards == 1:
        return records
    path = Path(records)
    return str(path.with_name(f"{path.stem}-w{shard}{path.suffix}"))


def merge_shards(records: Path, shards: int) -> int:
    """The workers' records files into one (``records``); every request once. Returns
    how many; a request id in two files is an error."""
    seen: set[str] = set()
    lines: list[str] = []
    for shard in range(shards):
        part = Path(shard_path(str(records), shard, shards))
        if not part.exists():
            continue
        for line in part.read_text().splitlines():
            if not line.strip():
                continue
            rid = json.loads(line)["request_id"]
            if rid in seen:
                raise ValueError(f"request {rid} was replayed by two workers")
            seen.add(rid)
            lines.append(line)
    Path(records).write_text("".join(x + "\n" for x in lines))
    return len(lines)
