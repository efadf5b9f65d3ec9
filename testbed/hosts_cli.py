"""The commands of a multi-host deployment: ``testbed key`` (a deployment's frame
key), ``testbed serve`` (one server, with what a host the testbed does not launch
needs: ports, transfer log, frame key, host agent) and ``testbed doctor`` (the
preflight of such hosts). ``testbed.cli`` registers them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import typer
from rich.table import Table

from protocol.env import Env
from protocol.frames import new_frame_key
from protocol.handoff import PARK_TIMEOUT_S
from protocol.kv import IDLE_TIMEOUT_S, LATE_LEG_S, POOL_REUSE_S
from protocol.names import Role
from testbed import model as model_mod
from testbed.agent import HostAgent, key_fingerprint
from testbed.console import console
from testbed.server import ServerError, ServerSpec, SGLangServer


def resolve_model(model: Path | None) -> Path:
    """A given model directory, or the default tiny model (built on first use)."""
    if model is None:
        return model_mod.build(model_mod.ModelShape())
    if not (model / "config.json").exists():
        raise typer.BadParameter(f"{model} is not a model directory (no config.json)")
    return model


def read_frame_key(path: Path) -> str:
    """A frame key file's hex key; a clear error if it is not one."""
    from protocol.frames import read_frame_key as read

    try:
        return read(path)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def key(out: Path = typer.Argument(..., help="File to write the new key to (mode 600).")) -> None:
    """Write a fresh frame key for a deployment whose servers run elsewhere: hand the
    file to every `testbed serve --frame-key-file` and to the harness."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_frame_key() + "\n")
    typer.echo(f"frame key written to {out}")


def serve(
    role: str = typer.Option(
        "colocated", help=f"Server role: {', '.join(Role)} (relay and main decode run as decode)."
    ),
    model: Path = typer.Option(None, help="Model directory (default: the built-in tiny model)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(30000, help="HTTP port."),
    max_total_tokens: int = typer.Option(65536, help="KV pool size in tokens (always bounded)."),
    log: Path = typer.Option(Path("runs/serve.log"), help="Server log file."),
    startup_timeout: float = typer.Option(240.0, help="Seconds to wait for health."),
    bootstrap_port: int = typer.Option(
        8998, min=1, max=65535, help="Prefill: the KV transfer listener's port."
    ),
    handoff_port: int = typer.Option(
        None, min=1, max=65535, help="Main decode: the token-id handoff listener's port."
    ),
    transfer_log: Path = typer.Option(
        None, help="Where the server logs each KV transfer and handoff (JSON lines)."
    ),
    kv_idle_timeout: float = typer.Option(
        IDLE_TIMEOUT_S, help="A stalled KV transfer fails after this."
    ),
    kv_late_leg: float = typer.Option(
        LATE_LEG_S, help="Dual path: how long main decode's request may come after relay decode's."
    ),
    kv_pool_reuse: float = typer.Option(
        POOL_REUSE_S, help="Decode: reuse a pooled KV connection idle less than this."
    ),
    handoff_park_timeout: float = typer.Option(
        PARK_TIMEOUT_S, help="Main decode: end a request holding its KV but no handoff after."
    ),
    decode_prefix_wait: bool = typer.Option(
        True, help="Decode: hold a request back while most of its prompt's KV is on its way."
    ),
    frame_key_file: Path = typer.Option(
        None,
        help="The deployment's frame key (hex, as `testbed key` writes it): KV and handoff "
        "frames are then authenticated; every server and the router need the same one.",
    ),
    agent_port: int = typer.Option(
        None,
        min=1,
        max=65535,
        help="Also answer `testbed doctor` here (GET /host: model hash, versions, clock).",
    ),
) -> None:
    """Launch one SGLang server for ROLE, wait until healthy, serve until Ctrl-C/SIGTERM.
    With the ports and the transfer log, a host of a deployment the testbed does not
    launch itself (an inventory) serves as a launched one would."""
    if role not in list(Role):
        raise typer.BadParameter(f"role must be one of {', '.join(Role)}")
    env = [
        (Env.KV_IDLE_TIMEOUT_S, str(kv_idle_timeout)),
        (Env.KV_LATE_LEG_TIMEOUT_S, str(kv_late_leg)),
        (Env.KV_POOL_REUSE_TIMEOUT_S, str(kv_pool_reuse)),
        (Env.HANDOFF_PARK_TIMEOUT_S, str(handoff_park_timeout)),
    ]
    if transfer_log is not None:
        transfer_log = transfer_log.resolve()
        transfer_log.parent.mkdir(parents=True, exist_ok=True)
        env.append((Env.KV_TRANSFER_LOG, str(transfer_log)))
    if handoff_port is not None:
        env.append((Env.HANDOFF_PORT, str(handoff_port)))
    if decode_prefix_wait:
        env.append((Env.DECODE_PREFIX_WAIT, "1"))
    frame_key = read_frame_key(frame_key_file) if frame_key_file is not None else ""
    if frame_key:
        env.append((Env.FRAME_KEY, frame_key))
    spec = ServerSpec(
        model_path=resolve_model(model),
        role=Role(role).launched_as,
        host=host,
        port=port,
        max_total_tokens=max_total_tokens,
        bootstrap_port=bootstrap_port,
        extra_env=tuple(env),
    )
    server = SGLangServer(spec, log)
    agent = None
    if agent_port is not None:
        info = {
            "role": role,
            "url": spec.url,
            "port": port,
            "bootstrap_port": bootstrap_port if role == "prefill" else None,
            "handoff_port": handoff_port,
            "max_total_tokens": max_total_tokens,
            "frame_key": key_fingerprint(frame_key),
        }
        try:
            agent = HostAgent(info, spec.model_path, host, agent_port, transfer_log).start()
        except OSError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt  # one shutdown path for Ctrl-C and SIGTERM

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server.start()
        console.print(f"starting {role} server (log {log}) ...")
        server.wait_healthy(startup_timeout)
        console.print(f"[green]{role} server ready[/green] at {spec.url}", highlight=False)
        while server.alive():
            time.sleep(1.0)
        console.print(f"[red]error:[/red] server exited unexpectedly; see {log}")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        console.print("stopping ...")
    except ServerError as exc:  # a readable message and a non-zero exit, never a traceback
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    finally:
        server.stop()
        if agent is not None:
            agent.stop()


def doctor(
    scenario: str = typer.Argument(
        None, help="A scenario with an inventory: check each of its hosts as a run would."
    ),
    hosts: list[str] = typer.Option(
        None, "--host", help="A host agent's URL (`testbed serve --agent-port`); repeat."
    ),
    model: Path = typer.Option(None, help="With --host: the model the hosts must serve."),
    max_offset_ms: float = typer.Option(50.0, help="With --host: largest clock offset."),
) -> None:
    """Preflight of hosts the testbed did not launch: each reachable, serving the same
    model (weights hash) with the same SGLang, project and torch versions, its clock
    within the bound of this one; for a SCENARIO's inventory also each host's role,
    ports, transfer log and frame key as the scenario needs. Exit 1 naming each host
    that fails."""
    from testbed import doctor as doctor_mod

    if (scenario is None) == (not hosts):
        raise typer.BadParameter("give a SCENARIO with an inventory, or --host URLs")
    if scenario is not None:
        sc = load_scenario(scenario)
        if sc.inventory is None:
            raise typer.BadParameter(f"scenario {sc.name} has no inventory: nothing to check")
        checks = doctor_mod.check_inventory(sc)
    else:
        checks = doctor_mod.run(hosts, resolve_model(model), max_offset_ms / 1000)
    table = Table(title="hosts")
    for col in ("host", "role", "clock offset (ms)", "round trip (ms)", "ok"):
        table.add_column(col)
    for c in checks:
        off = "-" if c.offset_ms is None else f"{c.offset_ms:+.2f}"
        rtt = "-" if c.rtt_ms is None else f"{c.rtt_ms:.2f}"
        table.add_row(c.url, c.role, off, rtt, "yes" if c.ok else "[red]no[/red]")
    console.print(table)
    problems = [p for c in checks for p in c.problems]
    for p in problems:
        console.print(f"[red]error:[/red] {p}", highlight=False)
    if problems:
        raise typer.Exit(1)


def load_scenario(ref: str):
    from testbed.scenario import Scenario, ScenarioError

    try:
        return Scenario.load(ref)
    except ScenarioError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
