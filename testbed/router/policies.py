"""Routing policies, registered by name: which servers serve a request, and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from protocol import headers
from protocol.clock import now as clock_now
from protocol.names import Pipeline, Role
from testbed.router.config import PddConfig, RouterConfig, ServerEntry
from testbed.router.mirror import PrefixMirror
from testbed.router.wan import WanLine, WanPrediction


@dataclass(frozen=True)
class Route:
    pipeline: Pipeline  # recorded as RequestRecord.pipeline
    reason: str
    stream_from: ServerEntry  # the server whose stream the client sees (first)
    prefill: ServerEntry | None = None
    main_decode: ServerEntry | None = None  # P->RLD->MD: who takes over after the handoff
    wan: WanPrediction | None = None  # the KV's predicted time on the WAN (if it crosses)

    @property
    def predicted_wan_s(self) -> float | None:
        return None if self.wan is None else self.wan.seconds

    @property
    def md_after(self) -> int | None:
        """The transfer main decode is predicted to hold this request back for (its room;
        the request to main decode names it: ``protocol.rooms.with_after``)."""
        to_md = self.pipeline in (Pipeline.P_MD, Pipeline.P_RLD_MD)
        return self.wan.after if to_md and self.wan is not None else None

    @property
    def md_hold_s(self) -> float | None:
        """The longest main decode may hold back a P->MD request (whose client waits on
        it) for KV on its way: from when MD has the request, until the router predicted
        its KV in, held or its own (past that, sending its own would have been as quick;
        ``protocol.rooms.hold_bound``). None: MD's own bound (relay decode streams).
        MD holds it from its arrival, before prefill has computed it: a bound of the
        crossing alone ran out while the prefix it waited for was still arriving (its
        prefill took 0.95 s of the 1.8 s), and prefill sent the prefix again. The bound is
        a prediction: MD stretches it (up to twice) while the KV held for is still coming
        (``engine_patches.kv_transfer.prefix_wait``)."""
        if self.pipeline != Pipeline.P_MD or self.wan is None:
            return None
        wan = self.wan
        return wan.due_s + max(wan.unheld_s, wan.held_s + wan.seconds)

    @property
    def kv_server(self) -> ServerEntry:
        """The server the prompt's KV must reach to decode to the end."""
        return self.main_decode or self.stream_from


class Loads:
    """Requests in flight per server, as the router sees them, the servers out of
    rotation (failed health checks: name → why), each decoder's recent inter-token
    interval (what the switch expects of main decode before it has measured main
    decode's pace in the request itself), and each main decode's recent catch-up batch
    time (when a settle's exchange will be in its cache)."""

    ITL_WEIGHT = 0.3  # of the newest request in the decaying average

    def __init__(self) -> None:
        self.in_flight: Counter[str] = Counter()
        self.down: dict[str, str] = {}
        self.itl: dict[str, float] = {}  # server → seconds between tokens
        # main decode → seconds from sending a catch-up batch to its EXTENDED (the way
        # there and back, MD's pass in progress, the extend pass: on hetero 2-3 s where
        # a decode step is 0.1 s)
        self.extend_s: dict[str, float] = {}
        # main decode → handoff batches sent there and not yet extended (each pauses its
        # decode batch for an extend pass); kept by the rooms' handoff channels
        self.extending: Counter[str] = Counter()

    def learn_itl(self, server: str | None, token_times: list[float], switched: bool) -> None:
        """A finished request's median gap, for the server that decoded every token of it
        (a request that switched servers mid-stream says nothing of either one)."""
        if server is None or switched or len(token_times) < 3:
            return
        gaps = sorted(b - a for a, b in zip(token_times, token_times[1:], strict=False))
        self._decay(self.itl, server, gaps[len(gaps) // 2])

    def learn_extend(self, server: str, seconds: float) -> None:
        """A catch-up batch sent to main decode ``server`` came back EXTENDED."""
        self._decay(self.extend_s, server, seconds)

    def _decay(self, average: dict[str, float], server: str, sample: float) -> None:
        """``server``'s decaying average moved ``ITL_WEIGHT`` of the way to ``sample``."""
        old = average.get(server)
        average[server] = sample if old is None else old + self.ITL_WEIGHT * (sample - old)

    def least_loaded(self, servers: list[ServerEntry]) -> ServerEntry:
        if not servers:
            raise LookupError("no server of the needed role is configured")
        up = [s for s in servers if s.name not in self.down]
        if not up:
            why = "; ".join(f"{s.name}: {self.down[s.name]}" for s in servers)
            raise LookupError(f"no healthy {servers[0].role} server ({why})")
        return min(up, key=lambda s: (self.in_flight[s.name], s.name))


class Policy:
    def __init__(self, config: RouterConfig, wan: WanLine | None = None) -> None:
        self.config = config
        self.wan = wan  # the WAN line's state, where the policy predicts transfers

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
    """PDD's two pipelines, per request from the predicted WAN transfer time (the KV
    main decode lacks, behind what the line already carries): P->MD within the bound,
    P->RLD->MD beyond it while relay decode can take the request; when it cannot, the
    pipeline with the lower predicted TTFT. Anomalous requests (very long input, very
    short output) RLD-only."""

    def __init__(self, config: RouterConfig, wan: WanLine | None = None) -> None:
        self.pdd: PddConfig = config.pdd or PddConfig()
        super().__init__(config, wan or wan_line(self.pdd))
        self.mirror = PrefixMirror(capacity_tokens=self.pdd.md_cache_tokens)

    def _uncached(self, prompt: list[int] | None, n_in: int, session: str | None) -> int:
        """Tokens MD is predicted to lack when this request reaches it (``lead_s`` after
        routing: an exchange MD is finishing may be in its cache by then)."""
        if prompt is None:
            return n_in
        return n_in - self.mirror.predicted_hit(prompt, session, self.wan.clock() + self.wan.lead_s)

    def _predict(self, prompt: list[int] | None, n_in: int, session: str | None, md: str):
        """The tokens MD lacks and the WAN prediction of their KV: held back by MD while
        enough of what it lacks is on its way to it in another transfer, it lacks only the
        rest once that one has ended (``WanPrediction.held_s``; ``unheld_s``: all it lacks
        had MD not held it, the longest MD should hold it: ``Route.md_hold_s``)."""
        uncached, after = self._uncached(prompt, n_in, session), None
        unheld, per_token = uncached, self.pdd.kv_bytes_per_token
        if prompt is not None and uncached:
            hit, rooms = n_in - uncached, self.wan.outstanding
            extra, after = self.mirror.held_for(prompt, hit, rooms, md)
            uncached -= extra
        wan = self.wan.predict(uncached * per_token, after)
        alone = wan if unheld == uncached else self.wan.predict(unheld * per_token)
        return uncached, replace(wan, unheld_s=alone.seconds)

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
        return Route(pinned, reason, stream_from, prefill, then, route.wan)

    def _choose(self, body, loads, session: str | None):
        pdd = self.pdd
        prefill = loads.least_loaded(self.config.with_role(Role.PREFILL))
        main = loads.least_loaded(self.config.with_role(Role.MAIN_DECODE))
        prompt = prompt_tokens(body)
        n_in = len(prompt) if prompt is not None else text_tokens(body)
        n_out = max_new_tokens(body)
        uncached, wan = self._predict(prompt, n_in, session, main.name)  # pinned ones too
        try:
            relay = loads.least_loaded(self.config.with_role(Role.RELAY_DECODE))
        except LookupError as exc:  # relay decode down: P->MD, the pipeline left
            return Route(Pipeline.P_MD, f"{exc}: P->MD"[:300], main, prefill, wan=wan)
        if n_in >= pdd.anomalous_min_input and n_out <= pdd.anomalous_max_output:
            reason = f"anomalous: {n_in} input tokens, {n_out} output"
            return Route(Pipeline.RLD_ONLY, reason, relay, prefill, wan=wan)
        direct = Route(Pipeline.P_MD, "", main, prefill, wan=wan)
        relayed = Route(Pipeline.P_RLD_MD, "", relay, prefill, main, wan=wan)
        wan_s = wan.held_s + wan.seconds  # MD holding it back for a prefix on its way too
        held = f", held {wan.held_s * 1e3:.0f} ms for room {wan.after}" if wan.held_s else ""
        said = (
            f"{wan_s * 1e3:.0f} ms predicted WAN time ({uncached} uncached tokens"
            f" behind {wan.queued_bytes / 1e6:.2f} MB{held})"
        )
        bound_ms = pdd.direct_wan_bound_s * 1e3
        if wan_s <= pdd.direct_wan_bound_s:
            return replace(direct, reason=f"{said} <= {bound_ms:.0f} ms")
        if prompt is None:
            return replace(direct, reason=f"{said}; relaying needs token ids, so P->MD")
        over = loads.in_flight[relay.name] + 1 - pdd.rld_max_requests
        if over <= 0:
            return replace(relayed, reason=f"{said} > {bound_ms:.0f} ms")
        rld_wait = over * pdd.rld_step_s  # relay decode beyond its bound: a step per request
        load = f"relay decode at {loads.in_flight[relay.name]} requests, {rld_wait * 1e3:.0f} ms"
        if wan_s <= rld_wait:
            return replace(direct, reason=f"{said}; {load}: P->MD is faster")
        return replace(relayed, reason=f"{said}; {load}: relaying is still faster")


class ThresholdPolicy(PddPolicy):
    """Relay by uncached prompt length alone (as cross-DC systems like PrfaaS route):
    P->RLD->MD when more than ``threshold_tokens`` are uncached on main decode, P->MD
    otherwise. No WAN state, no load; the WAN prediction is only recorded."""

    def _choose(self, body, loads, session: str | None):
        prefill = loads.least_loaded(self.config.with_role(Role.PREFILL))
        relay = loads.least_loaded(self.config.with_role(Role.RELAY_DECODE))
        main = loads.least_loaded(self.config.with_role(Role.MAIN_DECODE))
        prompt = prompt_tokens(body)
        n_in = len(prompt) if prompt is not None else text_tokens(body)
        uncached, wan = self._predict(prompt, n_in, session, main.name)
        limit = self.pdd.threshold_tokens
        if uncached > limit and prompt is not None:
            reason = f"{uncached} uncached tokens > {limit}"
            return Route(Pipeline.P_RLD_MD, reason, relay, prefill, main, wan=wan)
        reason = f"{uncached} uncached tokens <= {limit}" if uncached <= limit else "text prompt"
        return Route(Pipeline.P_MD, reason, main, prefill, wan=wan)


def wan_line(pdd: PddConfig, clock: Callable[[], float] = clock_now) -> WanLine:
    """A WAN line seeded by the configured rate (bytes/s), one-way delay and loss, on
    ``clock`` (a replay's follows the stored run: the line starts at its first reading)."""
    return WanLine(
        pdd.wan_rate_mbit * 1e6 / 8,
        pdd.wan_one_way_s,
        clock=clock,
        loss=pdd.wan_loss_pct / 100,
        pool_reuse_s=pdd.kv_pool_reuse_s,
        queue_bytes=pdd.wan_queue_bytes or float("inf"),
        congestion=pdd.wan_congestion_control,
        jitter_s=pdd.wan_jitter_s,
        paced=pdd.wan_paced_share,
    )


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
    "threshold": ThresholdPolicy,
}


def make_policy(config: RouterConfig) -> Policy:
    try:
        return POLICIES[config.policy](config)
    except KeyError:
        raise ValueError(
            f"unknown routing policy {config.policy!r}; known: {', '.join(POLICIES)}"
        ) from None
