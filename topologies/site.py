"""SiteSpec and the address plan: which hosts of which roles live in which site."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from topologies.link import LinkSpec

# Role → host-name prefix. Names stay short: they become namespace and port names.
ROLE_PREFIX = {
    "prefill": "p",
    "relay_decode": "rld",
    "main_decode": "md",
    "router": "rt",
    "client": "c",
}
ROLES = tuple(ROLE_PREFIX)
SUBNET_BASE = "10.77"  # site i → 10.77.i.0/24; the WAN → 10.77.0.0/30
HOST_OFFSET = 10  # first host address in a site is .10; the gateway is .1


class SiteSpec(BaseModel):
    """One datacenter: a LAN with hosts per role."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(..., pattern=r"^[A-Z]$", description="One capital letter: A, B.")
    roles: dict[str, int] = Field(default_factory=dict, description="Hosts per role.")
    lan: LinkSpec = Field(default_factory=LinkSpec, description="Links inside the site.")

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: dict[str, int]) -> dict[str, int]:
        for role, count in roles.items():
            if role not in ROLE_PREFIX:
                raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
            if count < 0 or count > 50:
                raise ValueError(f"{role}: host count must be 0..50, got {count}")
        return roles

    @property
    def index(self) -> int:
        return ord(self.name) - ord("A") + 1

    @property
    def subnet(self) -> str:
        return f"{SUBNET_BASE}.{self.index}.0/24"

    @property
    def gateway_ip(self) -> str:
        return f"{SUBNET_BASE}.{self.index}.1"

    @property
    def gateway(self) -> str:
        return f"gw{self.name}"

    @property
    def switch(self) -> str:
        return f"s{self.name}"

    def host_names(self) -> list[tuple[str, str]]:
        """(host name, role) for every host, in a stable order."""
        return [
            (f"{ROLE_PREFIX[role]}{i}", role)
            for role in ROLES
            for i in range(1, self.roles.get(role, 0) + 1)
        ]
