"""``testbed net up|down|check|status``: the emulated network on its own."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from testbed.console import console
from testbed.run_dirs import new_run_dir
from testbed.scenario import Scenario, ScenarioError
from topologies import registry
from topologies.emulation import EmulationError
from topologies.netns import NetworkError
from topologies.network import Network

net_app = typer.Typer(
    help="Bring a scenario's emulated network up, down, or measure it.", no_args_is_help=True
)

NAME = typer.Option("default", "--name", help="Network name (namespaces pddtb-NAME-*).")
SET = typer.Option(
    None, "--set", help="Override a scenario field: dotted.field=value (YAML); repeatable."
)


def _load(scenario: str, overrides: list[str] | None = None) -> Scenario:
    try:
        return Scenario.load(scenario, overrides or ())
    except ScenarioError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc


def fail(exc: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(1)


def hosts_table(net: Network) -> Table:
    table = Table(title=f"network {net.name!r} ({net.spec.topology})")
    for col in ("host", "role", "site", "address"):
        table.add_column(col)
    for host in net.hosts:
        table.add_row(host, net.role(host), net.site(host), net.address(host))
    return table


def links_table(net: Network) -> Table:
    table = Table(title=f"emulated links (backend: {net.backend_name or 'none needed'})")
    for col in ("link", "parameter", "value", "applied by"):
        table.add_column(col)
    for link in net.applied:
        for param, mechanism in link.mechanisms.items():
            table.add_row(link.name, param, str(link.spec[param]), mechanism)
    return table


@net_app.command("up")
def net_up(
    scenario: str = typer.Argument(..., help="Scenario file or name in scenarios/."),
    name: str = NAME,
    overrides: list[str] = SET,
) -> None:
    """Create the scenario's namespaces, bridges and links; leave them up."""
    sc = _load(scenario, overrides)
    try:
        net = Network(sc.network, name).up()
    except (NetworkError, EmulationError, ValueError) as exc:
        raise fail(exc) from exc
    console.print(hosts_table(net))
    console.print(links_table(net))
    console.print(
        f"up; this host reaches site A as {net.harness_address}. "
        f"`testbed net down --name {name}` removes everything."
    )


@net_app.command("down")
def net_down(
    name: str = NAME,
    all_: bool = typer.Option(False, "--all", help="Every testbed network on this host."),
) -> None:
    """Kill every process in the network's namespaces and delete them (works after a crash)."""
    names = registry.names_up() if all_ else [name]
    for n in names:
        removed = registry.down_by_name(n)
        console.print(f"network {n!r}: removed {len(removed)} namespaces")


@net_app.command("shape")
def net_shape(
    spec: str = typer.Argument(
        ..., help="The link, as YAML: '{rate_mbit: 100, delay_ms: 10, loss_pct: 0.1}'."
    ),
    dev: str = typer.Option(..., "--dev", help="The interface to shape (a gateway's WAN side)."),
    netns: str = typer.Option(None, help="The interface's network namespace (default: host)."),
    backend: str = typer.Option("auto", help="Emulation backend: auto, netem, userspace."),
) -> None:
    """Shape a real interface like one end of the emulated WAN (its egress rate and delay,
    its ingress loss); shape both gateways for both directions. Refuses what it cannot
    apply."""
    import yaml
    from pydantic import ValidationError

    from topologies.emulation.base import EmulationError
    from topologies.link import LinkSpec
    from topologies.netns import NetworkError
    from topologies.shape import shape

    try:
        data = yaml.safe_load(spec)
        if not isinstance(data, dict):
            raise ValueError(f"SPEC must be a YAML mapping, got {spec!r}")
        applied = shape(dev, LinkSpec(**data), netns, backend)
    except (ValueError, ValidationError, yaml.YAMLError, EmulationError, NetworkError) as exc:
        raise fail(exc) from exc
    for parameter, how in applied.mechanisms.items():
        console.print(f"{dev}: {parameter} by {how}", highlight=False)


@net_app.command("unshape")
def net_unshape(
    dev: str = typer.Option(..., "--dev", help="The interface shaped with `net shape`."),
    netns: str = typer.Option(None, help="The interface's network namespace (default: host)."),
) -> None:
    """Remove everything `net shape` applied to the interface."""
    from topologies.netns import NetworkError
    from topologies.shape import unshape

    try:
        removed = unshape(dev, netns)
    except NetworkError as exc:
        raise fail(exc) from exc
    console.print(f"{dev}: removed {', '.join(removed)}", highlight=False)


@net_app.command("status")
def net_status() -> None:
    """List the testbed networks that are up."""
    names = registry.names_up()
    console.print("\n".join(names) if names else "no testbed network is up")


@net_app.command("check")
def net_check(
    scenario: str = typer.Argument(..., help="Scenario file or name in scenarios/."),
    name: str = NAME,
    seconds: float = typer.Option(8.0, help="Seconds per iperf3 measurement."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    overrides: list[str] = SET,
) -> None:
    """Measure each link (iperf3, ping) against its spec; exit 1 if any is out of tolerance."""
    from topologies.check import check_network

    sc = _load(scenario, overrides)
    net = Network(sc.network, name)
    try:
        ours = name not in registry.names_up()
        net.up() if ours else net.attach()
        try:
            rows = check_network(net, seconds)
        finally:
            if ours:
                net.down()
    except (NetworkError, EmulationError, RuntimeError, ValueError) as exc:
        raise fail(exc) from exc
    if as_json:
        print(json.dumps([r.as_row() for r in rows], indent=2))
    else:
        console.print(check_table(rows, net.backend_name))
    if not all(r.ok for r in rows):
        console.print("[red]out of tolerance[/red]")
        raise typer.Exit(1)


def check_table(rows, backend: str | None) -> Table:
    table = Table(title=f"link check, configured vs measured (backend: {backend or 'none'})")
    for col in ("link", "quantity", "configured", "measured", "tolerance", "ok"):
        table.add_column(col)
    for r in rows:
        configured = "-" if r.configured is None else f"{r.configured:.3f}"
        table.add_row(
            r.link,
            r.quantity,
            configured,
            f"{r.measured:.3f}",
            r.tolerance,
            "[green]yes[/green]" if r.ok else "[red]NO[/red]",
        )
    return table


@net_app.command("bench")
def net_bench(
    out: Path = typer.Option(Path("runs"), help="Directory for the CSV."),
    seconds: float = typer.Option(4.0, help="Seconds per iperf3 measurement."),
    quick: bool = typer.Option(False, help="One rate, one delay, two losses (a smoke run)."),
) -> None:
    """Fidelity table over WAN rates x delays x losses, with the emulation's CPU cost."""
    from topologies import fidelity

    grid = (
        ((100,), (10,), (0.0, 1.0))
        if quick
        else (fidelity.RATES_MBIT, fidelity.DELAYS_MS, fidelity.LOSSES_PCT)
    )
    path = new_run_dir(out, "bench-net") / "fidelity.csv"

    def show(row):
        mark = "ok" if row["ok"] else "OUT"
        console.print(
            f"{row['rate_mbit']:>4} Mbit {row['delay_ms']:>3} ms {row['loss_pct']:>4}% "
            f"{row['quantity']:<18} configured {row['configured']!s:<8} "
            f"measured {row['measured']:.3f} {mark}  "
            f"(delayd CPU {row['emulation_cpu_core_share']:.0%} of a core)",
            highlight=False,
        )

    try:
        rows = fidelity.sweep(*grid, seconds=seconds, on_row=show)
    except (NetworkError, EmulationError, RuntimeError) as exc:
        raise fail(exc) from exc
    fidelity.write_csv(rows, path)
    console.print(check_table([_Row(r) for r in rows], rows[0]["backend"]))
    bad = sum(not r["ok"] for r in rows)
    console.print(f"{len(rows) - bad}/{len(rows)} within tolerance; CSV: {path}")


class _Row:
    """A CSV row seen as a check Measurement, labelled with its WAN setting."""

    def __init__(self, row: dict) -> None:
        self.link = f"{row['rate_mbit']}M/{row['delay_ms']}ms/{row['loss_pct']}%"
        self.quantity, self.configured = row["quantity"], row["configured"]
        self.measured, self.tolerance, self.ok = row["measured"], row["tolerance"], row["ok"]
