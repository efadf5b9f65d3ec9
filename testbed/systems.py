"""The systems a benchmark compares, registered by name.

A system says which SGLang servers run (server role → the network role whose host
runs it) and which routing policy the router uses. All systems run on the same
two-site network, so they meet the same WAN: ``same_site_pd`` puts its decode server
on site A's relay-decode host, ``cross_site_pd`` on site B's main-decode host.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.names import Role


@dataclass(frozen=True)
class SystemSpec:
    name: str
    policy: str
    servers: tuple[tuple[Role, str], ...]  # (server role, network role of its host)
    description: str

    @property
    def relayed(self) -> bool:
        """Runs PDD's relayed pipeline (relay and main decode, the handoff)."""
        return self.policy in RELAYED_POLICIES


RELAYED_POLICIES = ("pdd", "threshold")
PDD_SERVERS = (
    (Role.PREFILL, "prefill"),
    (Role.RELAY_DECODE, "relay_decode"),
    (Role.MAIN_DECODE, "main_decode"),
)

SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec(
            "colocated",
            "colocated",
            ((Role.COLOCATED, "prefill"),),
            "one server prefills and decodes (site A)",
        ),
        SystemSpec(
            "same_site_pd",
            "pd",
            ((Role.PREFILL, "prefill"), (Role.DECODE, "relay_decode")),
            "prefill and decode in site A over the LAN",
        ),
        SystemSpec(
            "cross_site_pd",
            "pd",
            ((Role.PREFILL, "prefill"), (Role.DECODE, "main_decode")),
            "prefill in site A, decode in site B over the WAN",
        ),
        SystemSpec(
            "pdd",
            "pdd",
            PDD_SERVERS,
            "prefill and relay decode in site A, main decode in site B; token-ID handoff",
        ),
        SystemSpec(
            "pdd_threshold",
            "threshold",
            PDD_SERVERS,
            "pdd's servers, relayed by uncached prompt length alone (a PrfaaS-like threshold)",
        ),
    )
}


def get_system(name: str) -> SystemSpec:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None
