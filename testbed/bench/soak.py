"""``make soak`` (not in CI): a long run on a lossy, jittery WAN, watching for failures
and for memory that grows.

The soak scenario's systems run the bench's way (deployment, warm-up, Locust replaying
the trace for ``workload.duration_s``); meanwhile every process of the deployment
(servers and their children, router, link emulators, Locust) has its RSS sampled every
``every_s``. Per process, growth = the median of the last samples over the median of
the first samples after ``warmup_s``. Targets: 0 failed requests, growth ≤ 5% for
every process. Writes ``rss.csv`` and ``soak.json`` beside the system's run.

Lifecycle: ``run(scenario, out, console)`` → per system: run_system(..., on_tick=
sampler) → rows summarized → soak.json; exit status says whether targets were met.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from protocol.records import read_records, write_atomic
from testbed import cpu_share
from testbed.bench.run import run_system
from testbed.deployment import Deployment
from testbed.run_dirs import new_run_dir
from testbed.scenario import Scenario

MAX_GROWTH = 0.05


class Sampler:
    """Called about once a second by the bench; samples every ``every_s``."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.rows: list[dict] = []
        self._last = 0.0
        self.t0: float | None = None

    def __call__(self, deployment: Deployment) -> None:
        now = time.time()
        if now - self._last < self.every_s:
            return
        self._last = now
        self.t0 = self.t0 or now
        for r in cpu_share.memory(deployment.net):
            self.rows.append({"t_s": round(now - self.t0, 1), **r})


def growth(rows: list[dict], warmup_s: float, tail: int = 3) -> list[dict]:
    """Per process (host, pid): RSS after warm-up, at the end, and the growth ratio."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return []
    out = []
    for (host, pid, what), g in frame.groupby(["host", "pid", "process"]):
        after = g[g["t_s"] >= warmup_s].sort_values("t_s")
        if len(after) < 2 * tail:
            continue  # a process that did not live through the soak (a restart, a probe)
        start = statistics.median(after["rss"].head(tail))
        end = statistics.median(after["rss"].tail(tail))
        out.append(
            {
                "host": host,
                "pid": int(pid),
                "process": what,
                "rss_start_mb": round(start / 2**20, 1),
                "rss_end_mb": round(end / 2**20, 1),
                "growth": round(end / start - 1, 4) if start else None,
            }
        )
    return out


def run(scenario: Scenario, out: Path, console: Console, warmup_s: float = 300.0) -> dict:
    run_dir = new_run_dir(out, f"soak-{scenario.name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    trace = scenario.workload.materialize(run_dir)
    result: dict = {"scenario": scenario.name, "warmup_s": warmup_s, "systems": {}}
    for system in scenario.systems:
        sampler = Sampler()
        run_system(scenario, system, trace, run_dir, console, on_tick=sampler)
        records = read_records(run_dir / system / "records.jsonl")
        failed = [r for r in records if r.status != "ok"]
        rows = growth(sampler.rows, warmup_s)
        pd.DataFrame(sampler.rows).to_csv(run_dir / system / "rss.csv", index=False)
        worst = max((r["growth"] for r in rows if r["growth"] is not None), default=None)
        result["systems"][system] = {
            "requests": len(records),
            "failed": len(failed),
            "errors": sorted({f"{r.status}: {r.error}"[:200] for r in failed})[:10],
            "processes": rows,
            "worst_growth": worst,
            "meets_targets": not failed and worst is not None and worst <= MAX_GROWTH,
        }
    write_atomic(run_dir / "soak.json", json.dumps(result, indent=2))
    for system, r in result["systems"].items():
        console.print(table(system, r))
    console.print(f"soak: {run_dir}")
    return result


def table(system: str, r: dict) -> Table:
    t = Table(
        title=f"soak {system}: {r['requests']} requests, {r['failed']} failed; "
        f"RSS growth after warm-up (target ≤ {MAX_GROWTH:.0%})"
    )
    for c in ("host", "process", "pid", "rss_start_mb", "rss_end_mb", "growth"):
        t.add_column(c.replace("_", " "))
    for p in r["processes"]:
        t.add_row(
            p["host"],
            p["process"],
            str(p["pid"]),
            str(p["rss_start_mb"]),
            str(p["rss_end_mb"]),
            f"{p['growth']:+.1%}",
        )
    return t
