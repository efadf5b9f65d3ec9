"""``testbed doctor``: the preflight of hosts the testbed did not launch itself.

Each host runs ``testbed serve --agent-port`` (``testbed.agent``). Per host the doctor
checks: the agent answers; it serves the same model as the harness holds (content
hash); the same SGLang, project and torch versions; and its clock, measured NTP-style
(several probes; the one with the shortest round trip places the host's ``time_ns``
between the doctor's send and receive times), is within ``max_offset_s`` of this one.
Each problem names its host; the offsets are returned so a run can record them.

For a scenario's inventory (:func:`check_inventory`) each host is also checked against
what the scenario needs of it: a server of the role each system puts there, the
scenario's bootstrap and handoff ports, a transfer log, the deployment's frame key
(by fingerprint) and a KV pool of ``servers.max_total_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from protocol.frames import read_frame_key
from protocol.names import Role
from testbed.agent import key_fingerprint, model_hash, versions
from testbed.systems import get_system

PROBES = 5


@dataclass
class HostCheck:
    url: str
    role: str = "?"
    offset_ms: float | None = None  # host clock − this clock
    rtt_ms: float | None = None
    problems: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # what its agent said

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
    found.role, found.info = str(info.get("role", "?")), info
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


def check_inventory(scenario) -> list[HostCheck]:
    """Each inventory host as a run of ``scenario`` needs it (see the module docstring)."""
    inv = scenario.inventory
    key = ""
    if scenario.servers.frame_auth:
        key = read_frame_key(inv.frame_key_file)
    local_hash, local_versions = model_hash(scenario.model.resolve()), versions()
    relayed = any(get_system(name).relayed for name in scenario.systems)
    checks = []
    for host in inv.hosts:
        found = check_host(host.agent_url, local_hash, local_versions, inv.max_clock_offset_s)
        checks.append(found)
        if not found.info:
            continue
        info, name = found.info, f"{host.name} ({host.agent_url})"
        for want in _roles_at(scenario, host.place):
            if found.role not in list(Role) or Role(found.role).launched_as != want.launched_as:
                found.problems.append(
                    f"{name} runs a {found.role} server, but a system puts its {want} there"
                )
        if info.get("port") != host.port:
            found.problems.append(
                f"{name}: its server listens on {info.get('port')}, the inventory says {host.port}"
            )
        if (
            host.place == "prefill"
            and info.get("bootstrap_port") != scenario.servers.bootstrap_port
        ):
            found.problems.append(
                f"{name}: bootstrap port {info.get('bootstrap_port')}, the scenario's "
                f"servers.bootstrap_port is {scenario.servers.bootstrap_port}"
            )
        if (
            host.place == "main_decode"
            and relayed
            and info.get("handoff_port") != scenario.pdd.handoff_port
        ):
            found.problems.append(
                f"{name}: handoff port {info.get('handoff_port')}, the scenario's "
                f"pdd.handoff_port is {scenario.pdd.handoff_port}"
            )
        if not info.get("transfer_log"):
            found.problems.append(f"{name}: started without --transfer-log (the router needs it)")
        theirs = info.get("frame_key", "")
        if theirs != key_fingerprint(key):
            if not key:
                why = "its frames are tagged, but servers.frame_auth is off"
            elif not theirs:
                why = "started without --frame-key-file, but servers.frame_auth is on"
            else:
                why = "another frame key than inventory.frame_key_file"
            found.problems.append(f"{name}: {why}")
        tokens = info.get("max_total_tokens")
        if tokens is not None and tokens < scenario.servers.max_total_tokens:
            found.problems.append(
                f"{name}: a KV pool of {tokens} tokens, below servers.max_total_tokens="
                f"{scenario.servers.max_total_tokens}"
            )
    return checks


def _roles_at(scenario, place: str) -> set[Role]:
    """The server roles the scenario's systems put on a host of this place."""
    return {
        role for name in scenario.systems for role, at in get_system(name).servers if at == place
    }
