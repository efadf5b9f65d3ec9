"""Live progress of a load: requests done of the total, ETA, TTFT P50/P90 so far and
errors, read from the client's records file as Locust appends to it.

Lifecycle: ``LoadProgress(console, label, records, total)`` as a context manager around
the load (``records``: one file, or a distributed load's one per worker); ``update()``
once a second reads the lines appended since the last call.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from protocol.metrics import percentile


class LoadProgress:
    def __init__(self, console: Console, label: str, records, total: int | None) -> None:
        paths = [records] if isinstance(records, str | Path) else list(records)
        self.offsets = {Path(p): 0 for p in paths}
        self.total = total
        self.ttfts: list[float] = []
        self.done = self.errors = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[live]}"),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task(label, total=total, live="")

    def __enter__(self) -> LoadProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self) -> None:
        self._read_new()
        live = f"{self.errors} errors"
        if self.ttfts:
            p50, p90 = percentile(self.ttfts, 50), percentile(self.ttfts, 90)
            live = f"TTFT P50 {p50:.2f} s, P90 {p90:.2f} s; " + live
        self.progress.update(self.task, completed=self.done, live=live)

    def _read_new(self) -> None:
        for path, offset in self.offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # only whole lines; the rest is read next time
            self.offsets[path] = offset + end
            for line in data[:end].splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.done += 1
                if r.get("status") != "ok":
                    self.errors += 1
                elif r.get("first_token") is not None:
                    self.ttfts.append(r["first_token"] - r["sent"])
