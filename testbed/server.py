"""One SGLang server per role, launched with the flags right for the host.

Lifecycle of :class:`SGLangServer`: created (nothing runs) → ``start()`` spawns
``python -m sglang.launch_server`` in a new process group (here, or inside a host of
an emulated network) → ``wait_healthy()`` polls ``/health`` until it answers, the
process dies or a deadline passes → serving → ``stop()`` sends SIGTERM to the whole
group (SGLang's scheduler and detokenizer subprocesses included), then SIGKILL after
a grace period. ``stop()`` is idempotent and also runs on context-manager exit.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from protocol.env import Env
from protocol.names import Role
from topologies.priority import priority_argv
from topologies.process import HostProcess

ROLES = (Role.COLOCATED, Role.PREFILL, Role.DECODE)  # the roles SGLang itself knows
# A prefill server allocates multi-MB buffers of a new size for every prompt length
# (forward temporaries, KV pages to send). glibc's sliding mmap threshold serves them
# from its heaps, where they fragment: soak, prefill scheduler RSS +11% in 25 minutes,
# not returned by a periodic malloc_trim either. A fixed threshold maps each such
# buffer and returns it at free (soak: +1.2%). Only prefill gets it: on the decoders it
# made every large torch temporary of every step a fresh mapping (ITL +23%), and their
# RSS did not grow.
PREFILL_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "MALLOC_ARENA_MAX": "2"}


@functools.cache
def host_has_cuda() -> bool:
    """A usable CUDA device and a CUDA torch; otherwise SGLang runs on the CPU engine."""
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None and torch.cuda.is_available()


@dataclass(frozen=True)
class ServerSpec:
    """What to launch; ``argv``/``env`` are derived, so any launcher can run it."""

    model_path: Path
    role: str = "colocated"
    host: str = "127.0.0.1"
    port: int = 30000
    max_total_tokens: int = 65536
    mem_fraction_static: float = 0.2  # a budget; max_total_tokens bounds the pool
    transfer_backend: str = "tcp"
    bootstrap_port: int = 8998
    decode_radix_cache: bool = True
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    cpus: tuple[int, ...] = ()  # pinned to these CPUs (taskset); empty: not pinned
    nice: int = 0  # CPU priority over the launcher's (nice -n); below 0 needs root
    cuda: bool = field(default_factory=host_has_cuda)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        if self.max_total_tokens <= 0:
            raise ValueError("max_total_tokens must be positive (the KV pool is always bounded)")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.model_path),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--mem-fraction-static",
            str(self.mem_fraction_static),
            "--log-level",
            "info",
            # Block on the sockets when idle instead of spinning a core per server.
            "--sleep-on-idle",
        ]
        if not self.cuda:
            # The CPU engine: torch_native attention (the x86 default needs AMX
            # kernels), fp32. No overlap scheduling: it only helps with an async
            # device stream, and its PD paths record torch.cuda events.
            args += [
                "--device",
                "cpu",
                "--attention-backend",
                "torch_native",
                "--dtype",
                "float32",
                "--disable-overlap-schedule",
            ]
        args += ROLE_ARGS[self.role](self) + list(self.extra_args)
        if self.cpus:  # SGLang's subprocesses and threads inherit the mask
            args = ["taskset", "-c", ",".join(map(str, self.cpus)), *args]
        # ... and the priority (its session's too: topologies.priority)
        return priority_argv(self.nice, args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[Env.PLUGIN] = "1"  # the project's SGLang plugin patches this server
        if not self.cuda:
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            # Several servers share the host's cores: OpenMP threads that spin after
            # each parallel region would steal them from the other servers (measured:
            # TTFT 2-3x worse with two servers on two cores).
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if self.role == Role.PREFILL:
            env.update(PREFILL_MALLOC_ENV)  # the scenario's extra_env may still override
        env.update(self.extra_env)
        return env


def _colocated_args(spec: ServerSpec) -> list[str]:
    return []


def _prefill_args(spec: ServerSpec) -> list[str]:
    return [
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-transfer-backend",
        spec.transfer_backend,
        "--disaggregation-bootstrap-port",
        str(spec.bootstrap_port),
    ]


def _decode_args(spec: ServerSpec) -> list[str]:
    args = [
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        spec.transfer_backend,
    ]
    if spec.decode_radix_cache:
        args.append("--disaggregation-decode-enable-radix-cache")
    if not spec.cuda:
        args += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    return args


ROLE_ARGS: dict[str, Callable[[ServerSpec], list[str]]] = {
    "colocated": _colocated_args,
    "prefill": _prefill_args,
    "decode": _decode_args,
}


class ServerError(RuntimeError):
    """A server that did not come up, or died; the message names its log."""


def check_nice(nice: dict[str, int]) -> None:
    """Refuse a CPU priority this user may not give (``nice`` would only warn, and the
    servers would run at equal priority where the scenario says otherwise)."""
    wanted = {role: n for role, n in nice.items() if n < 0}
    if not wanted or os.geteuid() == 0:
        return
    floor = 20 - resource.getrlimit(resource.RLIMIT_NICE)[0]  # the lowest nice allowed
    now = os.getpriority(os.PRIO_PROCESS, 0)
    refused = {role: n for role, n in wanted.items() if now + n < floor}
    if refused:
        raise ServerError(
            f"servers.nice {refused} raises priority, which needs root (or RLIMIT_NICE); "
            "run as root or drop those entries from the scenario"
        )


class SGLangServer:
    """A running SGLang server process (see the module docstring for its lifecycle).

    Runs on this host, or inside a host of an emulated network when ``net`` and
    ``host`` are given (then ``spec.host`` should be that host's address).
    """

    def __init__(self, spec: ServerSpec, log_path: Path, net=None, host: str | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self._net, self._host = net, host
        self._proc: HostProcess | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> SGLangServer:
        argv, env = self.spec.argv(), self.spec.env()
        if self._net is not None:
            self._proc = self._net.popen(self._host, argv, self.log_path, env)
        else:
            self._proc = HostProcess("local", None, argv, self.log_path, env).start()
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self._proc.log().splitlines()[-lines:]) if self._proc else "(no log)"

    def wait_healthy(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(
                    f"SGLang {self.spec.role} server exited with status {self._proc.returncode} "
                    f"before becoming healthy; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.spec.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerError(
            f"SGLang {self.spec.role} server not healthy after {timeout:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def kv_pool_tokens(self) -> int | None:
        return kv_pool_tokens(self.spec.url)

    def stop(self, grace: float = 20.0) -> int | None:
        """Terminate the server and every process in its group; returns its exit status."""
        return self._proc.stop(grace) if self._proc else None

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_certificate(directory: Path) -> dict[str, str]:
    """A self-signed certificate for one deployment (``servers.tls``): the environment
    that hands it to servers and router. The key is readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    argv += ["-nodes", "-days", "7", "-subj", "/CN=pdd-testbed deployment"]
    done = subprocess.run(
        [*argv, "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ServerError(f"servers.tls: openssl could not make a certificate: {done.stderr}")
    key.chmod(0o600)
    return {Env.TLS_CERT: str(cert), Env.TLS_KEY: str(key)}


def server_env(cfg, transfer_log: Path, handoff_port: int | None = None, frame_key: str = ""):
    """The project's environment for one server: its transfer log, the KV transfer's
    timeouts, the frame key, the handoff port (main decode) and its thread count."""
    env = [
        (Env.KV_TRANSFER_LOG, str(transfer_log)),
        (Env.KV_IDLE_TIMEOUT_S, str(cfg.kv_idle_timeout_s)),
        (Env.KV_LATE_LEG_TIMEOUT_S, str(cfg.kv_late_leg_s)),
        (Env.KV_POOL_REUSE_TIMEOUT_S, str(cfg.kv_pool_reuse_s)),
        (Env.HANDOFF_PARK_TIMEOUT_S, str(cfg.handoff_park_timeout_s)),
        (Env.HTTP_KEEP_ALIVE_S, str(math.ceil(cfg.http_keep_alive_s))),
    ]
    if cfg.kv_pacing:
        env.append((Env.KV_PACING, "1"))
    if cfg.decode_prefix_wait:
        env.append((Env.DECODE_PREFIX_WAIT, "1"))
    if frame_key:
        env.append((Env.FRAME_KEY, frame_key))
    if handoff_port is not None:
        env.append((Env.HANDOFF_PORT, str(handoff_port)))
    if cfg.threads:
        env.append(("OMP_NUM_THREADS", str(cfg.threads)))
    return tuple(env)


def kv_pool_tokens(url: str) -> int | None:
    """The KV pool an SGLang server at ``url`` actually allocated (it can be below
    --max-total-tokens when the memory budget is smaller); None if it does not say."""
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    return _find_key(info, "max_total_num_tokens")


def _find_key(data, key: str):
    """The first integer under ``key`` anywhere in nested JSON."""
    if isinstance(data, dict):
        if isinstance(data.get(key), int):
            return data[key]
        values = list(data.values())
    elif isinstance(data, list):
        values = data
    else:
        return None
    for value in values:
        found = _find_key(value, key)
        if found is not None:
            return found
    return None
