"""The link-emulator interface and the record of what applied each parameter."""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from topologies.link import LinkSpec
from topologies.netns import NetworkError, run


class EmulationError(NetworkError):
    """A link parameter cannot be applied (never downgraded to a warning)."""


@dataclass(frozen=True)
class LinkEnd:
    """One side of a link: an interface inside a namespace (None: the host's own)."""

    ns: str | None
    intf: str


@dataclass
class AppliedLink:
    """What was applied to a link, by which mechanism, and what must be torn down."""

    name: str
    backend: str
    spec: dict
    mechanisms: dict[str, str] = field(default_factory=dict)  # parameter → mechanism
    daemon_pids: list[int] = field(default_factory=list)
    # What must stay in place while the link runs, each {ns, kind, argv, needle, what}:
    # the command's output holds ``needle`` as long as the rule is there.
    checks: list[dict] = field(default_factory=list)

    def expect(self, ns: str | None, kind: str, argv: list[str], needle: str, what: str) -> None:
        self.checks.append({"ns": ns, "kind": kind, "argv": argv, "needle": needle, "what": what})


class LinkEmulator(ABC):
    name: str

    @abstractmethod
    def probe(self) -> str | None:
        """None when this backend works on this host, else the reason it does not."""

    @abstractmethod
    def apply(
        self, name: str, a: LinkEnd, b: LinkEnd | None, spec: LinkSpec, log_dir
    ) -> AppliedLink:
        """Shape both directions of the link a↔b (``b`` None: ``a``'s egress and ingress
        loss only, a real interface); raise EmulationError on any failure."""


def htb_commands(intf: str, spec: LinkSpec, leaf: list[str]) -> list[list[str]]:
    """htb at ``spec.rate_mbit`` with a burst of ~1 ms of the rate, then ``leaf``.

    Mininet's default burst is too small for high rates; ~1 ms keeps goodput near the
    configured rate without letting bursts exceed it noticeably.
    """
    rate_bytes = spec.rate_mbit * 1e6 / 8
    burst = max(int(rate_bytes / 1000), 2 * spec.mtu + 100)
    quantum = min(200_000, max(spec.mtu + 100, int(rate_bytes / 1000)))
    rate = f"{spec.rate_mbit}mbit"
    return [
        ["tc", "qdisc", "replace", "dev", intf, "root", "handle", "1:", "htb", "default", "1"],
        [
            "tc",
            "class",
            "add",
            "dev",
            intf,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            str(burst),
            "cburst",
            str(burst),
            "quantum",
            str(quantum),
        ],
        ["tc", "qdisc", "add", "dev", intf, "parent", "1:1", "handle", "10:", *leaf],
    ]


def probe_in_scratch_namespace(commands: list[list[str]]) -> str | None:
    """Run commands in a throw-away namespace with a dummy interface ``d0``."""
    ns = f"pddtb-probe-{uuid.uuid4().hex[:8]}"
    try:
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"], ns=ns)
        run(["ip", "link", "set", "d0", "up"], ns=ns)
        for argv in commands:
            run(argv, ns=ns)
        return None
    except NetworkError as exc:
        return str(exc)
    finally:
        with contextlib.suppress(NetworkError):
            run(["ip", "netns", "del", ns])
