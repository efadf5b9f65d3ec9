"""Routing policies, registered by name: which servers serve a request, and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from protocol import headers
from protocol.names import Pipeline, Role
from testbed.router.config import PddConfig, RouterConfig, ServerEntry
from testbed.router.mirror import PrefixMirror


@dataclass(frozen=True)
class Route:
    pipeline: Pipeline  # recorded as RequestRecord.pipeline
    reason: str
    stream_from: ServerEntry  # the server whose stream the client sees (first)
    prefill: ServerEntry | None = None
    main_decode: ServerEntry | None = None  # P->RLD->MD: who takes over after the handoff
    predicted_wan_s: float | None = None


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

    def choose(
        self, body: dict, loads: Loads, session: str | None = None, pinned: str | None = None
    ) -> Route:
        """``pinned``: a pipeline the request asks for (only PDD has several)."""
        raise NotImplementedError


class ColocatedPolicy(Policy):
    """One server prefills and decodes."""

    def choose(self, body, loads, session=None, pinned=None):
        server = loads.least_loaded(self.config.with_role(Role.COLOCATED))
        return Route(Pipeline.COLOCATED, "single server", server)


class PrefillDecodePolicy(Policy):
    """A prefill and a decode server per request, each the least loaded of its role."""

    def choose(self, body, loads, session=None, pinned=None):
        prefill = loads.least_loaded(self.config.with_role(Role.PREFILL))
        decode = loads.least_loaded(self.config.with_role(Role.DECODE, Role.MAIN_DECODE))
        return Route(Pipeline.P_D, "disaggregated baseline", decode, prefill)


class PddPolicy(Policy):
    """PDD's two pipelines, per request from the predicted WAN transfer time:
    P->MD when the KV main decode lacks crosses the WAN within the bound, P->RLD->MD
    otherwise; anomalous requests (very long input, very short output) RLD-only."""

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.pdd: PddConfig = config.pdd or PddConfig()
        self.mirror = PrefixMirror()

    def choose(self, body, loads, session: str | None = None, pinned: str | None = None):
        route = self._choose(body, loads, session)
        if pinned is None or pinned == route.pipeline:
            return route
        relay = loads.least_loaded(self.config.with_role(Role.RELAY_DECODE))
        main = loads.least_loaded(self.config.with_role(Role.MAIN_DECODE))
        servers = {
            Pipeline.P_MD: (main, None),
            Pipeline.P_RLD_MD: (relay, main),
            Pipeline.RLD_ONLY: (relay, None),
        }
        if pinned not in servers:  # a StrEnum key matches its plain string
            raise ValueError(f"{headers.PIPELINE}: unknown pipeline {pinned!r}")
        if pinned == Pipeline.P_RLD_MD and prompt_tokens(body) is None:
            raise ValueError(
                f"{headers.PIPELINE}: {Pipeline.P_RLD_MD} needs token ids (native /generate)"
            )
        pinned = Pipeline(pinned)
        stream_from, then = servers[pinned]
        prefill = loads.least_loaded(self.config.with_role(Role.PREFILL))
        reason = f"pinned by {headers.PIPELINE} (the policy chose {route.pipeline})"
        return Route(pinned, reason, stream_from, prefill, then, route.predicted_wan_s)

    def _choose(self, body, loads, session: str | None):
        pdd = self.pdd
        prefill = loads.least_loaded(self.config.with_role(Role.PREFILL))
        relay = loads.least_loaded(self.config.with_role(Role.RELAY_DECODE))
        main = loads.least_loaded(self.config.with_role(Role.MAIN_DECODE))
        prompt = prompt_tokens(body)
        n_in = len(prompt) if prompt is not None else text_tokens(body)
        n_out = max_new_tokens(body)
        if n_in >= pdd.anomalous_min_input and n_out <= pdd.anomalous_max_output:
            reason = f"anomalous: {n_in} input tokens, {n_out} output"
            return Route(Pipeline.RLD_ONLY, reason, relay, prefill, predicted_wan_s=0.0)
        hit = self.mirror.predicted_hit(prompt, session) if prompt is not None else 0
        wan_s = (n_in - hit) * pdd.kv_bytes_per_token * 8 / (pdd.wan_rate_mbit * 1e6)
        bound = f"{wan_s * 1e3:.0f} ms predicted WAN time ({n_in - hit} uncached tokens)"
        if wan_s <= pdd.direct_wan_bound_s:
            reason = f"{bound} <= {pdd.direct_wan_bound_s * 1e3:.0f} ms"
            return Route(Pipeline.P_MD, reason, main, prefill, predicted_wan_s=wan_s)
        if prompt is None:
            reason = f"{bound}; relaying needs token ids (native /generate), so P->MD"
            return Route(Pipeline.P_MD, reason, main, prefill, predicted_wan_s=wan_s)
        reason = f"{bound} > {pdd.direct_wan_bound_s * 1e3:.0f} ms"
        return Route(Pipeline.P_RLD_MD, reason, relay, prefill, main, predicted_wan_s=wan_s)


def prompt_tokens(body: dict) -> list[int] | None:
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
        return ids
    return None


def max_new_tokens(body: dict) -> int:
    """The expected output length: the request's own bound (SGLang's default 128)."""
    params = body.get("sampling_params") or {}
    bounds = (
        params.get("max_new_tokens"),
        body.get("max_tokens"),
        body.get("max_completion_tokens"),
    )
    for value in bounds:
        if value is not None:
            return int(value)
    return 128


def text_tokens(body: dict) -> int:
    """A rough token count for text prompts (about 4 characters per token)."""
    text = body.get("text") or body.get("prompt") or ""
    if not text and body.get("messages"):
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    return max(1, len(str(text)) // 4)


POLICIES: dict[str, Callable[[RouterConfig], Policy]] = {
    "colocated": ColocatedPolicy,
    "pd": PrefillDecodePolicy,
    "pdd": PddPolicy,
}


def make_policy(config: RouterConfig) -> Policy:
    try:
        return POLICIES[config.policy](config)
    except KeyError:
        raise ValueError(
            f"unknown routing policy {config.policy!r}; known: {', '.join(POLICIES)}"
        ) from None
