"""RouterConfig: the servers the router may use and how to route between them."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

SERVER_ROLES = ("colocated", "prefill", "decode", "relay_decode", "main_decode")


class ServerEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    url: str = Field(..., description="http://host:port of the SGLang server.")
    role: str = Field(..., description=f"One of {SERVER_ROLES}.")
    site: str = "A"
    host: str = Field(..., description="Address other servers use (bootstrap host).")
    bootstrap_port: int | None = Field(None, description="Prefill servers: KV listener port.")
    transfer_log: Path | None = Field(None, description="The server's KV transfer log.")


class RouterConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    system: str = Field(..., description="Name recorded in every record (e.g. cross_site_pd).")
    policy: str = Field(..., description="Routing policy name (see testbed.router.policies).")
    servers: list[ServerEntry]
    records: Path = Field(..., description="Where request records go (JSON lines).")
    host: str = "127.0.0.1"
    port: int = 8000
    upstream_timeout_s: float = 600.0

    def with_role(self, *roles: str) -> list[ServerEntry]:
        return [s for s in self.servers if s.role in roles]
