"""``make bench-transfer``: KV goodput over the emulated WAN, and the baselines' TTFT.

1. Goodput: on a clean WAN (no loss), one cross-site PD request per transfer size;
   goodput = KV payload / (last byte − first byte), as a fraction of the WAN rate.
2. TTFT: the three baselines, each on the same network and the same fixed request mix
   (sessions of growing prompts), P50/P90/P99 side by side.
"""

from __future__ import annotations

import csv
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from protocol import headers
from protocol.metrics import PERCENTILES, percentile
from protocol.records import read_records
from testbed.deployment import Deployment
from testbed.run_dirs import new_run_dir
from testbed.scenario import Scenario, ServersSpec
from topologies.link import LinkSpec
from topologies.spec import NetworkSpec
from workloads.client import generate_payload

SIZES_MB = (1, 2, 4, 8, 16, 32, 64)
BASELINES = ("colocated", "same_site_pd", "cross_site_pd")


# How KV frames are protected (servers.frame_auth, servers.tls): what each costs.
PROTECTION = {
    "none": {"frame_auth": False, "tls": False},
    "hmac": {"frame_auth": True, "tls": False},  # the default
    "hmac+tls": {"frame_auth": True, "tls": True},
}
PROTECTION_RATE_MBIT = 2000.0  # a line fast enough that the CPU's share shows
PROTECTION_SIZES_MB = (4, 16, 64)


def goodput_rows(
    run_dir: Path,
    rate_mbit: float,
    console: Console,
    protection: str = "hmac",
    sizes: tuple[int, ...] = SIZES_MB,
) -> list[dict]:
    scenario = Scenario(
        name="bench_transfer",
        network=NetworkSpec(wan=LinkSpec(rate_mbit=rate_mbit, delay_ms=10, queue_packets=2000)),
        # One chunk per prompt: the whole KV is ready at once, so the sweep measures
        # the transfer, not prefill compute between chunks.
        servers=ServersSpec(
            max_total_tokens=20000,
            extra_args=["--chunked-prefill-size", "16384"],
            **PROTECTION[protection],
        ),
        systems=["cross_site_pd"],
    )
    rows = []
    rng = random.Random(0)
    with Deployment(scenario, "cross_site_pd", run_dir / f"goodput-{protection}") as d:
        from testbed import model as model_mod

        kv_per_token = model_mod.describe(d.scenario.model.resolve())["kv_bytes_per_token"]
        # A first transfer opens the (reused) connection, as a serving system's would.
        warm = [rng.randrange(10, 4000) for _ in range(64)]
        httpx.post(f"{d.router_url}/generate", json=generate_payload(warm, 1, False), timeout=600)
        for size in sizes:
            tokens = size * (1 << 20) // kv_per_token
            prompt = [rng.randrange(10, 4000) for _ in range(tokens)]
            r = httpx.post(
                f"{d.router_url}/generate",
                json=generate_payload(prompt, 1, False),
                headers={headers.SESSION: f"size-{size}"},
                timeout=600,
            )
            r.raise_for_status()
            time.sleep(0.3)
            rec = [x for x in read_records(d.records_path) if x.session_id == f"size-{size}"][-1]
            mbit = rec.kv_bytes * 8 / rec.kv_transfer_s / 1e6
            row = {
                "protection": protection,
                "size_mb": size,
                "kv_bytes": rec.kv_bytes,
                "transfer_s": rec.kv_transfer_s,
                "goodput_mbit": mbit,
                "wan_rate_mbit": rate_mbit,
                "fraction_of_rate": mbit / rate_mbit,
            }
            console.print(
                f"  {size:>3} MB: {mbit:6.1f} Mbit/s = {mbit / rate_mbit:.0%} of the WAN rate"
            )
            rows.append(row)
    return rows


def request_mix(seed: int = 0, sessions: int = 6, turns: int = 3) -> list[list[list[int]]]:
    """Sessions of growing prompts: each turn adds ~20% new tokens (prefix reuse)."""
    rng = random.Random(seed)
    mix = []
    for _ in range(sessions):
        prompt = [rng.randrange(10, 4000) for _ in range(rng.randrange(800, 2400))]
        session = []
        for _ in range(turns):
            session.append(list(prompt))
            prompt += [rng.randrange(10, 4000) for _ in range(len(prompt) // 5)]
        mix.append(session)
    return mix


def baseline_ttft_rows(
    run_dir: Path, console: Console, scenario_name: str = "baselines"
) -> list[dict]:
    scenario = Scenario.load(scenario_name)
    mix = request_mix()
    rows = []
    for system in BASELINES:
        console.print(f"  {system}: bringing up ...")
        with Deployment(scenario, system, run_dir / system) as d:

            def run_session(i_session):
                i, session = i_session
                with httpx.Client(timeout=600) as client:
                    for turn, prompt in enumerate(session):
                        client.post(
                            f"{d.router_url}/generate",
                            json=generate_payload(prompt, 32, True),
                            headers={headers.SESSION: f"s{i}", headers.TURN: str(turn)},
                        )

            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(run_session, enumerate(mix)))
            time.sleep(0.5)
            records = [r for r in read_records(d.records_path) if r.status == "ok"]
        ttfts = [r.ttft for r in records if r.ttft is not None]
        row = {
            "system": system,
            "requests": len(records),
            **{f"ttft_p{p}_s": percentile(ttfts, p) for p in PERCENTILES},
        }
        console.print(
            f"  {system}: TTFT P50 {row['ttft_p50_s']:.3f} s, P99 {row['ttft_p99_s']:.3f} s"
        )
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def run(out: Path, rate_mbit: float, console: Console) -> Path:
    run_dir = new_run_dir(out, "bench-transfer")
    run_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"KV goodput over a clean {rate_mbit:g} Mbit/s WAN (10 ms one way):")
    goodput = goodput_rows(run_dir, rate_mbit, console)
    write_csv(goodput, run_dir / "goodput.csv")
    console.print(f"What frame protection costs, at {PROTECTION_RATE_MBIT:g} Mbit/s:")
    protected = [
        row
        for name in PROTECTION
        for row in goodput_rows(run_dir, PROTECTION_RATE_MBIT, console, name, PROTECTION_SIZES_MB)
    ]
    write_csv(protected, run_dir / "protection.csv")
    console.print("TTFT of the baselines on scenario 'baselines', one fixed request mix:")
    ttft = baseline_ttft_rows(run_dir, console)
    write_csv(ttft, run_dir / "ttft.csv")

    table = Table(title="KV transfer goodput (target: >= 90% of the rate for >= 8 MB)")
    for col in ("size", "goodput (Mbit/s)", "fraction of rate", "target met"):
        table.add_column(col, justify="right")
    for r in goodput:
        target = "yes" if r["size_mb"] < 8 or r["fraction_of_rate"] >= 0.9 else "NO"
        table.add_row(
            f"{r['size_mb']} MB",
            f"{r['goodput_mbit']:.1f}",
            f"{r['fraction_of_rate']:.2f}",
            target if r["size_mb"] >= 8 else "-",
        )
    console.print(table)
    console.print(protection_table(protected))
    table = Table(title="TTFT of the baselines (s), side by side")
    for col in ("system", "requests", "P50", "P90", "P99"):
        table.add_column(col, justify="right")
    for r in ttft:
        table.add_row(
            r["system"], str(r["requests"]), *(f"{r[f'ttft_p{p}_s']:.3f}" for p in (50, 90, 99))
        )
    console.print(table)
    console.print(f"CSVs in {run_dir}")
    return run_dir


def protection_table(rows: list[dict]) -> Table:
    """Transfer time per size and protection, each as a ratio of unprotected frames'."""
    plain = {r["size_mb"]: r["transfer_s"] for r in rows if r["protection"] == "none"}
    table = Table(title=f"KV transfer by frame protection at {PROTECTION_RATE_MBIT:g} Mbit/s")
    for col in ("protection", "size", "transfer (s)", "goodput (Mbit/s)", "time vs none"):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = r["transfer_s"] / plain[r["size_mb"]] if plain.get(r["size_mb"]) else None
        table.add_row(
            r["protection"],
            f"{r['size_mb']} MB",
            f"{r['transfer_s']:.3f}",
            f"{r['goodput_mbit']:.0f}",
            f"x{ratio:.2f}" if ratio else "-",
        )
    return table
