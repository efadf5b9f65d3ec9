"""The ``netem`` backend, for kernels that have sch_netem (most workstations, CI VMs).

Per direction on the sender's WAN interface: htb for rate with netem as its leaf
for delay and jitter (netem alone when unshaped). Loss is not netem's: netem drops
whole GSO super-packets, so loss uses the same post-segmentation nftables rule as
the userspace backend, which the run records.
"""

from __future__ import annotations

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


class NetemEmulator(LinkEmulator):
    name = "netem"

    def probe(self) -> str | None:
        reason = probe_in_scratch_namespace(
            [["tc", "qdisc", "add", "dev", "d0", "root", "netem", "delay", "1ms"]]
        )
        return None if reason is None else f"kernel has no netem qdisc ({reason})"

    def apply(
        self, name: str, a: LinkEnd, b: LinkEnd, spec: LinkSpec, log_dir: Path
    ) -> AppliedLink:
        applied = AppliedLink(name=name, backend=self.name, spec=spec.model_dump())
        netem = ["netem", "limit", str(spec.queue_packets)]
        if spec.delay_ms:
            netem += ["delay", f"{spec.delay_ms}ms"]
            if spec.jitter_ms:
                netem += [f"{spec.jitter_ms}ms"]  # uniform without a distribution table
        for end in (e for e in (a, b) if e is not None):  # one end: a real interface
            disable_offloads(end)
            if spec.rate_mbit:
                commands = htb_commands(end.intf, spec, netem)
            else:
                commands = [
                    ["tc", "qdisc", "replace", "dev", end.intf, "root", "handle", "10:", *netem]
                ]
            for argv in commands:
                try:
                    run(argv, ns=end.ns)
                except NetworkError as exc:
                    raise EmulationError(str(exc)) from exc
            if spec.loss_pct:
                apply_loss(end, spec)
            expect_shaping(applied, end, spec)
            if spec.delay_ms:
                argv = ["tc", "qdisc", "show", "dev", end.intf]
                applied.expect(end.ns, "delay", argv, "netem", f"netem on {end.intf}")
        mechanisms = mechanisms_for(
            spec,
            queue_packets="netem limit",
            delay_ms="tc netem delay",
            jitter_ms="tc netem jitter (uniform; netem may reorder)",
        )
        mechanisms["queue_packets"] = "netem limit"  # netem's queue exists even unshaped
        applied.mechanisms = mechanisms
        return applied
