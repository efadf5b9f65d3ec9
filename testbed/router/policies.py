"""Routing policies, registered by name: which servers serve a request, and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from testbed.router.config import RouterConfig, ServerEntry


@dataclass(frozen=True)
class Route:
    pipeline: str  # recorded as RequestRecord.pipeline
    reason: str
    stream_from: ServerEntry  # the server whose stream the client sees
    prefill: ServerEntry | None = None


class Loads:
    """Requests in flight per server, as the router sees them."""

    def __init__(self) -> None:
        self.in_flight: Counter[str] = Counter()

    def least_loaded(self, servers: list[ServerEntry]) -> ServerEntry:
        if not servers:
            raise LookupError("no server of the needed role is configured")
        return min(servers, key=lambda s: (self.in_flight[s.name], s.name))


class Policy:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def choose(self, body: dict, loads: Loads) -> Route:
        raise NotImplementedError


class ColocatedPolicy(Policy):
    """One server prefills and decodes."""

    def choose(self, body, loads):
        server = loads.least_loaded(self.config.with_role("colocated"))
        return Route("colocated", "single server", server)


class PrefillDecodePolicy(Policy):
    """A prefill and a decode server per request, each the least loaded of its role."""

    def choose(self, body, loads):
        prefill = loads.least_loaded(self.config.with_role("prefill"))
        decode = loads.least_loaded(self.config.with_role("decode", "main_decode"))
        return Route("P->D", "disaggregated baseline", decode, prefill)


POLICIES: dict[str, Callable[[RouterConfig], Policy]] = {
    "colocated": ColocatedPolicy,
    "pd": PrefillDecodePolicy,
}


def make_policy(config: RouterConfig) -> Policy:
    try:
        return POLICIES[config.policy](config)
    except KeyError:
        raise ValueError(
            f"unknown routing policy {config.policy!r}; known: {', '.join(POLICIES)}"
        ) from None
