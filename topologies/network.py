"""Network: a topology realised with named namespaces, veth pairs, bridges and emulated links.

Lifecycle::

    Network(spec, name) ──up()──▶ up ──(popen / run / address)──▶ down() ──▶ gone
                         │                                          ▲
                         └── a failure part-way calls down() ───────┘

``up()`` picks the emulation backend first (refusing before anything is built when a
link parameter cannot be applied), writes a state file, then creates one namespace
per switch and host (``pddtb-<name>-<node>``); bridges, veths, qdiscs and nftables /
iptables rules all live inside those namespaces, so deleting them removes everything.
The harness itself joins site A through one veth (``pddtb-<name>`` in the initial
namespace, 10.77.1.254, a route to the other sites via gateway A), so it can reach
servers and the router like any site-A host; its peer lives in site A's switch
namespace and vanishes with it. ``down()`` kills every process in the namespaces
(emulation daemons, servers) by PID, deletes them and the state file;
``topologies.registry.down_by_name`` does the same after a ``kill -9`` of the harness,
from the state file and the namespace prefix alone. ``down()`` removes only what this object
began to build: a Network refused at ``up()`` (it, or another, was already up) leaves
the running one alone, so a caller may call ``down()`` in a ``finally`` whatever
``up()`` did.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from topologies.emulation import get_backend
from topologies.emulation.base import AppliedLink, LinkEnd, htb_commands
from topologies.emulation.common import LOSS_TABLE, apply_loss
from topologies.netns import PREFIX, NetworkError, list_namespaces, ns_name, run
from topologies.process import HostProcess
from topologies.registry import STATE_DIR, alive, down_by_name, names_up, state_path
from topologies.site import SUBNET_BASE
from topologies.spec import NetworkSpec

HARNESS_HOST = 254  # the harness's address in site A: 10.77.1.254
CUT_TABLE = "pddtb_cut"
RULE_CHECK_S = 5.0  # how often problems() re-reads the links' rules


class Network:
    emulated = True  # links built and shaped here (an inventory's LocalHosts: not)

    def __init__(
        self, spec: NetworkSpec, name: str = "default", log_dir: Path | None = None
    ) -> None:
        if not name.replace("_", "").isalnum() or len(name) > 20:
            raise ValueError(f"network name must be alphanumeric (<= 20 chars), got {name!r}")
        self.spec = spec
        self.name = name
        self.topo = spec.topo()
        self.log_dir = log_dir or Path("runs") / f"net-{name}"
        self.owned = False  # up() got past its checks: down() has something to remove
        self.applied: list[AppliedLink] = []
        self.backend_name: str | None = None
        self._rules_checked, self._rules_missing = 0.0, []  # the watchdog's last look
        self._loss_off: set[tuple[str, str]] = set()  # WAN ends whose loss is off for now

    # ---- lookup -------------------------------------------------------------------
    def ns(self, node: str) -> str:
        return ns_name(self.name, node)

    @property
    def hosts(self) -> list[str]:
        """Every end host (gateways excluded)."""
        return [h for h in self.topo.hosts() if self.topo.nodeInfo(h)["role"] != "gateway"]

    def hosts_with_role(self, role: str) -> list[str]:
        return [h for h in self.hosts if self.topo.nodeInfo(h)["role"] == role]

    @property
    def harness_address(self) -> str:
        return f"{SUBNET_BASE}.1.{HARNESS_HOST}"

    def role(self, host: str) -> str:
        return self.topo.nodeInfo(host)["role"]

    def site(self, host: str) -> str:
        return self.topo.nodeInfo(host)["site"]

    def address(self, host: str) -> str:
        """The host's IP address on its site LAN."""
        return self.topo.nodeInfo(host)["ip"].split("/")[0]

    # ---- lifecycle ----------------------------------------------------------------
    def up(self) -> Network:
        if os.geteuid() != 0:
            raise NetworkError("network emulation needs root (namespaces, tc, nftables)")
        if state_path(self.name).exists() or list_namespaces(ns_name(self.name, "")):
            raise NetworkError(f"network {self.name!r} is already up; run `testbed net down` first")
        others = [n for n in names_up() if n != self.name]
        if others:
            # The harness's route into 10.77.0.0/16 exists once per host.
            raise NetworkError(
                f"network {others[0]!r} is up; one network at a time (testbed net down)"
            )
        wan_links = [info for *_, info in self.topo.links(withInfo=True) if info["kind"] == "wan"]
        backend = None
        if any(info["spec"].impaired for info in wan_links):
            backend = get_backend(self.spec.backend)  # refuses before anything is built
            self.backend_name = backend.name
        self.owned = True
        try:
            self._write_state()
            self._build()
            for info in wan_links:
                if info["spec"].impaired:
                    a = LinkEnd(self.ns(info["node1"]), f"eth{info['port1']}")
                    b = LinkEnd(self.ns(info["node2"]), f"eth{info['port2']}")
                    name = f"{info['node1']}<->{info['node2']}"
                    self.applied.append(backend.apply(name, a, b, info["spec"], self.log_dir))
                    self._write_state()
        except BaseException:
            self.down()
            raise
        return self

    def attach(self) -> Network:
        """Use a network that an earlier command brought up (same spec required)."""
        path = state_path(self.name)
        if not path.exists():
            raise NetworkError(f"network {self.name!r} is not up (testbed net up SCENARIO)")
        state = json.loads(path.read_text())
        if state["spec"] != self.spec.model_dump():
            raise NetworkError(f"network {self.name!r} is up with a different network spec")
        self.backend_name = state["backend"]
        self.applied = [AppliedLink(**link) for link in state["links"]]
        return self

    def down(self) -> None:
        if self.owned:
            down_by_name(self.name)
            self.owned = False

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- changing the WAN while it runs -------------------------------------------
    def problems(self) -> list[str]:
        """What no longer holds of the emulation: a link daemon (delayd) that died, or
        a rule of a link (rate limiter, delay hook, loss rule) that was removed (checked
        every ``RULE_CHECK_S``). A benchmark over such a link measures something else,
        so callers stop."""
        dead = []
        for link in self.applied:
            for pid in link.daemon_pids:
                if not alive(pid):
                    dead.append(f"link {link.name}: its {link.backend} daemon (pid {pid}) died")
        now = time.monotonic()
        if now - self._rules_checked >= RULE_CHECK_S:
            self._rules_checked, self._rules_missing = now, self._missing_rules()
        return dead + self._rules_missing

    def _missing_rules(self) -> list[str]:
        missing = []
        for link in self.applied:
            for c in link.checks:
                if c["kind"] == "loss" and (c["ns"], c["needle"].strip('"')) in self._loss_off:
                    continue  # the WAN schedule took the loss away for now
                out = run(c["argv"], ns=c["ns"], check=False)
                if c["needle"] not in out.stdout:
                    missing.append(f"link {link.name}: {c['what']} was removed")
        return missing

    def _wan_ends(self) -> list[tuple[str, str]]:
        return [
            (self.ns(info[f"node{i}"]), f"eth{info[f'port{i}']}")
            for *_, info in self.topo.links(withInfo=True)
            if info["kind"] == "wan"
            for i in (1, 2)
        ]

    def cut_wan(self) -> None:
        """Drop every packet arriving over the WAN, both ways (a fibre cut; no RST)."""
        for ns, intf in self._wan_ends():
            rules = (
                f"table inet {CUT_TABLE} {{\n  chain cut {{\n"
                "    type filter hook prerouting priority -400; policy accept;\n"
                f'    iifname "{intf}" drop\n  }}\n}}\n'
            )
            run(["nft", "-f", "-"], ns=ns, input=rules)

    def restore_wan(self) -> None:
        for ns, _ in self._wan_ends():
            run(["nft", "delete", "table", "inet", CUT_TABLE], ns=ns, check=False)

    def wan_tx_bytes(self) -> int:
        """Bytes site A's gateway has sent onto the WAN (site A → site B)."""
        ns, intf = self._wan_ends()[0]
        return int(run(["cat", f"/sys/class/net/{intf}/statistics/tx_bytes"], ns=ns).stdout)

    def set_wan_rate(self, rate_mbit: float) -> None:
        """Change the WAN's htb rate in place (both directions)."""
        if not self.spec.wan.rate_mbit:
            raise NetworkError("the WAN is unshaped; give it a rate_mbit to change")
        spec = self.spec.wan.model_copy(update={"rate_mbit": rate_mbit})
        for ns, intf in self._wan_ends():
            class_cmd = htb_commands(intf, spec, [])[1]
            run(["tc", "class", "change", *class_cmd[3:]], ns=ns)

    def set_wan_loss(self, loss_pct: float) -> None:
        """Change the WAN's random loss in place (both directions; 0 removes it)."""
        spec = self.spec.wan.model_copy(update={"loss_pct": loss_pct})
        self._loss_off = set() if loss_pct else set(self._wan_ends())
        for ns, intf in self._wan_ends():
            run(["nft", "delete", "table", "inet", LOSS_TABLE], ns=ns, check=False)
            if loss_pct:
                apply_loss(LinkEnd(ns=ns, intf=intf), spec)

    # ---- processes ----------------------------------------------------------------
    def popen(
        self, host: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> HostProcess:
        return HostProcess(host, self.ns(host), argv, log_path, env).start()

    def run(self, host: str, argv: Sequence[str], timeout: float = 60, check: bool = True):
        return run(argv, ns=self.ns(host), timeout=timeout, check=check)

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host``."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    # ---- building -----------------------------------------------------------------
    def _namespaces(self) -> list[str]:
        return [self.ns(n) for n in self.topo.nodes()]

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {
            "name": self.name,
            "pid": os.getpid(),  # the process that brought it up
            "spec": self.spec.model_dump(),
            "namespaces": self._namespaces(),
            "backend": self.backend_name,
            "links": [asdict(a) for a in self.applied],
            "hosts": {
                h: {"role": self.role(h), "site": self.site(h), "ip": self.address(h)}
                for h in self.hosts
            },
        }
        tmp = state_path(self.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path(self.name))

    def _build(self) -> None:
        topo = self.topo
        for node in topo.nodes():
            ns = self.ns(node)
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "set", "lo", "up"], ns=ns)
        for switch in topo.switches():
            ns = self.ns(switch)
            run(["ip", "link", "add", "br0", "type", "bridge"], ns=ns)
            run(["ip", "link", "set", "br0", "up"], ns=ns)
        for n1, n2, info in topo.links(withInfo=True):
            self._add_link(n1, n2, info)
        self._attach_harness()
        cc = self.spec.wan.congestion_control
        allow_congestion_control(cc)
        for host in topo.hosts():
            ns, node = self.ns(host), topo.nodeInfo(host)
            run(["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}"], ns=ns)
            ssai = int(self.spec.tcp_slow_start_after_idle)
            run(["sysctl", "-qw", f"net.ipv4.tcp_slow_start_after_idle={ssai}"], ns=ns)
            if node["role"] == "gateway":
                run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=ns)
                for subnet, via in node.get("routes", []):
                    run(["ip", "route", "add", subnet, "via", via], ns=ns)
            elif node.get("defaultRoute"):
                run(["ip", "route", "add", "default", *node["defaultRoute"].split()], ns=ns)

    @property
    def harness_intf(self) -> str:
        return f"{PREFIX}{self.name}"[:15]

    def _attach_harness(self) -> None:
        switch_ns = self.ns(self.topo.switches()[0])
        subnet = f"{SUBNET_BASE}.1"
        intf = self.harness_intf
        run(
            [
                "ip",
                "link",
                "add",
                intf,
                "type",
                "veth",
                "peer",
                "name",
                "harness",
                "netns",
                switch_ns,
            ]
        )
        run(["ip", "link", "set", "harness", "master", "br0"], ns=switch_ns)
        run(["ip", "link", "set", "harness", "up"], ns=switch_ns)
        run(["ip", "addr", "add", f"{subnet}.{HARNESS_HOST}/24", "dev", intf])
        run(["ip", "link", "set", intf, "up"])
        if any(self.role(h) == "gateway" for h in self.topo.hosts()):
            run(["ip", "route", "add", f"{SUBNET_BASE}.0.0/16", "via", f"{subnet}.1", "dev", intf])

    def _add_link(self, n1: str, n2: str, info: dict) -> None:
        topo, spec = self.topo, info["spec"]
        ends = []
        for node, port, params in (
            (n1, info["port1"], info.get("params1", {})),
            (n2, info["port2"], info.get("params2", {})),
        ):
            is_switch = topo.isSwitch(node)
            other = n2 if node == n1 else n1
            # On a switch the port is named after the host behind it; on a host, ethN.
            ends.append(
                (self.ns(node), other if is_switch else f"eth{port}", is_switch, node, params)
            )
        (ns1, if1, *_), (ns2, if2, *_) = ends
        run(["ip", "link", "add", if1, "type", "veth", "peer", "name", if2, "netns", ns2], ns=ns1)
        for ns, intf, is_switch, node, params in ends:
            run(["ip", "link", "set", intf, "mtu", str(spec.mtu)], ns=ns)
            if is_switch:
                run(["ip", "link", "set", intf, "master", "br0"], ns=ns)
            else:
                ip = params.get("ip") or (
                    topo.nodeInfo(node)["ip"] if info["kind"] == "lan" else None
                )
                if ip:
                    run(["ip", "addr", "add", ip, "dev", intf], ns=ns)
            run(["ip", "link", "set", intf, "up"], ns=ns)


ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def allow_congestion_control(cc: str) -> None:
    """Let namespaces default to ``cc``.

    Outside the initial namespace the kernel only accepts a default from the global
    allowed list; adding to it (never removing) changes nothing else on the host.
    """
    allowed = ALLOWED_CC.read_text().split()
    if cc not in allowed:
        run(
            ["sysctl", "-qw", f"net.ipv4.tcp_allowed_congestion_control={' '.join([*allowed, cc])}"]
        )
