"""An inventory deployment: SGLang servers that already run on other hosts (each
started by hand with ``testbed serve --role ROLE --agent-port N ...``), and the
harness — router, Locust, report — on this machine against them.

What a :class:`~testbed.deployment.Deployment` asks of its network and its servers
has a stand-in here: :class:`LocalHosts` runs the harness's processes on this machine
(no namespaces: the WAN between the hosts is real, nothing is emulated or shaped
here — ``testbed net shape`` does that on a gateway), and :class:`RemoteServer` is a
server known by its URL and its host agent. :class:`LogMirror` copies each host's
transfer log into the run directory as it grows, its times moved onto this machine's
clock by the offset the preflight measured, so the router and the report read one
set of logs on one clock, as from a managed deployment.

Lifecycle (driven by ``Deployment.up`` / ``down``)::

    preflight (testbed.doctor: agent answers, same model, versions, clock, ports, key)
      ─▶ servers healthy ─▶ LogMirror.start() ─▶ router here ─▶ caches flushed
    down(): router stopped, mirror stopped after a last read; the servers keep running
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.frames import read_frame_key
from protocol.names import Role
from testbed.systems import get_system
from topologies.netns import run
from topologies.process import HostProcess

HARNESS = "harness"  # the one "host" of LocalHosts: this machine
PLACES = ("prefill", "relay_decode", "main_decode")  # the two-site plan's server hosts
# Fields of transfer-log lines that are wall-clock times (moved onto the harness's clock)
TIME_FIELDS = ("start", "end", "first_byte", "last_byte", "received", "extended_at", "time")
MIRROR_CHUNK = 4 << 20  # bytes asked of an agent per read


class InventoryHost(BaseModel):
    """One host of an inventory: where its server and its agent answer."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,32}$", description="A short name.")
    place: str = Field(
        ...,
        description="The host's part in the two-site plan: prefill, relay_decode (site A) "
        "or main_decode (site B). A system's server of that place runs there.",
    )
    site: str = Field(..., pattern=r"^[A-Za-z0-9]{1,8}$", description="Its site (A, B).")
    address: str = Field(..., min_length=1, description="Its address, as the harness sees it.")
    port: int = Field(30000, ge=1, le=65535, description="The SGLang server's HTTP port.")
    agent_port: int = Field(30090, ge=1, le=65535, description="`testbed serve --agent-port`.")

    @model_validator(mode="after")
    def _known_place(self) -> InventoryHost:
        if self.place not in PLACES:
            raise ValueError(f"host {self.name}: place must be one of {', '.join(PLACES)}")
        if self.port == self.agent_port:
            raise ValueError(f"host {self.name}: port and agent_port are both {self.port}")
        return self

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def agent_url(self) -> str:
        return f"http://{self.address}:{self.agent_port}"


class InventorySpec(BaseModel):
    """A scenario's ``inventory:``: run against these hosts instead of launching
    servers on an emulated network."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    hosts: list[InventoryHost] = Field(..., min_length=1)
    router_address: str = Field(
        "127.0.0.1", description="Where the router listens on this machine (Locust's target)."
    )
    frame_key_file: Path | None = Field(
        None,
        description="The frame key the hosts were started with (`testbed key`; "
        "`testbed serve --frame-key-file`), needed when servers.frame_auth is on.",
    )
    max_clock_offset_s: float = Field(
        0.05, gt=0, description="The preflight refuses a host whose clock is further off."
    )
    log_poll_s: float = Field(0.1, gt=0, le=5, description="How often transfer logs are read.")

    @model_validator(mode="after")
    def _names_unique(self) -> InventorySpec:
        names = [h.name for h in self.hosts]
        if HARNESS in names:
            raise ValueError(f"inventory: {HARNESS!r} names this machine; pick another name")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"inventory: host names repeat: {', '.join(dup)}")
        return self

    def host(self, name: str) -> InventoryHost:
        return next(h for h in self.hosts if h.name == name)

    def check_scenario(self, scenario) -> None:
        """An inventory's WAN is real and its servers are started by hand: refuse a
        scenario that asks what the testbed would emulate or launch (ValueError)."""
        if scenario.emulation is not None:
            raise ValueError("inventory: emulation paces servers the testbed launches; drop one")
        if scenario.network.wan_schedule:
            raise ValueError("inventory: network.wan_schedule needs the emulated WAN")
        if scenario.servers.tls:
            raise ValueError("inventory: servers.tls is for launched servers only (for now)")
        if scenario.servers.frame_auth and self.frame_key_file is None:
            raise ValueError(
                "inventory: servers.frame_auth is on, so inventory.frame_key_file must name "
                "the key the hosts were started with (or set servers.frame_auth: false)"
            )
        if scenario.servers.frame_auth:
            read_frame_key(self.frame_key_file)  # ValueError naming the file
        places = {h.place for h in self.hosts}
        for name in scenario.systems:
            for role, place in get_system(name).servers:
                if place not in places:
                    raise ValueError(
                        f"inventory: system {name} runs its {role} on a {place} host; "
                        f"the inventory has none"
                    )


class LocalHosts:
    """The network stand-in of an inventory deployment (see the module docstring)."""

    emulated = False
    backend_name = "none: an inventory's WAN is real (shape it with `testbed net shape`)"

    def __init__(self, spec: InventorySpec, name: str = "inventory") -> None:
        self.spec, self.name = spec, name
        self.applied: list = []  # no emulated links

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.spec.hosts] + [HARNESS]

    def hosts_with_role(self, role: str) -> list[str]:
        if role in ("router", "client"):
            return [HARNESS]
        return [h.name for h in self.spec.hosts if h.place == role]

    def role(self, host: str) -> str:
        return "client" if host == HARNESS else self.spec.host(host).place

    def site(self, host: str) -> str:
        return "A" if host == HARNESS else self.spec.host(host).site

    def address(self, host: str) -> str:
        return self.spec.router_address if host == HARNESS else self.spec.host(host).address

    def ns(self, host: str) -> None:
        return None

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        self._only_here(host)
        return list(argv)

    def popen(
        self, host: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> HostProcess:
        self._only_here(host)
        return HostProcess(host, None, argv, log_path, env).start()

    def run(self, host: str, argv: Sequence[str], timeout: float = 60, check: bool = True):
        self._only_here(host)
        return run(argv, timeout=timeout, check=check)

    def _only_here(self, host: str) -> None:
        if host != HARNESS:
            raise RuntimeError(f"{host} is an inventory host: the testbed runs nothing there")

    def up(self) -> LocalHosts:
        return self

    def down(self) -> None:
        pass

    def problems(self) -> list[str]:
        return []


@dataclass(frozen=True)
class RemoteSpec:
    """What the deployment and the router need of a server they did not launch."""

    url: str
    host: str  # its address
    role: str  # as SGLang runs it (prefill, decode, colocated)

    def argv(self) -> list[str]:
        return []  # started by hand on its host


class RemoteServer:
    """A server of an inventory host: healthy or not by its /health, never started or
    stopped here."""

    HEALTH_EVERY_S = 2.0

    def __init__(self, host: InventoryHost, role: Role, agent_info: dict) -> None:
        self.inventory_host = host
        self.spec = RemoteSpec(host.url, host.address, role.launched_as)
        self.agent_info = agent_info
        self.pid = None
        self._checked, self._healthy, self._why = 0.0, True, ""

    def start(self) -> RemoteServer:
        return self

    def stop(self, grace: float = 0.0) -> None:
        return None  # not ours to stop

    def alive(self) -> bool:
        now = time.monotonic()
        if now - self._checked >= self.HEALTH_EVERY_S:
            self._checked = now
            try:
                status = httpx.get(f"{self.spec.url}/health", timeout=5).status_code
                self._healthy, self._why = status == 200, f"/health answered {status}"
            except httpx.HTTPError as exc:
                self._healthy, self._why = False, f"/health: {exc!r}"
        return self._healthy

    def log_tail(self, lines: int = 25) -> str:
        where = self.inventory_host
        return f"{self._why} (its log is on {where.name}, {where.address})"

    def wait_healthy(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._checked = 0.0
            if self.alive():
                return
            time.sleep(1.0)
        raise RuntimeError(
            f"inventory host {self.inventory_host.name}: its server at {self.spec.url} is "
            f"not healthy after {timeout:.0f} s ({self._why})"
        )

    def kv_pool_tokens(self) -> int | None:
        from testbed.server import kv_pool_tokens

        return kv_pool_tokens(self.spec.url)

    def describe(self) -> dict:
        return {"started": "by hand (inventory)", "agent": self.agent_info}


def on_harness_clock(line: dict, offset_s: float) -> dict:
    """A transfer-log line of a host whose clock is ``offset_s`` ahead of this one,
    with its times on this machine's clock."""
    return {
        k: v - offset_s if k in TIME_FIELDS and isinstance(v, int | float) and v else v
        for k, v in line.items()
    }


class LogMirror:
    """Each host's transfer log, copied into the run directory as it grows (complete
    lines only; times moved by the host's clock offset). Only what the host logs after
    ``start`` is copied: its earlier runs are not this one's."""

    def __init__(self, sources: list[tuple[str, Path, float]], poll_s: float) -> None:
        """``sources``: (agent URL, local file, the host's clock offset in seconds)."""
        self.sources, self.poll_s = sources, poll_s
        self.offsets: dict[str, int] = {}
        self.errors: dict[str, tuple[float, str]] = {}  # agent → (since, last error)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=10)

    def start(self) -> LogMirror:
        for url, dest, _ in self.sources:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.touch()
            self.offsets[url] = self._size(url)
        self._thread = threading.Thread(target=self._run, name="pdd-log-mirror", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.read_once()  # what the hosts logged up to now
        self._client.close()

    def _size(self, url: str) -> int:
        r = self._client.get(f"{url}/transfers", params={"offset": 0, "limit": 0})
        r.raise_for_status()
        return int(r.headers["x-log-size"])

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.read_once()

    def read_once(self) -> None:
        for url, dest, offset_s in self.sources:
            try:
                self._copy(url, dest, offset_s)
                self.errors.pop(url, None)
            except (httpx.HTTPError, ValueError, KeyError) as exc:  # retried next poll
                since = self.errors.get(url, (time.monotonic(), ""))[0]
                self.errors[url] = (since, repr(exc))

    def problems(self, after_s: float = 5.0) -> list[str]:
        """Agents whose log could not be read for ``after_s``: the run's records would
        miss their transfers."""
        now = time.monotonic()
        return [
            f"the transfer log at {url} unread for {now - since:.0f} s: {error}"
            for url, (since, error) in list(self.errors.items())
            if now - since > after_s
        ]

    def _copy(self, url: str, dest: Path, offset_s: float) -> None:
        while True:
            start = self.offsets[url]
            params = {"offset": start, "limit": MIRROR_CHUNK}
            r = self._client.get(f"{url}/transfers", params=params)
            r.raise_for_status()
            if int(r.headers["x-log-size"]) < start:  # the host's log was replaced
                self.offsets[url] = 0
                continue
            body = r.content
            complete = body[: body.rfind(b"\n") + 1]
            if not complete:
                return
            lines = []
            for raw in complete.splitlines():
                try:
                    lines.append(json.dumps(on_harness_clock(json.loads(raw), offset_s)))
                except ValueError:
                    lines.append(raw.decode(errors="replace"))  # the reader names it
            with open(dest, "a") as f:
                f.write("\n".join(lines) + "\n")
            self.offsets[url] = start + len(complete)
            if len(body) < MIRROR_CHUNK:
                return
