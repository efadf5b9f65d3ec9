"""Shaping a real interface — a gateway host's WAN side — with the testbed's emulation.

``shape(dev, spec)`` applies a :class:`LinkSpec` to ``dev`` the way one end of the
emulated WAN is shaped (rate and delay/jitter on its egress, loss on its ingress), with
the same backends (netem where the kernel has it, the userspace delay daemon
otherwise) and the same refusal when a parameter cannot be applied. Shape both
gateways for both directions. A state file (``STATE_DIR/shaped/<dev>.json``: what was
applied, by which mechanism, the daemon's pid) records it, for the run and for
``unshape(dev)``, which removes all of it.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from pathlib import Path

from topologies.emulation import get_backend
from topologies.emulation.base import AppliedLink, LinkEnd
from topologies.emulation.common import LOSS_TABLE
from topologies.emulation.userspace import QUEUE_NUM
from topologies.link import LinkSpec
from topologies.netns import NetworkError, run
from topologies.registry import STATE_DIR


def _state(dev: str, netns: str | None) -> Path:
    return STATE_DIR / "shaped" / f"{netns + '-' if netns else ''}{dev}.json"


def shape(
    dev: str, spec: LinkSpec, netns: str | None = None, backend: str = "auto", log_dir=None
) -> AppliedLink:
    path = _state(dev, netns)
    if path.exists():
        raise NetworkError(f"{dev} is shaped already ({path}); unshape it first")
    if run(["ip", "link", "show", dev], ns=netns, check=False).returncode != 0:
        raise NetworkError(f"no interface {dev}" + (f" in {netns}" if netns else ""))
    end = LinkEnd(ns=netns, intf=dev)
    log_dir = Path(log_dir or STATE_DIR / "shaped")
    log_dir.mkdir(parents=True, exist_ok=True)
    applied = get_backend(backend).apply(f"shape-{dev}", end, None, spec, log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"dev": dev, "netns": netns, **asdict(applied)}, indent=2))
    return applied


def unshape(dev: str, netns: str | None = None) -> list[str]:
    """Undo ``shape``: the qdisc, the delay daemon and its rules, the loss rule.
    Returns what was removed."""
    path = _state(dev, netns)
    if not path.exists():
        raise NetworkError(f"{dev} was not shaped by the testbed (no {path})")
    state = json.loads(path.read_text())
    removed = []
    run(["tc", "qdisc", "del", "dev", dev, "root"], ns=netns, check=False)
    removed.append("root qdisc")
    for pid in state.get("daemon_pids", []):
        try:
            os.kill(pid, signal.SIGTERM)
            removed.append(f"delay daemon {pid}")
        except ProcessLookupError:
            pass
    for chain in ("FORWARD", "OUTPUT"):
        rule = ["-o", dev, "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)]
        while run(["iptables", "-D", chain, *rule], ns=netns, check=False).returncode == 0:
            removed.append(f"iptables {chain} rule")
    if run(["nft", "delete", "table", "inet", LOSS_TABLE], ns=netns, check=False).returncode == 0:
        removed.append("loss rule")
    path.unlink()
    return removed
