"""Link-emulation backends, registered by name and chosen by probing.

``netem`` (htb + netem) where the kernel has netem; ``userspace`` (htb for rate, the
NFQUEUE ``delayd`` for delay and jitter, nftables for loss after segmentation) where
it does not. ``auto`` picks the first that probes clean. A backend that cannot apply
a parameter raises — the testbed never runs over a link that is not what it claims.
"""

from __future__ import annotations

import importlib

from topologies.emulation.base import EmulationError, LinkEmulator

# name → "module:Class", imported only when used
BACKENDS = {
    "netem": "topologies.emulation.netem:NetemEmulator",
    "userspace": "topologies.emulation.userspace:UserspaceEmulator",
}
AUTO_ORDER = ("netem", "userspace")


def get_backend(name: str) -> LinkEmulator:
    """An emulator by name; ``auto`` probes and picks. Raises EmulationError when unusable."""
    if name == "auto":
        reasons = {}
        for candidate in AUTO_ORDER:
            backend = _load(candidate)
            reason = backend.probe()
            if reason is None:
                return backend
            reasons[candidate] = reason
        detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        raise EmulationError(f"no link-emulation backend works on this host ({detail})")
    if name not in BACKENDS:
        raise EmulationError(
            f"unknown emulation backend {name!r}; known: auto, {', '.join(BACKENDS)}"
        )
    backend = _load(name)
    reason = backend.probe()
    if reason is not None:
        raise EmulationError(f"emulation backend {name!r} cannot run here: {reason}")
    return backend


def _load(name: str) -> LinkEmulator:
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["BACKENDS", "EmulationError", "LinkEmulator", "get_backend"]
