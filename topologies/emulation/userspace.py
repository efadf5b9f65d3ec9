"""The ``userspace`` backend, for kernels without netem.

Per direction: htb on the sender's WAN interface for rate; the NFQUEUE daemon
``delayd`` in the sender's namespace for delay and jitter (iptables sends packets
leaving the interface to its queue); nftables on the receiver's ingress for loss.

delayd stands for the wire, which never waits for a CPU: it runs in real-time FIFO
scheduling where this machine allows it, so a server busy on the same core cannot
hold packets past their release time (measured on the default bench at equal
priority: under load a lone 2.5 MB transfer ran at 2 MB/s where the idle line gave
7.5 MB/s). It sleeps between releases and uses a few percent of a core.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path

from topologies.emulation.base import (
    AppliedLink,
    EmulationError,
    LinkEmulator,
    LinkEnd,
    htb_commands,
    probe_in_scratch_namespace,
)
from topologies.emulation.common import (
    apply_loss,
    disable_offloads,
    expect_shaping,
    mechanisms_for,
)
from topologies.link import LinkSpec
from topologies.netns import NetworkError, run

QUEUE_NUM = 0  # one WAN interface per gateway namespace
DAEMON_READY_TIMEOUT = 15.0


class UserspaceEmulator(LinkEmulator):
    name = "userspace"

    def probe(self) -> str | None:
        return probe_in_scratch_namespace(
            [
                ["tc", "qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb", "default", "1"],
                ["iptables", "-A", "FORWARD", "-o", "d0", "-j", "NFQUEUE", "--queue-num", "0"],
                ["nft", "add", "table", "inet", "probe"],
                [
                    "nft",
                    "add",
                    "chain",
                    "inet",
                    "probe",
                    "c",
                    "{ type filter hook prerouting priority -300; policy accept; }",
                ],
                [
                    "nft",
                    "add",
                    "rule",
                    "inet",
                    "probe",
                    "c",
                    "numgen",
                    "random",
                    "mod",
                    "100",
                    "<",
                    "1",
                    "drop",
                ],
                ["ethtool", "-k", "d0"],
            ]
        )

    def apply(
        self, name: str, a: LinkEnd, b: LinkEnd, spec: LinkSpec, log_dir: Path
    ) -> AppliedLink:
        applied = AppliedLink(name=name, backend=self.name, spec=spec.model_dump())
        for end in (e for e in (a, b) if e is not None):  # one end: a real interface
            disable_offloads(end)
            if spec.rate_mbit:
                for argv in htb_commands(
                    end.intf, spec, ["pfifo", "limit", str(spec.queue_packets)]
                ):
                    _tc(argv, end)
            if spec.delay_ms:
                applied.daemon_pids.append(
                    self._start_delayd(end, spec, log_dir / f"delayd-{end.ns or end.intf}.log")
                )
                rule = f"-o {end.intf} -j NFQUEUE"
                what = f"the NFQUEUE rule feeding delayd on {end.intf}"
                applied.expect(end.ns, "delay", ["iptables", "-S", "FORWARD"], rule, what)
            if spec.loss_pct:
                apply_loss(end, spec)
            expect_shaping(applied, end, spec)
        applied.mechanisms = self.mechanisms(spec)
        return applied

    @staticmethod
    def mechanisms(spec: LinkSpec) -> dict[str, str]:
        return mechanisms_for(
            spec,
            queue_packets="tc pfifo limit under htb",
            delay_ms=f"NFQUEUE delayd (iptables FORWARD/OUTPUT -o wan), {_scheduling()}",
            jitter_ms="NFQUEUE delayd, uniform ±, no reordering",
        )

    def _start_delayd(self, end: LinkEnd, spec: LinkSpec, log: Path) -> int:
        for chain in ("FORWARD", "OUTPUT"):
            _run_or_fail(
                [
                    "iptables",
                    "-A",
                    chain,
                    "-o",
                    end.intf,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    str(QUEUE_NUM),
                ],
                end,
            )
        log.parent.mkdir(parents=True, exist_ok=True)
        inside = ["ip", "netns", "exec", end.ns] if end.ns else []  # or the host itself
        argv = [
            *inside,
            *realtime_prefix(),
            sys.executable,
            "-m",
            "topologies.emulation.delayd",
            "--queue",
            str(QUEUE_NUM),
            "--delay-ms",
            str(spec.delay_ms),
            "--jitter-ms",
            str(spec.jitter_ms),
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT
        while time.monotonic() < deadline:
            if b"ready" in log.read_bytes():
                return proc.pid
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        raise EmulationError(
            f"delayd did not start in {end.ns} (delay cannot be applied): {log.read_text()[-1500:]}"
        )


def _tc(argv: list[str], end: LinkEnd) -> None:
    _run_or_fail(argv, end)


def _run_or_fail(argv: list[str], end: LinkEnd) -> None:
    try:
        run(argv, ns=end.ns)
    except NetworkError as exc:
        raise EmulationError(str(exc)) from exc


REALTIME = ["chrt", "--fifo", "1"]  # the lowest real-time priority: above every normal task


@functools.cache
def realtime_prefix() -> list[str]:
    """The prefix that starts delayd in real-time FIFO scheduling, or nothing where this
    machine refuses it (no root, no chrt, a container without CAP_SYS_NICE)."""
    try:
        ok = subprocess.run([*REALTIME, "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        ok = False
    return REALTIME if ok else []


def _scheduling() -> str:
    return "real-time FIFO" if realtime_prefix() else "normal priority (no real-time here)"
