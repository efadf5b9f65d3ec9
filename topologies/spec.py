"""NetworkSpec: a scenario's network section — topology, hosts per role, links, backend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topologies.emulation import BACKENDS
from topologies.link import LinkSpec
from topologies.schedule import WanEvent, check_schedule
from topologies.site import ROLES
from topologies.topo import TOPOLOGIES, SiteTopo, build_topo

MAX_HOSTS_PER_ROLE = 16


class NetworkSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    topology: str = Field("two_site", description=f"One of {', '.join(TOPOLOGIES)}.")
    hosts: dict[str, int] = Field(
        default_factory=dict, description=f"Hosts per role ({', '.join(ROLES)})."
    )
    lan: LinkSpec = Field(default_factory=LinkSpec, description="Links inside a site (unshaped).")
    wan: LinkSpec = Field(
        default_factory=lambda: LinkSpec(rate_mbit=100, delay_ms=10),
        description="The link between the sites' gateways.",
    )
    backend: str = Field("auto", description=f"Link emulation: auto, {', '.join(BACKENDS)}.")
    wan_schedule: list[WanEvent] = Field(
        default_factory=list,
        description="WAN changes during the load (rate dips, loss bursts, cuts); see "
        "topologies.schedule.",
    )
    check_s: float = Field(
        3.0,
        ge=1,
        le=60,
        description="Seconds each iperf3 measurement of the link check before a bench "
        "system's load runs (WAN TCP and UDP, one LAN pair; pings take 2 s more). "
        "Longer: a tighter measurement; the check warns, the report shows it.",
    )
    tcp_slow_start_after_idle: bool = Field(
        False,
        description="Hosts' net.ipv4.tcp_slow_start_after_idle. Off (the usual tuning for "
        "long-lived WAN connections) lets a reused KV connection keep its window.",
    )

    @field_validator("topology")
    @classmethod
    def _known_topology(cls, v: str) -> str:
        if v not in TOPOLOGIES:
            raise ValueError(f"unknown topology {v!r}; known: {', '.join(TOPOLOGIES)}")
        return v

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v != "auto" and v not in BACKENDS:
            raise ValueError(f"unknown emulation backend {v!r}; known: auto, {', '.join(BACKENDS)}")
        return v

    @field_validator("lan")
    @classmethod
    def _lan_unshaped(cls, v: LinkSpec) -> LinkSpec:
        if v.impaired:
            raise ValueError(
                "LAN links are RDMA-class and unshaped here; put impairments on the wan"
            )
        return v

    @model_validator(mode="after")
    def _schedule_fits_the_wan(self) -> NetworkSpec:
        check_schedule(self.wan_schedule, bool(self.wan.rate_mbit))
        return self

    @field_validator("hosts")
    @classmethod
    def _known_roles(cls, v: dict[str, int]) -> dict[str, int]:
        for role, count in v.items():
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
            if not 0 <= count <= MAX_HOSTS_PER_ROLE:
                raise ValueError(
                    f"hosts.{role}: {count} hosts; 0 to {MAX_HOSTS_PER_ROLE} per role "
                    "(each is a namespace with its own processes)"
                )
        return v

    def topo(self) -> SiteTopo:
        return build_topo(self.topology, hosts=self.hosts, wan=self.wan, lan=self.lan)
