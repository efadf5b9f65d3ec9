"""The ``testbed`` command line. Each command is a thin layer over a module."""

from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.table import Table

from testbed import bench_cli
from testbed import model as model_mod
from testbed.bench_cli import SET, with_seeds  # noqa: F401 (with_seeds: tested here)
from testbed.console import console
from testbed.hosts_cli import doctor, key, serve
from testbed.net_cli import net_app
from testbed.run_dirs import new_run_dir
from testbed.server import ServerError
from testbed.workload_cli import load, trace_app

app = typer.Typer(
    help="pdd-testbed: cross-datacenter prefill/decode disaggregation testbed.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(
    help="Build and inspect the tiny models the testbed serves.", no_args_is_help=True
)


@app.callback()
def _every_command() -> None:
    # SIGTERM takes the path Ctrl-C takes (KeyboardInterrupt through the finally
    # blocks): whatever a command started is torn down, its run marked INCOMPLETE.
    signal.signal(signal.SIGTERM, _interrupt)


app.add_typer(model_app, name="model")
app.add_typer(net_app, name="net")
app.add_typer(trace_app, name="trace")
app.command("load")(load)
for command in (key, serve, doctor):  # a multi-host deployment's (testbed.hosts_cli)
    app.command()(command)
for name, command in bench_cli.COMMANDS.items():
    app.command(name)(command)

DEFAULT = model_mod.ModelShape()


@model_app.command("build")
def model_build(
    layers: int = typer.Option(DEFAULT.layers, help="Transformer layers."),
    hidden_size: int = typer.Option(DEFAULT.hidden_size, help="Hidden size."),
    heads: int = typer.Option(DEFAULT.heads, help="Attention heads."),
    kv_heads: int = typer.Option(DEFAULT.kv_heads, help="KV heads (GQA)."),
    head_dim: int = typer.Option(DEFAULT.head_dim, help="Dimension of one head."),
    intermediate_size: int = typer.Option(DEFAULT.intermediate_size, help="MLP width."),
    vocab_size: int = typer.Option(DEFAULT.vocab_size, help="Tokenizer vocabulary size."),
    max_context: int = typer.Option(DEFAULT.max_context, help="Max context (>= 32768)."),
    dtype: str = typer.Option(DEFAULT.dtype, help="float32, bfloat16 or float16."),
    seed: int = typer.Option(DEFAULT.seed, help="Seed for weights and tokenizer corpus."),
    cache_dir: Path = typer.Option(
        None, help="Cache root (default $PDD_CACHE or ~/.cache/pdd-testbed)."
    ),
    force: bool = typer.Option(False, help="Rebuild even if the model exists."),
) -> None:
    """Build a deterministic random-weight Llama and its tokenizer; print its path and KV size."""
    try:
        shape = model_mod.ModelShape(
            layers,
            hidden_size,
            heads,
            kv_heads,
            head_dim,
            intermediate_size,
            vocab_size,
            max_context,
            dtype,
            seed,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    path = model_mod.build(shape, cache_dir, force=force)
    info = model_mod.describe(path)
    console.print(f"model: {path}")
    console.print(f"parameters: {info['parameters']:,}")
    console.print(f"KV bytes per token: {info['kv_bytes_per_token']:,}")


@app.command()
def up(
    scenario: str = typer.Argument(..., help="Scenario file or name in scenarios/."),
    system: str = typer.Option(None, help="System to run (default: the scenario's first)."),
    name: str = typer.Option("default", help="Network name."),
    run_dir: Path = typer.Option(
        None, help="Run directory (default runs/<scenario>-<system>-<time>)."
    ),
    decode_radix_cache: bool = typer.Option(
        None,
        "--decode-radix-cache/--no-decode-radix-cache",
        help="Override the scenario's decode-side prefix cache.",
    ),
    overrides: list[str] = SET,
) -> None:
    """Start the scenario's network, SGLang servers and router; leave them serving."""
    from testbed.deployment import Deployment
    from testbed.net_cli import fail
    from testbed.scenario import Scenario, ScenarioError
    from topologies.netns import NetworkError

    try:
        sc = Scenario.load(scenario, overrides or ())
        if decode_radix_cache is not None:
            servers = sc.servers.model_copy(update={"decode_radix_cache": decode_radix_cache})
            sc = sc.model_copy(update={"servers": servers})
        if sc.inventory is not None:
            raise ValueError(
                "an inventory's servers already serve: run `testbed bench` against them "
                "(`testbed up` launches servers, and `testbed down` ends them by namespace)"
            )
        system = system or sc.systems[0]
        run_dir = run_dir or new_run_dir(Path("runs"), f"{sc.name}-{system}")
        console.print(f"bringing up {system} from scenario {sc.name} (logs in {run_dir}) ...")
        deployment = Deployment(sc, system, run_dir, name).up()
    except (ScenarioError, NetworkError, ServerError, ValueError) as exc:
        raise fail(exc) from exc
    for s in deployment.servers:
        console.print(f"  {s.role:<13} {s.name:<18} site {s.site}  {s.spec.url}", highlight=False)
    console.print(
        f"[green]router[/green] {deployment.router_url}  "
        f"(/generate, /v1/completions, /v1/chat/completions)",
        highlight=False,
    )
    console.print(f"records: {deployment.records_path}; stop with `testbed down --name {name}`")


@app.command()
def down(name: str = typer.Option("default", help="Network name.")) -> None:
    """Stop the router and servers of a deployment and tear its network down."""
    from topologies import registry

    removed = registry.down_by_name(name)
    console.print(f"stopped; removed {len(removed)} namespaces")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # one shutdown path (the finally blocks) for SIGTERM and Ctrl-C


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A bench run directory.")) -> None:
    """Regenerate report.html (and a sweep's pages) from a run directory's records alone."""
    from protocol.records import DamagedFile
    from reports.render import write_reports

    try:
        path = write_reports(run_dir)
    except (FileNotFoundError, DamagedFile) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"report: {path}")


@app.command()
def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Two or more bench run directories."),
    out: Path = typer.Option(Path("compare.html"), help="Where the HTML comparison goes."),
) -> None:
    """Runs side by side: per system and metric, each run's value and its change against
    the first run (printed, and written as HTML)."""
    from reports.compare import compare as compare_runs
    from reports.compare import write_html

    try:
        frame = compare_runs(run_dirs)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    table = Table(title="run comparison (changes relative to the first run)")
    for column in frame.columns:
        table.add_column(str(column), justify="left" if column in ("system", "metric") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(_cell(column, v) for column, v in zip(frame.columns, row, strict=True)))
    console.print(table)
    console.print(f"comparison: {write_html(frame, run_dirs, out)}")


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:+.1%}" if column.startswith("change") else f"{value:.4g}"
    return str(value)


@app.command("wan-replay")
def wan_replay(
    run_dir: Path = typer.Argument(..., help="A bench run directory (or one system's)."),
) -> None:
    """Replay a stored run's WAN transfers through the router's WAN model, offline: the
    prediction error replayed beside the one recorded live, per system."""
    from testbed.bench.wan_replay import replay_run

    try:
        rows = replay_run(run_dir)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    table = Table(title="WAN-time prediction error, |predicted - measured| / measured")
    for column in ("system", "transfers", "replayed P50", "P95", "recorded P50", "P95"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for system, r in rows.items():
        cells = [r[k] for k in ("replayed_p50", "replayed_p95", "recorded_p50", "recorded_p95")]
        shown = (f"{v:.0%}" if v == v else "-" for v in cells)  # NaN: nothing measured
        table.add_row(system, str(int(r["transfers"])), *shown)
    console.print(table)


@app.command()
def reproduce(
    run_dir: Path = typer.Argument(..., help="A stored bench run directory."),
    out: Path = typer.Option(Path("runs"), help="Directory for the new run."),
    tolerance: float = typer.Option(0.25, min=0, help="Relative change still reproduced."),
    allow_version_drift: bool = typer.Option(
        False, help="Run even if the software differs from the stored run's manifest."
    ),
) -> None:
    """Run a stored bench again (same scenario, seeds and trace; versions checked) and
    print, figure by figure, stored vs reproduced with a verdict. Exit 1 if any figure
    is not reproduced."""
    from testbed.bench.reproduce import NotReproducible
    from testbed.bench.reproduce import reproduce as run_again
    from testbed.bench.reproduce import table as verdict_table
    from testbed.net_cli import fail
    from topologies.netns import NetworkError

    try:
        new_dir, rows = run_again(run_dir, out, console, tolerance, allow_version_drift)
    except (FileNotFoundError, NotReproducible, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    except (NetworkError, ServerError, RuntimeError) as exc:
        raise fail(exc) from exc
    console.print(verdict_table(rows, tolerance))
    missed = [r for r in rows if not r["reproduced_ok"]]
    console.print(f"reproduction: {new_dir}; {len(rows) - len(missed)}/{len(rows)} reproduced")
    if missed:
        raise typer.Exit(1)


@app.command()
def plan(
    scenario: str = typer.Argument("hetero", help="Scenario file or name in scenarios/."),
    rps: float = typer.Option(None, help="Target load (default: the scenario's plan.target_rps)."),
    sensitivity: bool = typer.Option(
        False, help="Also how the BCR gains move with GPU-B's price and bandwidth and the hit."
    ),
    overrides: list[str] = SET,
) -> None:
    """Size each design for the scenario's trace under its SLA; print the BCR table."""
    import tempfile

    from testbed import planning
    from testbed.net_cli import fail
    from testbed.scenario import Scenario, ScenarioError
    from workloads.trace import Trace

    try:
        sc = Scenario.load(scenario, overrides or ())
        if rps is not None:
            sc = sc.model_copy(update={"plan": sc.plan.model_copy(update={"target_rps": rps})})
        with tempfile.TemporaryDirectory() as tmp:
            trace = Trace.load(sc.workload.materialize(Path(tmp)))
        rows = planning.plan_rows(sc, trace)
        tables = planning.sensitivity(sc, trace) if sensitivity else {}
    except (ScenarioError, ValueError) as exc:
        raise fail(exc) from exc
    console.print(planning.table(rows, sc))
    for title, table in tables.items():
        console.print(planning.rows_table(table, f"sensitivity: {title.replace('_', ' ')}"))


if __name__ == "__main__":
    app()
