"""The interim ``make bench``: one colocated server, a small fixed request set, TTFT/ITL.

Every number printed is measured on a real SGLang server; the request set is fixed
(prompts drawn from seed 0) so runs are comparable.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from reports.metrics import PERCENTILES, Metric
from testbed.server import ServerSpec, SGLangServer
from workloads.client import stream_generate

PROMPT_LENGTHS = (128, 512, 2048)
OUTPUT_TOKENS = 32


def fixed_requests(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Each prompt length twice: the second copy shows the prefix cache at work."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]
    return [p for p in prompts for _ in range(2)]


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolation percentile (numpy's default); NaN for no values."""
    return float(np.percentile(values, p)) if len(values) else float("nan")


def run_quickbench(model_path: Path, port: int, out: Path, console: Console) -> Path:
    run_dir = out / time.strftime("quickbench-%Y%m%d-%H%M%S")
    spec = ServerSpec(model_path=model_path, port=port)
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    rows = []
    with SGLangServer(spec, run_dir / "server.log") as server:
        console.print(f"starting a colocated SGLang server ({model_path.name}) ...")
        server.wait_healthy()
        with httpx.Client() as client:
            for i, prompt in enumerate(fixed_requests(vocab)):
                r = stream_generate(client, spec.url, prompt, OUTPUT_TOKENS)
                rows.append({
                    "request": i,
                    Metric.PROMPT_TOKENS: len(prompt),
                    Metric.CACHED_TOKENS: r.cached_tokens,
                    Metric.OUTPUT_TOKENS: len(r.output_ids),
                    Metric.TTFT: r.ttft,
                    Metric.ITL: statistics.mean(r.itls),
                    Metric.E2E: r.e2e,
                })  # fmt: skip
                console.print(
                    f"  request {i}: prompt {len(prompt)}, cached {r.cached_tokens}, "
                    f"TTFT {r.ttft * 1000:.1f} ms"
                )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(rows, indent=2))
    console.print(summary_table(rows))
    console.print(f"raw results: {run_dir / 'results.json'}")
    return run_dir


def summary_table(rows: list[dict]) -> Table:
    table = Table(title="colocated SGLang on this host (measured)")
    table.add_column("metric")
    for p in PERCENTILES:
        table.add_column(f"P{p} (ms)", justify="right")
    for metric in (Metric.TTFT, Metric.ITL, Metric.E2E):
        values = [row[metric] for row in rows]
        table.add_row(metric.label, *(f"{percentile(values, p) * 1000:.1f}" for p in PERCENTILES))
    return table
