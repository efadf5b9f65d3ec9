"""``testbed doctor``: the preflight of hosts the testbed did not launch itself.

Each host runs ``testbed serve --agent-port`` (``testbed.agent``). Per host the doctor
checks: the agent answers; it serves the same model as the harness holds (content
hash); the same SGLang, project and torch versions; and its clock, measured NTP-style
(several probes; the one with the shortest round trip places the host's ``time_ns``
between the doctor's send and receive times), is within ``max_offset_s`` of this one.
Each problem names its host; the offsets are returned so a run can record them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from testbed.agent import model_hash, versions

PROBES = 5


@dataclass
class HostCheck:
    url: str
    role: str = "?"
    offset_ms: float | None = None  # host clock − this clock
    rtt_ms: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def clock_offset(client: httpx.Client, url: str, probes: int = PROBES) -> tuple[float, float]:
    """(offset, round trip), in seconds, of the probe with the shortest round trip."""
    best = None
    for _ in range(probes):
        t0 = time.time_ns()
        remote = client.get(f"{url}/host").raise_for_status().json()["time_ns"]
        t1 = time.time_ns()
        sample = ((remote - (t0 + t1) / 2) / 1e9, (t1 - t0) / 1e9)
        if best is None or sample[1] < best[1]:
            best = sample
    return best


def check_host(url: str, local_hash: str, local_versions: dict, max_offset_s: float) -> HostCheck:
    found = HostCheck(url.rstrip("/"))
    try:
        with httpx.Client(timeout=10) as client:
            info = client.get(f"{found.url}/host").raise_for_status().json()
            offset, rtt = clock_offset(client, found.url)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        found.problems.append(f"{found.url}: no host agent answers ({exc})")
        return found
    found.role = str(info.get("role", "?"))
    found.offset_ms, found.rtt_ms = round(offset * 1000, 2), round(rtt * 1000, 2)
    if info.get("model_hash") != local_hash:
        found.problems.append(
            f"{found.url} ({found.role}) serves another model: weights hash "
            f"{str(info.get('model_hash'))[:12]}…, the harness has {local_hash[:12]}…"
        )
    theirs = info.get("versions") or {}
    for dist, mine in local_versions.items():
        if theirs.get(dist) != mine:
            found.problems.append(
                f"{found.url} ({found.role}) runs {dist} {theirs.get(dist)}, the harness {mine}"
            )
    if abs(offset) > max_offset_s:
        found.problems.append(
            f"{found.url} ({found.role}): clock off by {offset * 1000:+.0f} ms "
            f"(more than {max_offset_s * 1000:.0f} ms; round trip {rtt * 1000:.1f} ms): "
            "synchronise it (chrony, NTP) before a run"
        )
    return found


def run(urls: list[str], model_dir: Path, max_offset_s: float = 0.05) -> list[HostCheck]:
    local_hash, local_versions = model_hash(model_dir), versions()
    return [check_host(u, local_hash, local_versions, max_offset_s) for u in urls]
