"""CPU pinning of one deployment (``servers.cpus``), so co-hosted servers compute like
separate machines and the testbed's own processes stay off the servers' cores.

Lifecycle::

    CpuPins(cpus) ──pin("link")──▶ the network starts its link emulators (they keep the
    mask) ──pin("testbed")──▶ router, Locust, peers' tools ──restore()──▶ unpinned

The mask is this thread's, inherited by every process it starts; servers get their
role's CPUs through ``taskset`` (``cpus_for``). Nothing pinned where ``cpus`` is empty.
"""

from __future__ import annotations

import os

from testbed.server import ServerError


class CpuPins:
    def __init__(self, cpus: dict[str, list[int]]) -> None:
        self.cpus = cpus
        self.all_cpus = sorted(os.sched_getaffinity(0))
        missing = sorted({c for v in cpus.values() for c in v} - set(self.all_cpus))
        if missing:
            raise ServerError(
                f"servers.cpus names CPUs {missing}, but this machine offers "
                f"{self.all_cpus}; edit the scenario's servers.cpus"
            )

    def pin(self, role: str) -> None:
        """This thread to ``role``'s CPUs: 'testbed', or 'link' (falling back to
        'testbed') for the link emulators."""
        if mask := self.cpus.get(role, self.cpus.get("testbed")):
            os.sched_setaffinity(0, mask)

    def restore(self) -> None:
        os.sched_setaffinity(0, self.all_cpus)

    def cpus_for(self, role: str) -> tuple[int, ...]:
        """A server role's CPUs (every CPU where the plan names none); () if unpinned."""
        return tuple(self.cpus.get(role, self.all_cpus)) if self.cpus else ()
