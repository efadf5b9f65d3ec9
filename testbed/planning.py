"""The capacity planner and the bathtub model for a scenario: their inputs from the
scenario and its trace, their tables for ``testbed plan``, and the files a bench run
keeps (``plan.json``, ``bathtub.json``) so that reports render them without
re-running a model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from capacity import plan as planner
from capacity.bathtub import HIT_PRICE, HITS, bathtub
from capacity.profiles import devices, models
from workloads.analysis import arrival_order, hit_ratios
from workloads.trace import Trace

PLAN_FILE, BATHTUB_FILE = "plan.json", "bathtub.json"


def inputs(scenario, trace: Trace) -> planner.Inputs:
    """The planner's inputs from a scenario (in target time) and its trace."""
    ordered, hits = arrival_order(trace), hit_ratios(trace)
    up = 1 / trace.metadata.get("length_scale", 1.0)  # back to the trace's full size
    requests = tuple(
        planner.Req(
            round(r.input_length * up),
            round(h * r.input_length * up),
            round(r.output_length * up),
            r.anomalous,
        )
        for r, h in zip(ordered, hits, strict=True)
    )
    prices = scenario.cost.table.accelerators
    site_devices = {}
    for site, name in scenario.cost.site_accelerators.items():
        if name not in devices():
            raise ValueError(f"plan: no device profile {name!r} in profiles/devices.yaml")
        p = devices()[name]
        site_devices[site] = planner.Device(name, p.chip(), p.memory_gb, prices[name])
    if not {"A", "B"} <= set(site_devices):
        raise ValueError("plan: cost.site_accelerators must name the chips of sites A and B")
    model = scenario.emulation.model if scenario.emulation else planner.DEFAULT_MODEL
    return planner.Inputs(
        requests=requests,
        model=models()[model].target(),
        devices=site_devices,
        ttft_s=scenario.sla.ttft_s,
        itl_s=scenario.sla.itl_s,
        attainment=scenario.sla.attainment,
        spec=scenario.plan,
        rtt_s=2 * scenario.network.wan.delay_ms / 1000,
        direct_wan_bound_s=scenario.pdd.direct_wan_bound_s,
    )


def plan_rows(scenario, trace: Trace) -> list[dict]:
    """One row per design, with its pools in one column (``P 2x16 GPU-A, ...``)."""
    rows = planner.rows(planner.plan_all(inputs(scenario, trace)), scenario.plan.target_rps)
    for row in rows:
        row["pools"] = ", ".join(
            f"{role.short} {row[role.value]}" for role in planner.POOL_ROLES if row[role.value]
        )
    return rows


def bathtub_rows(scenario, trace: Trace) -> list[dict]:
    """The modelled bathtub on the scenario's profiles for one request shape (input,
    output tokens at full size): the trace's own for a fixed-hit trace, else PDD.md's
    64K input and 256 output tokens. Throughput and benefit per cost are relative to
    no hit."""
    x = inputs(scenario, trace)
    shape = (65536, 256)
    if trace.metadata.get("generator") == "fixed_hit":
        first = max(x.requests, key=lambda r: r.n_in)
        shape = (first.n_in, int(np.mean([r.n_out for r in x.requests])))
    rows = bathtub(x, *shape, HITS, HIT_PRICE)
    for col in ("throughput_per_cost", "benefit_per_cost"):
        base = rows[0][col]
        for row in rows:
            row[col] = row[col] / base
    return rows


def write_tables(scenario, trace_path: Path, run_dir: Path) -> None:
    """plan.json and bathtub.json for a run (the scenario in target time). A scenario
    the planner cannot size (no chips for both sites) gets neither."""
    trace = Trace.load(trace_path)
    try:
        plan, tub = plan_rows(scenario, trace), bathtub_rows(scenario, trace)
    except ValueError:
        return
    (run_dir / PLAN_FILE).write_text(json.dumps(plan, indent=2, default=_plain))
    (run_dir / BATHTUB_FILE).write_text(json.dumps(tub, default=_plain))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else str(value)


def table(rows: list[dict], scenario):
    """The planner's rows as a rich table (``testbed plan``)."""
    from rich.table import Table

    model = scenario.emulation.model if scenario.emulation else planner.DEFAULT_MODEL
    sla, spec = scenario.sla, scenario.plan
    out = Table(
        title=f"plan: {model} at {spec.target_rps:g} req/s",
        caption=f"SLA: TTFT <= {sla.ttft_s:g} s for {sla.attainment:.0%} of requests, ITL <= "
        f"{sla.itl_s:g} s. Instances of {spec.chips_per_instance} chips searched; pools are "
        "instances x chips. BCR = load / cost per hour.",
    )
    for col in ("design", "pools", "WAN", "cost/h", "BCR", "vs baseline"):
        out.add_column(col, justify="left" if col in ("design", "pools") else "right")
    for r in rows:
        if not r["feasible"]:
            out.add_row(r["design"], f"infeasible: {r['note']}", "", "", "", "")
            continue
        pools = r["pools"].replace(", ", "\n")
        vs = "baseline" if r["design"] == planner.BASELINE else f"{r['bcr_vs_baseline']:+.1%}"
        note = f"\n({r['note']})" if r["note"] else ""
        cost, bcr = f"{r['cost_per_hour']:.1f}", f"{r['bcr']:.3f}"
        out.add_row(r["design"], pools + note, r["wan"], cost, bcr, vs)
    return out
