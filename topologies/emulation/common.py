"""Mechanisms both backends share: offloads off, and loss after segmentation."""

from __future__ import annotations

from topologies.emulation.base import EmulationError, LinkEnd
from topologies.link import LinkSpec
from topologies.netns import NetworkError, run

LOSS_TABLE = "pddtb_loss"
LOSS_MECHANISM = "nftables numgen drop at the receiving end's ingress (after segmentation)"


def mechanisms_for(spec: LinkSpec, **by_parameter: str) -> dict[str, str]:
    """Which mechanism applied each parameter the spec sets (mtu and loss are common)."""
    applied = {"mtu": "ip link mtu"}
    if spec.rate_mbit:
        applied["rate_mbit"] = "tc htb (burst ≈ 1 ms of rate)"
    if spec.loss_pct:
        applied["loss_pct"] = LOSS_MECHANISM
    for parameter, mechanism in by_parameter.items():
        # The queue limit sits under the rate limiter: it applies only to a shaped link.
        applies = spec.rate_mbit if parameter == "queue_packets" else getattr(spec, parameter)
        if applies:
            applied[parameter] = mechanism
    return applied


def disable_offloads(end: LinkEnd) -> None:
    """Segment before the wire: a drop then hits one packet, not a 64 KB GSO burst."""
    try:
        run(["ethtool", "-K", end.intf, "tso", "off", "gso", "off", "gro", "off"], ns=end.ns)
    except NetworkError as exc:
        raise EmulationError(f"cannot disable offloads on {end.intf}: {exc}") from exc


def apply_loss(end: LinkEnd, spec: LinkSpec) -> None:
    """Drop ``loss_pct`` of the packets arriving on ``end`` (the peer's egress direction)."""
    threshold = round(spec.loss_pct * 10_000)  # of 1,000,000
    rules = f"""
table inet {LOSS_TABLE} {{
  chain ingress_loss {{
    type filter hook prerouting priority -300; policy accept;
    iifname "{end.intf}" numgen random mod 1000000 < {threshold} counter drop
  }}
}}
"""
    try:
        run(["nft", "-f", "-"], ns=end.ns, input=rules)
    except NetworkError as exc:
        raise EmulationError(f"cannot apply {spec.loss_pct}% loss on {end.intf}: {exc}") from exc


def loss_drops(ns: str) -> int:
    """Packets dropped so far by the loss rule in ``ns`` (0 when there is none)."""
    done = run(["nft", "list", "table", "inet", LOSS_TABLE], ns=ns, check=False)
    for line in done.stdout.splitlines():
        if "counter packets" in line:
            return int(line.split("counter packets")[1].split()[0])
    return 0


def expect_shaping(applied, end: LinkEnd, spec: LinkSpec) -> None:
    """The rate and loss rules the watchdog checks are still in place on ``end``."""
    if spec.rate_mbit:
        argv = ["tc", "qdisc", "show", "dev", end.intf]
        applied.expect(end.ns, "rate", argv, "htb", f"the htb rate limiter on {end.intf}")
    if spec.loss_pct:
        argv = ["nft", "list", "table", "inet", LOSS_TABLE]
        applied.expect(end.ns, "loss", argv, f'"{end.intf}"', f"the loss rule on {end.intf}")
