"""``testbed trace stats|generate`` and ``testbed load``: traces and the Locust replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from testbed.console import console
from testbed.run_dirs import new_run_dir

trace_app = typer.Typer(help="Inspect and generate request traces.", no_args_is_help=True)
LOCUSTFILE = Path(__file__).resolve().parent.parent / "workloads" / "locustfile.py"


@trace_app.command("stats")
def trace_stats(
    path: Path = typer.Argument(
        ..., help="Trace file (pdd JSONL/parquet, mooncake, azure, tracelab)."
    ),
    fmt: str = typer.Option("auto", "--format", help="Trace format, or auto."),
    cache_blocks: int = typer.Option(
        None, min=1, help="Also analyse an LRU cache of this many blocks."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Hit ratios (infinite and LRU cache), the seven hit bins, length percentiles."""
    from workloads.analysis import HIT_BINS, stats
    from workloads.readers import read_trace

    try:
        trace = read_trace(path, fmt)
    except (OSError, ValueError, KeyError) as exc:
        console.print(f"[red]error:[/red] cannot read {path}: {exc}", highlight=False)
        raise typer.Exit(2) from exc
    results = [stats(trace)] + ([stats(trace, cache_blocks)] if cache_blocks else [])
    if as_json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
        return
    for s in results:
        cache = (
            "infinite cache" if s.capacity_blocks is None else f"LRU of {s.capacity_blocks} blocks"
        )
        table = Table(title=f"{trace.name}: {s.requests} requests, {s.sessions} sessions ({cache})")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        table.add_row("mean hit ratio", f"{s.hit_mean:.1%}")
        table.add_row("token-weighted hit ratio", f"{s.hit_token_weighted:.1%}")
        table.add_row("requests above 95% hit", f"{s.share_above_95:.1%}")
        table.add_row("requests with no hit", f"{s.share_no_hit:.1%}")
        table.add_row("anomalous (long in, short out)", f"{s.anomalous_share:.1%}")
        for b in HIT_BINS:
            table.add_row(f"hit bin {b}%", f"{s.bins[b]:.1%}")
        for k, v in s.input_percentiles.items():
            table.add_row(f"input tokens {k}", f"{v:,.0f}")
        for k, v in s.output_percentiles.items():
            table.add_row(f"output tokens {k}", f"{v:,.0f}")
        console.print(table)


@trace_app.command("generate")
def trace_generate(
    out: Path = typer.Argument(..., help="Output file (.jsonl or .parquet)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same trace)."),
    sessions: int = typer.Option(40, help="Number of agentic sessions."),
    length_scale: float = typer.Option(1.0, help="Scale every token length by this."),
    time_scale: float = typer.Option(1.0, help="Scale think times and session gaps by this."),
) -> None:
    """Generate agentic multi-turn sessions with PDD's hit-ratio skew."""
    from workloads.generator import AgenticConfig, generate

    trace = generate(
        AgenticConfig(
            seed=seed, sessions=sessions, length_scale=length_scale, time_scale=time_scale
        ),
        name=out.stem,
    )
    trace.save(out)
    console.print(
        f"wrote {len(trace.requests)} requests in {len(trace.sessions())} sessions to {out}"
    )


def locust_argv(router_url: str, trace: Path, workload, out_dir: Path) -> list[str]:
    """Headless Locust replaying ``trace`` against the router; CSV, HTML and records in out_dir."""
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(workload.users),
        "-r",
        str(workload.users),
        "-t",
        f"{int(workload.duration_s)}s",
        "--host",
        router_url,
        "--trace",
        str(trace),
        "--mode",
        workload.mode,
        "--speedup",
        str(workload.speedup),
        "--arrival",
        workload.arrival,
        "--rate",
        str(workload.rate_rps),
        "--vocab-size",
        str(workload.vocab_size),
        "--max-requests",
        str(workload.max_requests),
        "--request-timeout",
        f"{workload.request_timeout_s:g}",
        "--records",
        str(out_dir / "client.jsonl"),
        "--csv",
        str(out_dir / "locust"),
        "--html",
        str(out_dir / "locust.html"),
        "--only-summary",
        "--stop-timeout",
        f"{workload.stop_timeout_s:g}",
    ]


def load(
    scenario: str = typer.Argument(..., help="Scenario file or name (its deployment must be up)."),
    name: str = typer.Option("default", help="Network name of the running deployment."),
    out: Path = typer.Option(None, help="Output directory (default runs/load-<time>)."),
    overrides: list[str] = typer.Option(
        None, "--set", help="Override a scenario field: dotted.field=value (YAML); repeatable."
    ),
    workers: int = typer.Option(
        None, min=0, max=16, help="Locust workers (default: the scenario's workload.workers)."
    ),
) -> None:
    """Replay the scenario's workload with Locust from the client host against the router."""
    from testbed.net_cli import fail
    from testbed.scenario import Scenario, ScenarioError
    from topologies.netns import NetworkError
    from topologies.network import Network

    try:
        sc = Scenario.load(scenario, overrides or ())
        net = Network(sc.network, name).attach()
        out = out or new_run_dir(Path("runs"), "load")
        out.mkdir(parents=True, exist_ok=True)
        trace = sc.workload.materialize(out)
        router = f"http://{net.address(net.hosts_with_role('router')[0])}:{sc.servers.router_port}"
        client = net.hosts_with_role("client")[0]
    except (ScenarioError, NetworkError, ValueError) as exc:
        raise fail(exc) from exc
    from testbed.bench.load import Load

    workload = sc.workload
    if workers is not None:
        workload = workload.model_copy(update={"workers": workers})
    how = f"{workload.workers} Locust workers" if workload.workers else "Locust"
    console.print(f"{how} on {client} → {router}, trace {trace} ({workload.mode} loop)")
    load = Load(net, router, trace, workload, out).start()
    try:
        code = load.procs[0].wait()
    except KeyboardInterrupt:
        code = 130
    finally:
        requests = load.finish()
    console.print(f"{requests} requests; Locust CSVs, HTML and client records in {out}")
    raise typer.Exit(code)
