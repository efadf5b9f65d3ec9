"""The fidelity sweep behind ``make bench-net``: configured vs measured over a grid of WANs.

For each (rate, delay, loss) the two-site network is built, checked with
:func:`topologies.check.check_network`, and the CPU time of the emulation daemons
during the check is reported as a share of one core.
"""

from __future__ import annotations

import csv
import itertools
import os
import time
from collections.abc import Iterable
from pathlib import Path

from topologies.check import Measurement, check_network
from topologies.link import LinkSpec
from topologies.network import Network
from topologies.spec import NetworkSpec

RATES_MBIT = (50, 100, 200, 400)
DELAYS_MS = (5, 10, 25)
LOSSES_PCT = (0.0, 0.1, 1.0)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def sweep(
    rates=RATES_MBIT,
    delays=DELAYS_MS,
    losses=LOSSES_PCT,
    seconds: float = 4.0,
    backend: str = "auto",
    on_row=None,
) -> list[dict]:
    rows = []
    for rate, delay, loss in itertools.product(rates, delays, losses):
        wan = LinkSpec(rate_mbit=rate, delay_ms=delay, loss_pct=loss)
        with Network(NetworkSpec(wan=wan, backend=backend), name="fidelity") as net:
            pids = [pid for link in net.applied for pid in link.daemon_pids]
            cpu0, t0 = cpu_seconds(pids), time.monotonic()
            measured = _measure(net, seconds)
            cpu_share = (cpu_seconds(pids) - cpu0) / (time.monotonic() - t0)
        for m in measured:
            row = {
                "rate_mbit": rate,
                "delay_ms": delay,
                "loss_pct": loss,
                "backend": net.backend_name,
                **m.as_row(),
                "emulation_cpu_core_share": cpu_share,
            }
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _measure(net: Network, seconds: float, attempts: int = 2) -> list[Measurement]:
    """check_network, retried once; a measurement that still fails is a failed row."""
    for attempt in range(attempts):
        try:
            return check_network(net, seconds)
        except RuntimeError as exc:
            error = str(exc)
            if attempt + 1 < attempts:
                time.sleep(1.0)
    return [Measurement("WAN", "measurement_error", None, float("nan"), error[:200], False)]


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
