"""RouterConfig: the servers the router may use and how to route between them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.kv import POOL_REUSE_S
from protocol.names import Role
from testbed.router.validate import RequestLimits

HTTP_KEEP_ALIVE_S = 5.0  # SGLang's HTTP servers' own idle keep-alive (SGLANG_TIMEOUT_KEEP_ALIVE)


def upstream_keep_alive_s(server_keep_alive_s: float = HTTP_KEEP_ALIVE_S) -> float:
    """How long the router keeps an idle connection to a server whose HTTP server closes
    one idle ``server_keep_alive_s``: 0.4x that, so the router closes first (a request
    sent on a connection as the server closes it fails with "Server disconnected", seen
    with think times of a few seconds)."""
    return 0.4 * server_keep_alive_s


class ServerEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    url: str = Field(..., description="http://host:port of the SGLang server.")
    role: Role = Field(..., description="What the server does (protocol.names.Role).")
    site: str = "A"
    host: str = Field(..., description="Address other servers use (bootstrap host).")
    bootstrap_port: int | None = Field(None, description="Prefill servers: KV listener port.")
    transfer_log: Path | None = Field(None, description="The server's KV transfer log.")


class PddConfig(BaseModel):
    """PDD's routing and handoff knobs (``pdd:`` in a scenario)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    handoff_port: int = Field(8997, ge=1, le=65535, description="Main decode's handoff port.")
    wan_rate_mbit: float = Field(100.0, gt=0, description="WAN rate the router plans with.")
    kv_bytes_per_token: int = Field(8192, gt=0, description="KV bytes per token (the model's).")
    wan_one_way_s: float = Field(0.0, ge=0, description="WAN one-way delay the router plans with.")
    wan_jitter_s: float = Field(0.0, ge=0, description="WAN jitter (±) the router plans with.")
    wan_loss_pct: float = Field(
        0.0, ge=0, lt=100, description="WAN loss the router plans with (bounds one flow's rate)."
    )
    wan_queue_bytes: int = Field(
        0, ge=0, description="The WAN's bottleneck queue the router plans with (0: unknown)."
    )
    wan_congestion_control: Literal["cubic", "bbr", "reno"] = Field(
        "cubic", description="The hosts' TCP congestion control: how a loss cuts a window."
    )
    wan_paced_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Prefill's senders share the WAN at this fraction of its rate "
        "(servers.kv_line_share); 0: each sends as fast as TCP lets it.",
    )
    kv_pool_reuse_s: float = Field(
        POOL_REUSE_S, gt=0, description="Decode servers' KV connection reuse (servers.)."
    )
    md_cache_tokens: int = Field(
        65536, gt=0, description="Main decode's KV pool: the most its prefix cache holds."
    )
    direct_wan_bound_s: float = Field(
        0.1, ge=0, description="Predicted WAN transfer time up to which a request goes P->MD."
    )
    rld_max_requests: int = Field(
        4,
        ge=1,
        description="Relay decode takes a relayed request only while it has fewer than this "
        "many in flight; beyond, the pipeline with the lower predicted TTFT wins.",
    )
    rld_step_s: float = Field(
        0.05, gt=0, description="A relay-decode step: the wait per request over its bound."
    )
    threshold_tokens: int = Field(
        512, ge=0, description="threshold policy: relay when more prompt tokens are uncached."
    )
    catch_up_threshold: int = Field(
        64, ge=1, description="More pending eager tokens than this: catch-up handoff."
    )
    catch_up_done: int = Field(
        8, ge=0, description="Catch-up ends with a final handoff once this few are pending."
    )
    rld_busy_requests: int = Field(
        4, ge=1, description="Relay decode this loaded (in flight) is released at once."
    )
    md_busy_requests: int = Field(
        8, ge=1, description="Main decode this loaded takes a handoff in catch-up batches."
    )
    catch_up_batch: int = Field(
        64, ge=1, description="Most tokens in one catch-up batch (one extend forward on MD)."
    )
    switch_pace: float = Field(
        1.25,
        ge=1,
        allow_inf_nan=False,
        description="While main decode takes over, the client's tokens are spaced at most "
        "this many of the request's inter-token intervals (the stream slows, never stops).",
    )
    switch_tokens: int = Field(
        16,
        ge=1,
        description="Before main decode has caught up with the client, relay decode stops only "
        "once main decode has decoded this many tokens after the handoff and, at the pace "
        "they measured, reaches the client before the queued tokens run out.",
    )
    switch_settle_tokens: int = Field(
        2,
        ge=0,
        description="Relay decode keeps streaming until main decode, caught up with the "
        "client, has also decoded this many tokens after its first chunk past the handoff: "
        "its first steps with the request in its batch run slow, and the client is served "
        "from relay decode meanwhile.",
    )
    switch_limit_tokens: int = Field(
        48,
        ge=1,
        description="Relay decode stops at the latest once main decode has decoded this many "
        "tokens after the handoff, in time or not (relay decode is a stage: it frees its "
        "slot); the client's wait for a slower main decode is then spread over the queued "
        "tokens. Unless that wait, spread, would be over twice the paced interval: the stop "
        "then waits until it would not (the paced client lets main decode catch up, or the "
        "queue grow), relay decode ends the request, or main decode has decoded twice this.",
    )
    min_remaining_tokens: int = Field(
        2, ge=1, description="Fewer output tokens left than this: relay decode finishes."
    )
    anomalous_min_input: int = Field(
        2048, ge=1, description="Anomalous traffic: at least this many input tokens..."
    )
    anomalous_max_output: int = Field(
        16, ge=0, description="...and at most this many output tokens: finished on RLD."
    )
    align_prefill_cache: bool = Field(
        True, description="After a request ends on MD, P caches the exchange too (DRC alignment)."
    )
    turn_wait_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="A session's next turn waits at most this long for the previous turn's "
        "DRC alignment (P caching the exchange, or MD settling it); past that it is routed on "
        "what the router's mirror of MD's cache knows then. 0 (default): never waits (on "
        "hetero every wait of 0.5 s ran to its end and was pdd's whole TTFT tail).",
    )
    settle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="When relay decode finished first, how long MD may take to "
        "hold the KV and take the exchange into its cache before it is released.",
    )


UPSTREAM_TIMEOUT_S = 600.0


class RouterConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    system: str = Field(..., description="Name recorded in every record (e.g. cross_site_pd).")
    policy: str = Field(..., description="Routing policy name (see testbed.router.policies).")
    servers: list[ServerEntry]
    records: Path = Field(..., description="Where request records go (JSON lines).")
    host: str = "127.0.0.1"
    port: int = 8000
    upstream_timeout_s: float = Field(
        UPSTREAM_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="A request's whole exchange with a server, at most (dilated under "
        "emulation: the harness multiplies it by k).",
    )
    upstream_keep_alive_s: float = Field(
        upstream_keep_alive_s(),
        gt=0,
        allow_inf_nan=False,
        description="Idle connections to servers close after (see upstream_keep_alive_s).",
    )
    health_interval_s: float = Field(
        0.5, gt=0, allow_inf_nan=False, description="How often each server is probed."
    )
    health_timeout_s: float = Field(
        2.0, gt=0, allow_inf_nan=False, description="How long a server's probe may take."
    )
    pdd: PddConfig | None = None
    limits: RequestLimits = RequestLimits()
    tokenizer: Path | None = Field(
        None, description="The served model's directory: the router tokenizes text prompts."
    )

    def with_role(self, *roles: str) -> list[ServerEntry]:
        return [s for s in self.servers if s.role in roles]
