"""``testbed bench`` and its siblings: every command that runs systems on a scenario
and writes a run directory (registered on the main app in :mod:`testbed.cli`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import typer

from testbed.console import console
from testbed.server import ServerError

SET = typer.Option(
    None, "--set", help="Override a scenario field: dotted.field=value (YAML); repeatable."
)
OUT = typer.Option(Path("runs"), help="Directory for run directories.")


def interrupted(more: str = "") -> typer.Exit:
    """Ctrl-C or SIGTERM ended a run: say what was cleaned up; exit status 130."""
    console.print(
        "[red]interrupted:[/red] the running system's servers, router and network were "
        f"torn down; its directory is marked INCOMPLETE and reports leave it out {more}"
    )
    return typer.Exit(130)


@contextmanager
def running(more: str = ""):
    """A run's failure as the command's exit: a readable message and status 1 (a bad
    scenario, a network or server that would not come up); Ctrl-C or SIGTERM: 130.
    Exits the command decides on itself belong outside the block (``typer.Exit`` is a
    ``RuntimeError``)."""
    from testbed.net_cli import fail
    from testbed.scenario import ScenarioError
    from topologies.netns import NetworkError

    try:
        yield
    except (ScenarioError, NetworkError, ServerError, RuntimeError, ValueError) as exc:
        raise fail(exc) from exc
    except KeyboardInterrupt:
        raise interrupted(more) from None


def _scenario(scenario: str, overrides: list[str] | None):
    from testbed.scenario import Scenario

    return Scenario.load(scenario, overrides or ())


def bench(
    scenario: str = typer.Argument("default", help="Scenario file or name in scenarios/."),
    system: list[str] = typer.Option(None, help="Run only these systems (repeatable)."),
    out: Path = OUT,
    overrides: list[str] = SET,
    seeds: int = typer.Option(
        1, min=1, help="Repeat with this many workload seeds; 95% intervals in sweep.html."
    ),
    locust_ui: int = typer.Option(
        None, min=1, max=65535, help="Run the load with Locust's web UI on this port."
    ),
) -> None:
    """Every system of the scenario on the same network and trace; HTML report at the end."""
    from testbed.bench.run import run_bench

    with running("(testbed report RUN_DIR builds a report from the systems that finished)"):
        sc = _scenario(scenario, overrides)
        sc = with_seeds(sc, seeds) if seeds > 1 else sc
        run_bench(sc, out, console, system or None, locust_ui)


def with_seeds(sc, seeds: int):
    """The scenario as a sweep over ``seeds`` workload seeds (from its own seed on)."""
    from reports.render import SEED_FIELD
    from testbed.scenario import ScenarioError

    if sc.sweep:
        raise ScenarioError("--seeds repeats a single scenario; this one is a sweep already")
    if sc.workload.trace is not None:
        raise ScenarioError("--seeds needs a generated workload (a trace file has no seed)")
    base = int(sc.workload.generator.get("seed", 0))
    workload = sc.workload.model_copy(update={"generator": {**sc.workload.generator, "seed": base}})
    sweep = {SEED_FIELD: list(range(base, base + seeds))}
    return sc.model_copy(update={"workload": workload, "sweep": sweep})


def bench_transfer(
    out: Path = typer.Option(Path("runs"), help="Directory for the run's files."),
    rate_mbit: float = typer.Option(100.0, help="WAN rate for the goodput sweep."),
) -> None:
    """KV goodput vs the emulated WAN rate (1-64 MB) and the baselines' TTFT side by side."""
    from testbed.bench import transfer

    with running():
        transfer.run(out, rate_mbit, console)


def bench_handoff(
    scenario: str = typer.Argument("handoff", help="Scenario file or name (needs system pdd)."),
    trials: int = typer.Option(30, min=1, help="Trials per path."),
    tokens: int = typer.Option(100, min=1, help="Tokens handed off per trial."),
    prompt_tokens: int = typer.Option(64, min=1, help="Prompt length of each trial."),
    out: Path = OUT,
    overrides: list[str] = SET,
) -> None:
    """A TOKENS-token handoff over the scenario's WAN: KV shipped vs token ids + recompute."""
    from testbed.bench import handoff

    with running():
        handoff.run(_scenario(scenario, overrides), out, console, trials, tokens, prompt_tokens)


def bench_peers(
    scenario: str = typer.Argument("default", help="Scenario file or name (undilated)."),
    system: list[str] = typer.Option(None, help="Only these systems (repeatable)."),
    prompts_per_group: int = typer.Option(8, min=1, help="Prompts behind each system prompt."),
    groups: int = typer.Option(4, min=1, help="System prompts (shared prefixes)."),
    rate: float = typer.Option(1.0, min=0.01, help="Requests per second (Poisson)."),
    out: Path = OUT,
    overrides: list[str] = SET,
) -> None:
    """SGLang's bench_serving, unchanged, against same_site_pd, cross_site_pd and pdd on
    one network: TTFT and inter-token latency as its client measures them, side by side."""
    from testbed.bench import peers

    load = peers.PeerLoad(groups=groups, per_group=prompts_per_group, rate=rate)
    with running():
        peers.run_peers(_scenario(scenario, overrides), out, console, load, system or None)


def bench_faults(
    scenario: str = typer.Argument("faults", help="Scenario file or name in scenarios/."),
    streams: int = typer.Option(3, min=1, help="Concurrent greedy streams during each fault."),
    out: Path = OUT,
    overrides: list[str] = SET,
) -> None:
    """The fault matrix: WAN cut, loss burst, rate dip, kill -9 of each server, aborted
    upstream connections, on every system of the scenario; exit 1 if a target is missed."""
    from testbed.bench import faults

    with running():
        sc = _scenario(scenario, overrides)
        rows = faults.run(sc, out, console, faults.FaultsConfig(streams=streams))
    if not all(r["meets_targets"] for r in rows):
        raise typer.Exit(1)


def soak(
    scenario: str = typer.Argument("soak", help="Scenario file or name in scenarios/."),
    warmup: float = typer.Option(300.0, help="Seconds before memory growth is counted."),
    out: Path = OUT,
    overrides: list[str] = SET,
) -> None:
    """A long run on a lossy WAN: failed requests and every process's RSS growth after
    warm-up (targets: none failed, growth ≤ 5%); exit 1 if a target is missed."""
    from testbed.bench import soak as soak_mod

    with running():
        result = soak_mod.run(_scenario(scenario, overrides), out, console, warmup)
    if not all(r["meets_targets"] for r in result["systems"].values()):
        raise typer.Exit(1)


COMMANDS = {  # command name → function
    "bench": bench,
    "bench-transfer": bench_transfer,
    "bench-handoff": bench_handoff,
    "bench-peers": bench_peers,
    "bench-faults": bench_faults,
    "soak": soak,
}
