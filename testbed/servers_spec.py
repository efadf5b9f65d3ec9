"""How a scenario's SGLang servers are launched (``servers:``): the KV pool, the prefix
cache, the KV transfer's timeouts and pacing, TLS, the CPU plan."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from protocol.handoff import PARK_TIMEOUT_S
from protocol.kv import IDLE_TIMEOUT_S, LATE_LEG_S, POOL_REUSE_S
from protocol.names import Role
from testbed.router.config import HTTP_KEEP_ALIVE_S

CPU_ROLES = (*Role, "testbed", "link")


class ServersSpec(BaseModel):
    """How every SGLang server of the scenario is launched."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_total_tokens: int = Field(65536, gt=0, description="KV pool size per server (tokens).")
    mem_fraction_static: float = Field(
        0.2, gt=0, le=1, description="Memory budget share; the pool is still max_total_tokens."
    )
    decode_radix_cache: bool = Field(True, description="Decode-side prefix cache (DRC).")
    decode_prefix_wait: bool = Field(
        True,
        description="Decode holds a request back while most of its uncached prompt's "
        "KV is on its way in another's (engine_patches.kv_transfer.prefix_wait).",
    )
    frame_auth: bool = Field(
        True,
        description="Authenticate every KV and handoff frame (HMAC-SHA256 under a fresh "
        "key per deployment); off only to measure what authentication costs.",
    )
    tls: bool = Field(
        False,
        description="TLS 1.3 on every KV and handoff connection (the WAN legs among them), "
        "with a self-signed certificate made per deployment; make bench-transfer shows "
        "its cost.",
    )
    kv_idle_timeout_s: float = Field(
        IDLE_TIMEOUT_S, gt=0, description="A stalled KV transfer fails after this."
    )
    kv_late_leg_s: float = Field(
        LATE_LEG_S,
        gt=0,
        description="Dual path: how long after relay decode's transfer request main "
        "decode's may come before prefill sends to relay decode only (dilated under "
        "emulation, as the idle timeout is).",
    )
    handoff_park_timeout_s: float = Field(
        PARK_TIMEOUT_S,
        gt=0,
        description="Main decode ends a request that holds its KV but got no handoff for "
        "this long (dilated under emulation).",
    )
    kv_pool_reuse_s: float = Field(
        POOL_REUSE_S,
        gt=0,
        description="Decode servers reuse a pooled KV connection (and the congestion "
        "window it grew) idle less than this; prefill closes one idle twice as long "
        "(dilated under emulation: a deployment's pool outlives many requests).",
    )
    kv_pacing: bool = Field(
        False,
        description="Prefill paces its KV sends (the kernel's TCP pacing, as a host with "
        "the fq qdisc does) instead of sending each congestion window as one burst into "
        "the WAN's rate limiter: on hetero a warm 2.9 MB window lost 163 segments in its "
        "queue and 1.7 MB took 16 s. Off: the kernel's default here.",
    )
    kv_line_share: bool = Field(
        False,
        description="Prefill paces its KV sends across the WAN at an equal share of the "
        "line's rate (0.9 x network.wan.rate_mbit / the sends under way; "
        "engine_patches/kv_transfer/line_share.py): together no faster than the line, so "
        "no pooled window bursts into its queue. Emulated networks only (an inventory's "
        "servers are started by their own agents).",
    )
    http_keep_alive_s: float = Field(
        HTTP_KEEP_ALIVE_S,
        gt=0,
        description="SGLang's HTTP servers close a keep-alive connection idle this long "
        "(SGLANG_TIMEOUT_KEEP_ALIVE); the router closes its own idle ones at 0.4 x this, "
        "first. Dilated under emulation: a router's connections to its servers outlive "
        "many requests, and a token stream on a fresh one over the dilated WAN had its "
        "first round trip capped at the initial window (10 segments: hetero's streams "
        "stalled a round trip at token 10).",
    )
    port: int = Field(
        30000, ge=1, le=65535, description="HTTP port of every server (each has its own host)."
    )
    bootstrap_port: int = Field(
        8998, ge=1, le=65535, description="Prefill servers' KV transfer port."
    )
    router_port: int = Field(
        8000, ge=1, le=65535, description="The router's port on the router host."
    )
    startup_timeout_s: float = Field(300.0, gt=0)
    extra_args: list[str] = Field(
        default_factory=list, description="More sglang.launch_server flags."
    )
    threads: int | None = Field(
        None, ge=1, description="CPU threads per server (OMP_NUM_THREADS); default: torch's choice."
    )
    cpus: dict[str, list[int]] = Field(
        default_factory=dict,
        description="CPU pinning by server role (colocated, prefill, decode, relay_decode, "
        "main_decode), 'testbed' for the rest (router, Locust, and link emulators unless "
        "'link' names their own), so "
        "co-hosted servers compute like separate machines; empty: no pinning.",
    )

    nice: dict[str, int] = Field(
        default_factory=dict,
        description="CPU priority by server role (nice: -20 highest .. 19; below 0 needs root): "
        "of two servers pinned to one core, the one with the lower value gets more of it "
        "while both compute (CFS weights: -5 is about 3x, -10 about 9x a 0's share; its "
        "session's group too, topologies/priority.py, where the kernel groups by session). "
        "Unset: 0. Refused where this user may not set it.",
    )

    @field_validator("nice")
    @classmethod
    def _nice_values(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(Role))
        if unknown:
            raise ValueError(f"unknown roles {unknown}; known: {', '.join(Role)}")
        for role, value in v.items():
            if not -20 <= value <= 19:
                raise ValueError(f"{role}: nice runs from -20 to 19, got {value}")
        return v

    @field_validator("cpus")
    @classmethod
    def _known_cpu_roles(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        unknown = sorted(set(v) - set(CPU_ROLES))
        if unknown:
            raise ValueError(f"unknown roles {unknown}; known: {', '.join(CPU_ROLES)}")
        for role, cpus in v.items():
            if not cpus or any(c < 0 for c in cpus):
                raise ValueError(f"{role}: a non-empty list of CPU numbers, got {cpus}")
        return v
