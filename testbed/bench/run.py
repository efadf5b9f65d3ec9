"""``make bench``: every system of a scenario on the same network and the same trace.

Per system: deployment up → link fidelity check → two warm-up requests (recorded
apart) → Locust replays the trace from the client host → deployment down; then the
records go to parquet and the report is built from the run directory alone
(``testbed report RUN_DIR`` does the same later).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from protocol import headers
from protocol.names import HandoffMode, Pipeline
from protocol.records import write_atomic
from reports.render import write_report, write_sweep_report
from reports.run_data import write_parquet
from reports.tables import goodput_bcr, latency
from testbed import dilation, planning
from testbed.bench import calibrate
from testbed.bench.load import Load
from testbed.bench.progress import LoadProgress
from testbed.bench.records_wait import wait_for_records
from testbed.deployment import Deployment
from testbed.model import describe as describe_model
from testbed.run_dirs import dropped_if_left_empty, new_run_dir
from testbed.scenario import Scenario
from topologies.check import check_network
from topologies.schedule import WanSchedule
from workloads.client import generate_payload
from workloads.trace import Trace

NET_NAME = "bench"


def system_cost(deployment: Deployment, scenario: Scenario) -> dict:
    """Each server counts as one accelerator of its site's type (emulation: as many as
    it stands for); one WAN line if the servers span two sites."""
    types = scenario.cost.site_accelerators
    chips = scenario.emulation.chips_per_server if scenario.emulation else 1
    counts = Counter()
    for s in deployment.servers:
        counts[types.get(s.site, f"site-{s.site}")] += chips
    sites = {s.site for s in deployment.servers}
    return {"accelerators": dict(counts), "wan_lines": 1 if len(sites) > 1 else 0}


COMPLETE = "COMPLETE"  # written last in a system's directory: reports read only these
INCOMPLETE = "INCOMPLETE"  # its run failed or was cut short: why


class DeploymentDied(RuntimeError):
    """A server, the router or a link emulator died during the load, or the WAN could
    not be made what the scenario says."""


def run_system(
    scenario: Scenario,
    system: str,
    trace: Path,
    run_dir: Path,
    console: Console,
    ui_port: int | None = None,
    on_tick: Callable[[Deployment], None] | None = None,
) -> None:
    """One system's run in ``run_dir/system``; ``on_tick(deployment)`` is called about
    once a second during the load (the soak samples memory there)."""
    out = run_dir / system
    try:
        _run_system(scenario, system, trace, out, console, ui_port, on_tick)
    except BaseException as exc:  # failed or interrupted: never passed off as complete
        out.mkdir(parents=True, exist_ok=True)
        (out / INCOMPLETE).write_text(f"{type(exc).__name__}: {exc}\n")
        raise


def _run_system(
    scenario: Scenario,
    system: str,
    trace: Path,
    out: Path,
    console: Console,
    ui_port: int | None = None,
    on_tick: Callable[[Deployment], None] | None = None,
) -> None:
    deployment = Deployment(scenario, system, out, NET_NAME)
    try:
        bring_up(deployment, scenario, out, console)
        t0 = time.monotonic()
        total = _requests_in(trace, scenario.workload.max_requests)
        events = deployment.scenario.network.wan_schedule
        schedule = WanSchedule(deployment.net, events, out / "wan_schedule.jsonl")
        load = Load(deployment.net, deployment.router_url, trace, scenario.workload, out, ui_port)
        deployment.mark_cpu()  # cpu.json: each process's share during the load too
        load.start()
        if load.ui_url:
            console.print(f"{system}: Locust's web UI at {load.ui_url} (PDD tab included)")
        schedule.start()
        try:
            with LoadProgress(console, system, load.records, total) as progress:
                while load.poll() is None:
                    if problems := deployment.problems() + schedule.errors:
                        raise DeploymentDied(f"{system}: " + "; ".join(problems))
                    progress.update()
                    if on_tick is not None:
                        on_tick(deployment)
                    time.sleep(1.0)
        finally:
            schedule.stop()
            load.stop()
        if schedule.errors:  # the WAN was not what the schedule said: no result
            raise DeploymentDied(f"{system}: WAN schedule: " + "; ".join(schedule.errors))
        if load.returncode not in (0, 1):  # Locust exits 1 when some requests failed
            raise RuntimeError(
                f"{system}: Locust exited with {load.returncode}; see {out}/locust.log"
            )
        load.finish()  # the workers' records, merged
        if pending := wait_for_records(deployment.router_url):
            console.print(f"[yellow]{system}: {pending} record(s) still wait for P[/yellow]")
        if problems := deployment.problems():
            raise DeploymentDied(f"{system}: " + "; ".join(problems))
    finally:
        deployment.down()
    write_parquet(out)
    write_atomic(out / COMPLETE, f"{_lines(out / 'client.jsonl')} requests\n")
    console.print(
        f"{system}: {_lines(out / 'client.jsonl')} requests in {time.monotonic() - t0:.0f} s"
    )


def bring_up(deployment: Deployment, scenario: Scenario, out: Path, console: Console) -> None:
    """A system ready for its load: deployment up, its links checked
    (``link_check.json``), its cost (``cost.json``), the warm-up requests sent."""
    system = deployment.system.name
    with console.status(f"[bold]{system}[/bold]: bringing up the network, servers and router"):
        deployment.up()
    check = []  # an inventory's WAN is real: `testbed net check` is for emulated links
    if deployment.net.emulated:
        with console.status(f"[bold]{system}[/bold]: checking the links"):
            check = [
                m.as_row() for m in check_network(deployment.net, seconds=scenario.network.check_s)
            ]
    write_atomic(out / "link_check.json", json.dumps(check, indent=2))
    bad = [m for m in check if not m["ok"]]
    if bad:
        console.print(
            f"[yellow]{system}: {len(bad)} link measurement(s) out of tolerance "
            f"(see the report)[/yellow]"
        )
    write_atomic(out / "cost.json", json.dumps(system_cost(deployment, scenario)))
    with console.status(f"[bold]{system}[/bold]: warm-up requests"):
        warm_up(deployment, scenario, out)


def warm_up(deployment: Deployment, scenario: Scenario, out: Path) -> None:
    """Two requests before the load, the second with a pinned handoff (other systems
    ignore the headers), so SGLang's first forward of each shape is not in the
    measured tail. Their records are kept apart, in warmup-records.jsonl."""
    rng = random.Random(0)
    pin = {
        headers.PIPELINE: Pipeline.P_RLD_MD,
        headers.HANDOFF_AT: "9",
        headers.HANDOFF_MODE: HandoffMode.ONE_SHOT,
    }
    for i, pins in enumerate(({}, pin)):
        prompt = [rng.randrange(10, scenario.workload.vocab_size) for _ in range(256)]
        r = httpx.post(
            f"{deployment.router_url}/generate",
            json=generate_payload(prompt, 16, False),
            headers={headers.SESSION: f"warmup-{i}", **pins},
            timeout=300,
        )
        if r.status_code != 200:
            raise RuntimeError(f"{deployment.system.name}: warm-up failed: {r.text[:300]}")
    wait_for_records(deployment.router_url)  # a late one would count as the load's
    if deployment.records_path.exists():
        deployment.records_path.rename(out / "warmup-records.jsonl")


def _requests_in(trace: Path, max_requests: int) -> int | None:
    """The load's total: the trace's requests (at most ``max_requests``)."""
    try:
        n = sum(1 for _ in Trace.load(trace).requests)
    except (OSError, ValueError):
        return None
    return min(n, max_requests) if max_requests else n


def _lines(path: Path) -> int:
    try:
        return sum(1 for _ in open(path))
    except FileNotFoundError:
        return 0


def run_bench(
    scenario: Scenario,
    out: Path,
    console: Console,
    systems: list[str] | None = None,
    ui_port: int | None = None,
) -> Path:
    """One run directory; a sweep scenario gets one sub-directory per point, each a
    complete run of its own, and a sweep report over them all."""
    run_dir = new_run_dir(out, f"bench-{scenario.name}")
    systems = systems or scenario.systems
    console.print(f"bench {scenario.name}: systems {', '.join(systems)}; run directory {run_dir}")
    points = scenario.points()
    with dropped_if_left_empty(run_dir):
        if scenario.sweep:
            sweep = {"sweep": scenario.sweep, "points": [label for label, _ in points]}
            write_atomic(run_dir / "sweep.json", json.dumps(sweep, indent=2))
            write_atomic(run_dir / "scenario.json", scenario.model_dump_json(indent=2))
        for i, (label, point) in enumerate(points):
            if label:
                console.rule(f"sweep point {i + 1}/{len(points)}: {label}")
            run_point(point, run_dir / label if label else run_dir, systems, console, ui_port)
    if scenario.sweep:
        console.print(f"sweep report: {write_sweep_report(run_dir)}")
    return run_dir


def run_point(
    scenario: Scenario,
    run_dir: Path,
    systems: list[str],
    console: Console,
    ui_port: int | None = None,
) -> None:
    """Every system on one scenario (one sweep point) and the same trace."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tiny_kv = describe_model(scenario.model.resolve())["kv_bytes_per_token"]
    calibration = None
    if scenario.emulation is not None and scenario.emulation.calibrate:
        calibration = calibrate.calibrate(scenario, tiny_kv, run_dir, console, run_system)
        scenario = calibrate.with_dilation(scenario, calibration["dilation"])
    target = scenario
    emulated = dilation.record(scenario, tiny_kv)
    if calibration is not None:
        emulated["calibration"] = calibration
    if emulated:
        write_atomic(run_dir / "emulation.json", json.dumps(emulated, indent=2))
        (run_dir / "scenario-target.json").write_text(scenario.model_dump_json(indent=2))
        scenario = dilation.for_testbed(scenario, tiny_kv)
        console.print(
            f"emulation: {emulated['model']} on {emulated['site_devices']}, "
            f"{emulated['chips_per_server']} chips per server; time dilation "
            f"x{emulated['dilation']:g}; WAN rate x{emulated['kv_scale']:.3f} for KV size"
        )
    trace = scenario.workload.materialize(run_dir)  # the same trace for every system
    planning.write_tables(target, trace, run_dir)  # the planner's and bathtub's tables
    data = scenario.model_dump(mode="json")
    data["systems"] = systems
    write_atomic(run_dir / "scenario.json", json.dumps(data, indent=2))
    for system in systems:
        run_system(scenario, system, trace, run_dir, console, ui_port)
    report = write_report(run_dir)
    console.print(summary(run_dir))
    console.print(targets_table(run_dir))
    console.print(f"report: {report}")


def summary(run_dir: Path) -> Table:
    from reports.run_data import load_run

    run = load_run(run_dir)
    lat, good = latency(run), goodput_bcr(run)
    table = Table(title="summary (measured; TTFT in s, goodput in SLA-met req/s)")
    for col in ("system", "req", "err", "P50", "P90", "P99", "goodput", "cost/h", "BCR"):
        table.add_column(col, justify="right", no_wrap=True)
    for (_, a), (_, b) in zip(lat.iterrows(), good.iterrows(), strict=True):
        ttfts = (f"{a[f'ttft_p{p}_s']:.2f}" for p in (50, 90, 99))
        table.add_row(
            a["system"],
            str(a["requests"]),
            str(a["errors"]),
            *ttfts,
            f"{b['sla_goodput_rps']:.2f}",
            f"{b['cost_per_hour']:.2f}",
            f"{b['bcr']:.3f}",
        )
    return table


def targets_table(run_dir: Path) -> Table:
    from reports.run_data import load_run
    from reports.targets import targets

    table = Table(title="PDD under load: targets as ratios in this run")
    for col in ("target", "holds", "measured"):
        table.add_column(col)
    for _, r in targets(load_run(run_dir)).iterrows():
        holds = {True: "[green]yes[/green]", False: "[red]no[/red]"}.get(r["holds"], "–")
        table.add_row(escape(r["target"]), holds, escape(r["measured"]))
    return table
