"""Deployment: one system of a scenario, running on its emulated network.

Lifecycle::

    Deployment(scenario, system, run_dir) ──up()──▶ serving ──down()──▶ stopped
      up(): the testbed pinned to its CPUs (servers.cpus; the network's link
            emulators to the 'link' ones) → network up → model
            resolved → every SGLang server started in its host's namespace (in
            parallel, on its role's CPUs) and healthy → router started on the router
            host and healthy → manifest written.  Any failure tears everything down.
      down(): router and servers stopped (SIGTERM, then SIGKILL), network torn down,
            the CPU mask restored. Safe before ``up()``, after a failed one, twice:
            callers call ``up()`` inside the ``try`` whose ``finally`` calls it.

``testbed up`` leaves a deployment serving after it exits; ``testbed down`` (or
``topologies.registry.down_by_name``) ends it from the namespaces alone.

With a scenario ``inventory:`` the servers already run on other hosts: ``up()`` then
runs the preflight instead of the network, attaches to the servers (healthy, caches
flushed once the router is up) and mirrors their transfer logs into the run
directory; ``down()`` leaves them running (see :mod:`testbed.inventory`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from protocol.env import Env
from protocol.frames import new_frame_key, read_frame_key, set_frame_key
from protocol.kv import LINE_SHARE_HEADROOM
from protocol.names import Role
from testbed import cpu_share
from testbed.dilation import for_testbed, pacing_env
from testbed.inventory import LocalHosts, LogMirror, RemoteServer
from testbed.manifest import manifest
from testbed.model import describe as describe_model
from testbed.model import serving_limits
from testbed.pinning import CpuPins
from testbed.router.config import (
    UPSTREAM_TIMEOUT_S,
    RouterConfig,
    ServerEntry,
    upstream_keep_alive_s,
)
from testbed.router.validate import RequestLimits
from testbed.scenario import Scenario
from testbed.server import (
    ServerError,
    ServerSpec,
    SGLangServer,
    check_nice,
    make_certificate,
    server_env,
)
from testbed.systems import SystemSpec, get_system
from topologies.network import Network
from topologies.process import HostProcess


@dataclass
class RunningServer:
    name: str
    role: Role
    host: str
    site: str
    server: SGLangServer

    @property
    def spec(self) -> ServerSpec:
        return self.server.spec


class Deployment:
    def __init__(self, scenario: Scenario, system: str, run_dir: Path, net_name: str = "default"):
        if scenario.emulation is not None:  # servers pace, so the rest runs in testbed time
            tiny_kv = describe_model(scenario.model.resolve())["kv_bytes_per_token"]
            scenario = for_testbed(scenario, tiny_kv)
        self.scenario = scenario
        self.system: SystemSpec = get_system(system)
        self.run_dir = Path(run_dir)
        inventory = scenario.inventory
        self.net = (
            Network(scenario.network, net_name, log_dir=self.run_dir)
            if inventory is None
            else LocalHosts(inventory)
        )
        self.mirror: LogMirror | None = None  # an inventory's transfer logs, copied here
        self.clock_offsets_ms: dict[str, float] = {}  # an inventory host's clock − ours
        self.servers: list[RunningServer] = []
        self.router: HostProcess | None = None
        self.router_host: str | None = None
        self.pins: CpuPins | None = None  # servers.cpus, applied in up()
        # Handed to the servers and the router only (never written to the run directory)
        self.frame_key = new_frame_key() if scenario.servers.frame_auth else ""
        if inventory is not None and scenario.servers.frame_auth:  # the hosts' key
            self.frame_key = read_frame_key(inventory.frame_key_file)
        self.tls_env: dict[str, str] = {}  # servers.tls: the certificate's paths, once made
        self.cpu_mark: dict | None = None  # each process's CPU seconds when the load started
        self.stopped = False

    @property
    def router_url(self) -> str:
        return f"http://{self.net.address(self.router_host)}:{self.scenario.servers.router_port}"

    def transfer_log(self, name: str) -> Path:
        return self.run_dir / f"transfers-{name}.jsonl"

    def pacing_log(self, name: str) -> Path:
        return self.run_dir / f"pacing-{name}.jsonl"

    @property
    def records_path(self) -> Path:
        return self.run_dir / "records.jsonl"

    # -- lifecycle ------------------------------------------------------------------
    def up(self) -> Deployment:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pins = CpuPins(self.scenario.servers.cpus)
        check_nice(self.scenario.servers.nice)
        try:
            self.pins.pin("link")  # the link emulators the network starts keep this mask
            self.net.up()
            self.pins.pin("testbed")
        except BaseException:
            self.pins.restore()
            raise
        # This process speaks frames too (bench-handoff's trials, the tests): same key.
        set_frame_key(bytes.fromhex(self.frame_key) or None)
        if self.scenario.servers.tls:
            self.tls_env = make_certificate(self.run_dir / "tls")
        for name in (Env.TLS_CERT, Env.TLS_KEY):  # and the same TLS setting
            os.environ.pop(name, None)
        os.environ.update(self.tls_env)
        try:
            model = self.scenario.model.resolve()
            if self.scenario.inventory is None:
                self._start_servers(model)
            else:
                self._attach_inventory()
            self._start_router()
            if self.scenario.inventory is not None:  # long-running servers: a cold start
                httpx.post(f"{self.router_url}/flush_cache", timeout=60).raise_for_status()
            self._write_manifest(model)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if key := self.tls_env.get(Env.TLS_KEY):  # a dead deployment's key is kept nowhere
            Path(key).unlink(missing_ok=True)
        set_frame_key(None)  # nor its frame key, in this process
        for name in self.tls_env:
            os.environ.pop(name, None)
        self._write_cpu_shares()
        if self.router is not None:
            self.router.stop()
        with ThreadPoolExecutor(max_workers=max(1, len(self.servers))) as pool:
            list(pool.map(lambda s: s.server.stop(), self.servers))
        if self.mirror is not None:
            self.mirror.stop()
        self.net.down()
        if self.pins is not None:
            self.pins.restore()

    def problems(self) -> list[str]:
        """Servers, the router or link emulators that died since ``up``: each named,
        with the end of its log."""
        found = [
            f"server {s.name} died:\n{s.server.log_tail(8)}"
            for s in self.servers
            if not s.server.alive()
        ]
        if self.router is not None and not self.router.alive():
            found.append(f"the router died:\n{self.router.log()[-1500:]}")
        if self.mirror is not None:
            found += self.mirror.problems()
        return found + self.net.problems()

    def mark_cpu(self) -> None:
        """The load starts: cpu.json gives each process's share from now on too."""
        try:
            self.cpu_mark = cpu_share.mark(self.net)
        except Exception:  # accounting must never stop a run
            self.cpu_mark = None

    def _write_cpu_shares(self) -> None:
        """cpu.json: each process's CPU seconds and share, the testbed's own beside the
        servers' (best effort: a deployment that never came up has none)."""
        try:
            rows = cpu_share.processes(self.net, self.cpu_mark)
        except Exception:  # accounting must never stop a teardown
            return
        if rows:
            (self.run_dir / "cpu.json").write_text(json.dumps(rows, indent=2))

    def __enter__(self) -> Deployment:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- servers ----------------------------------------------------------------------
    def _start_servers(self, model: Path) -> None:
        cfg = self.scenario.servers
        for role, net_role in self.system.servers:
            hosts = self.net.hosts_with_role(net_role)
            if not hosts:
                raise ServerError(
                    f"system {self.system.name} needs a {net_role} host; "
                    f"the scenario's network has none"
                )
            for host in hosts:
                name = f"{role}-{host}"
                spec = ServerSpec(
                    model_path=model,
                    role=role.launched_as,
                    host=self.net.address(host),
                    port=cfg.port,
                    max_total_tokens=cfg.max_total_tokens,
                    mem_fraction_static=cfg.mem_fraction_static,
                    bootstrap_port=cfg.bootstrap_port,
                    decode_radix_cache=cfg.decode_radix_cache,
                    extra_args=tuple(cfg.extra_args),
                    cpus=self.pins.cpus_for(role),
                    nice=cfg.nice.get(role, 0),
                    extra_env=server_env(
                        cfg, self.transfer_log(name), self._handoff_port(role), self.frame_key
                    )
                    + tuple(self.tls_env.items())
                    + line_env(self.scenario, self.net, role, host)
                    + pacing_env(self.scenario, self.net.site(host), str(self.pacing_log(name))),
                )
                server = SGLangServer(spec, self.run_dir / f"server-{name}.log", self.net, host)
                self.servers.append(RunningServer(name, role, host, self.net.site(host), server))
        for s in self.servers:
            s.server.start()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        cfg = self.scenario.servers
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            list(pool.map(lambda s: s.server.wait_healthy(cfg.startup_timeout_s), self.servers))
        for s in self.servers:
            # A smaller pool than configured would make every result about memory
            # pressure, not about the system: refuse instead of measuring it.
            tokens = s.server.kv_pool_tokens()
            if tokens is not None and tokens < cfg.max_total_tokens:
                raise ServerError(
                    f"{s.name} allocated a KV pool of {tokens} tokens, below "
                    f"servers.max_total_tokens={cfg.max_total_tokens}; raise "
                    f"servers.mem_fraction_static or lower max_total_tokens"
                )

    def _attach_inventory(self) -> None:
        """The servers of an inventory: preflight (refused with every problem named),
        then each healthy, with its pool checked and its transfer log mirrored here."""
        from testbed import doctor

        inventory = self.scenario.inventory
        checks = doctor.check_inventory(self.scenario)
        problems = [p for c in checks for p in c.problems]
        if problems:
            raise ServerError("inventory preflight (testbed doctor):\n  " + "\n  ".join(problems))
        by_host = {h.name: c for h, c in zip(inventory.hosts, checks, strict=True)}
        self.clock_offsets_ms = {name: c.offset_ms for name, c in by_host.items()}
        sources = []
        for role, place in self.system.servers:
            for host in self.net.hosts_with_role(place):
                name, entry = f"{role}-{host}", inventory.host(host)
                server = RemoteServer(entry, role, by_host[host].info)
                self.servers.append(RunningServer(name, role, host, entry.site, server))
                offset_s = by_host[host].offset_ms / 1000
                sources.append((entry.agent_url, self.transfer_log(name), offset_s))
        self._wait_healthy()
        self.mirror = LogMirror(sources, inventory.log_poll_s).start()

    def _handoff_port(self, role: str) -> int | None:
        """Main decode of a pdd deployment listens for token-ID handoffs."""
        return self.scenario.pdd.handoff_port if role == Role.MAIN_DECODE else None

    def _pdd_config(self):
        if not self.system.relayed:
            return None
        model, wan = self.scenario.model.resolve(), self.scenario.network.wan
        paced = LINE_SHARE_HEADROOM if self.scenario.servers.kv_line_share else 0.0
        return self.scenario.pdd.model_copy(
            update={
                "wan_rate_mbit": wan.rate_mbit,
                "wan_one_way_s": wan.delay_ms / 1000,
                "wan_jitter_s": wan.jitter_ms / 1000,
                "wan_loss_pct": wan.loss_pct,
                "wan_queue_bytes": wan.queue_packets * wan.mtu,
                "wan_congestion_control": wan.congestion_control,
                "wan_paced_share": paced,
                "kv_bytes_per_token": describe_model(model)["kv_bytes_per_token"],
                "md_cache_tokens": self.scenario.servers.max_total_tokens,
                "kv_pool_reuse_s": self.scenario.servers.kv_pool_reuse_s,
            }
        )

    @property
    def _dilation(self) -> float:
        emulation = self.scenario.emulation
        return emulation.dilation if emulation is not None else 1.0

    def _request_limits(self) -> RequestLimits:
        """What the router lets through: ids within the vocabulary, prompt and output
        within the context (and the KV pool), the model's names."""
        model = self.scenario.model.resolve()
        vocab, context = serving_limits(model)
        pool = self.scenario.servers.max_total_tokens
        return RequestLimits(
            vocab_size=vocab,
            context_tokens=min(context or pool, pool),
            served_models=(str(model), model.name, "default"),
        )

    def _start_router(self) -> None:
        cfg = self.scenario.servers
        self.router_host = self.net.hosts_with_role("router")[0]
        entries = [
            ServerEntry(
                name=s.name,
                url=s.spec.url,
                role=s.role,
                site=s.site,
                host=s.spec.host,
                bootstrap_port=cfg.bootstrap_port if s.role == Role.PREFILL else None,
                transfer_log=self.transfer_log(s.name),
            )
            for s in self.servers
        ]
        config = RouterConfig(
            system=self.system.name,
            policy=self.system.policy,
            servers=entries,
            records=self.records_path,
            host=self.net.address(self.router_host),
            port=cfg.router_port,
            pdd=self._pdd_config(),
            limits=self._request_limits(),
            upstream_keep_alive_s=upstream_keep_alive_s(self.scenario.servers.http_keep_alive_s),
            # A far server's probe crosses the WAN; under emulation probes are as rare in
            # testbed time as in the target's, so they take no more of the dilated WAN.
            health_interval_s=0.5 * self._dilation,
            health_timeout_s=2.0 * self._dilation + 8 * self.scenario.network.wan.delay_ms / 1000,
            # 600 s of the target's time: at k = 203 an undilated one is 3 s of it, and
            # a baseline's queue under load timed requests out (hetero run 144348)
            upstream_timeout_s=UPSTREAM_TIMEOUT_S * self._dilation,
            tokenizer=self.scenario.model.resolve(),
        )
        path = self.run_dir / "router.json"
        path.write_text(config.model_dump_json(indent=2))
        self.router = self.net.popen(
            self.router_host,
            [*cpu_share.harness_priority(), sys.executable, "-m", "testbed.router", str(path)],
            self.run_dir / "router.log",
            env={**os.environ, Env.FRAME_KEY: self.frame_key, **self.tls_env},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.router.alive():
                raise ServerError(f"router exited: {self.router.log()[-2000:]}")
            try:
                if httpx.get(self.router_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise ServerError(f"router not healthy after 60 s: {self.router.log()[-2000:]}")

    def _write_manifest(self, model: Path) -> None:
        path = self.run_dir / "manifest.json"
        path.write_text(json.dumps(manifest(self, model), indent=2, default=str))


def line_env(scenario: Scenario, net, role: str, host: str) -> tuple[tuple[str, str], ...]:
    """servers.kv_line_share: a prefill server's KV sends to the other sites' hosts
    share the WAN's rate (the scenario's, in testbed time)."""
    rate = scenario.network.wan.rate_mbit
    if not scenario.servers.kv_line_share or role != Role.PREFILL or not rate:
        return ()
    site = net.site(host)
    peers = sorted(net.address(h) for h in net.hosts if net.site(h) != site)
    return ((Env.KV_LINE, json.dumps({"rate_bytes_s": rate * 1e6 / 8, "peers": peers})),)
