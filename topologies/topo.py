"""The testbed's topologies as Mininet ``Topo`` classes, registered by name.

``two_site``: site A (prefill, relay-decode, router, client hosts) and site B
(main-decode hosts), each a LAN on a bridge behind a gateway; one WAN link joins the
two gateways. ``one_site``: every role in site A, no WAN (the same-site baseline).

Every node and link carries what both runtimes need: Mininet's own keys (``ip``,
``defaultRoute``, ``cls``, TCLink's ``bw``/``delay``/``loss``), so ``mn --custom`` works,
and the testbed's (``role``, ``site``, ``routes``, ``spec``, ``kind``), which
:mod:`topologies.network` uses to build the same graph with namespaces.
"""

from __future__ import annotations

from collections.abc import Callable

from mininet.node import Node
from mininet.topo import Topo

from topologies.link import LinkSpec
from topologies.site import HOST_OFFSET, SUBNET_BASE, SiteSpec

WAN_SUBNET = f"{SUBNET_BASE}.0"


class Gateway(Node):
    """A site's IP router (for ``mn --custom`` runs): forwards, and routes to the other sites."""

    def config(self, routes=(), **params):
        result = super().config(**params)
        self.cmd("sysctl -qw net.ipv4.ip_forward=1")
        for subnet, via in routes:
            self.cmd(f"ip route add {subnet} via {via}")
        return result


class SiteTopo(Topo):
    """Sites on bridged LANs behind gateways; consecutive sites joined by WAN links."""

    def build(self, sites: list[SiteSpec], wan: LinkSpec | None = None) -> None:
        names = [name for site in sites for name, _ in site.host_names()]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(
                f"a role may live in one site only; duplicated hosts: {sorted(duplicates)}"
            )
        for site in sites:
            self._add_site(site, with_gateway=len(sites) > 1)
        for i, (a, b) in enumerate(zip(sites, sites[1:], strict=False)):
            self._add_wan(a, b, wan or LinkSpec(), i, sites)

    def _add_site(self, site: SiteSpec, with_gateway: bool) -> None:
        switch = self.addSwitch(site.switch, site=site.name, dpid=f"{site.index:016x}")
        route = {"defaultRoute": f"via {site.gateway_ip}"} if with_gateway else {}
        for offset, (name, role) in enumerate(site.host_names()):
            ip = f"{SUBNET_BASE}.{site.index}.{HOST_OFFSET + offset}/24"
            self.addHost(name, ip=ip, role=role, site=site.name, **route)
            self.addLink(name, switch, kind="lan", spec=site.lan, **site.lan.mininet_params())
        if with_gateway:
            self.addHost(
                site.gateway,
                cls=Gateway,
                ip=f"{site.gateway_ip}/24",
                role="gateway",
                site=site.name,
                routes=[],
            )
            self.addLink(
                site.gateway, switch, kind="lan", spec=site.lan, **site.lan.mininet_params()
            )

    def _add_wan(self, a: SiteSpec, b: SiteSpec, wan: LinkSpec, i: int, sites) -> None:
        ip_a, ip_b = f"{WAN_SUBNET}.{4 * i + 1}", f"{WAN_SUBNET}.{4 * i + 2}"
        self.addLink(
            a.gateway,
            b.gateway,
            kind="wan",
            spec=wan,
            params1={"ip": f"{ip_a}/30"},
            params2={"ip": f"{ip_b}/30"},
            **wan.mininet_params(),
        )
        # Each gateway reaches the sites beyond the WAN through its peer.
        for gateway, peer, far in ((a, ip_b, sites[i + 1 :]), (b, ip_a, sites[: i + 1])):
            info = self.nodeInfo(gateway.gateway)
            info["routes"] = info["routes"] + [(s.subnet, peer) for s in far]


def two_site(
    hosts: dict[str, int] | None = None, wan: LinkSpec | None = None, lan: LinkSpec | None = None
) -> SiteTopo:
    """Site A: prefill, relay-decode, router, client. Site B: main-decode. One WAN."""
    counts = {"prefill": 1, "relay_decode": 1, "router": 1, "client": 1, "main_decode": 1}
    counts.update(hosts or {})
    lan = lan or LinkSpec()
    a = SiteSpec(name="A", lan=lan, roles={r: n for r, n in counts.items() if r != "main_decode"})
    b = SiteSpec(name="B", lan=lan, roles={"main_decode": counts["main_decode"]})
    return SiteTopo(sites=[a, b], wan=wan or LinkSpec(rate_mbit=100, delay_ms=10))


def one_site(
    hosts: dict[str, int] | None = None, wan: LinkSpec | None = None, lan: LinkSpec | None = None
) -> SiteTopo:
    """Every role in site A on one LAN (the same-site baseline); ``wan`` is unused."""
    counts = {"prefill": 1, "relay_decode": 0, "router": 1, "client": 1, "main_decode": 1}
    counts.update(hosts or {})
    return SiteTopo(sites=[SiteSpec(name="A", lan=lan or LinkSpec(), roles=counts)])


TOPOLOGIES: dict[str, Callable[..., SiteTopo]] = {"two_site": two_site, "one_site": one_site}


def build_topo(name: str, **kwargs) -> SiteTopo:
    try:
        factory = TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r}; known: {', '.join(TOPOLOGIES)}") from None
    return factory(**kwargs)
