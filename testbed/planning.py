"""The capacity planner and the bathtub model for a scenario: their inputs from the
scenario and its trace, their tables for ``testbed plan``, the planner's sensitivity to
its assumptions, and the files a bench run keeps (``plan.json``, ``sensitivity.json``,
``bathtub.json``) so that reports render them without re-running a model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from capacity import plan as planner
from capacity.bathtub import HIT_PRICE, HITS, bathtub
from capacity.profiles import devices, models
from workloads.analysis import arrival_order, hit_ratios
from workloads.trace import Trace

PLAN_FILE, SENSITIVITY_FILE, BATHTUB_FILE = "plan.json", "sensitivity.json", "bathtub.json"
PAPER_BCR_GAIN = 0.375  # PDD.md: BCR up to +37.5% over same-site homogeneous PD


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


# The assumptions the sensitivity table varies, one at a time from the scenario's: site
# B's chip price (relative per chip-hour; PDD.md prices GPU-B 20-30% above GPU-A) and
# memory bandwidth (times its profile's), and the trace's mean prefix hit.
B_PRICES = (0.6, 0.8, 1.0, 1.1, 1.2, 1.25, 1.3, 1.5)
B_BANDWIDTH_SCALES = (0.75, 1.0, 1.25, 1.5, 2.0)
MEAN_HITS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
REACHING_HITS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99)


def with_mean_hit(requests: tuple[planner.Req, ...], target: float) -> tuple[planner.Req, ...]:
    """The requests with their prefix hits moved so that their mean is ``target``: each
    hit scaled down towards 0, or up towards 1 in proportion to what it lacks of a full
    hit (the order of requests by hit is kept; a request with no hit stays without one
    only when the mean goes down)."""
    hits = _hits(requests)
    mean = _mean_hit(requests)
    if target <= mean:
        moved = hits * (target / mean) if mean else hits
    else:
        moved = hits + (1 - hits) * (target - mean) / (1 - mean)
    return tuple(
        dataclasses.replace(r, cached=min(r.n_in, round(h * r.n_in)))
        for r, h in zip(requests, moved, strict=True)
    )


def sensitivity(
    scenario,
    trace: Trace,
    prices: tuple[float, ...] = B_PRICES,
    bandwidth_scales: tuple[float, ...] = B_BANDWIDTH_SCALES,
    hits: tuple[float, ...] = MEAN_HITS,
    reaching_hits: tuple[float, ...] = REACHING_HITS,
) -> dict[str, list[dict]]:
    """How the planner's BCR gains over same_site_pd move with its assumptions.

    ``one_at_a_time``: pdd's and cross_site_pd's gain with one assumption changed from
    the scenario's (site B's chip price, its memory bandwidth, the trace's mean prefix
    hit), the scenario's own value marked, and whether pdd reaches PDD.md's +37.5%.
    ``reaching_paper``: per site-B price, the lowest mean hit (of ``reaching_hits``) at
    which pdd reaches +37.5%, and its gain there (none: not even at the highest)."""
    x = inputs(scenario, trace)
    b = x.devices["B"]
    own_hit = _mean_hit(x.requests)
    cases = [("none: the scenario's", f"{b.name} {b.price:g}, {_bw(b)}, hit {own_hit:.0%}", x)]
    cases += [(f"{b.name} price", f"{p:g}", _priced(x, p)) for p in prices]
    for scale in bandwidth_scales:
        chip = dataclasses.replace(
            b.chip, memory_bandwidth_tbps=b.chip.memory_bandwidth_tbps * scale
        )
        device = dataclasses.replace(b, chip=chip)
        cases.append((f"{b.name} memory bandwidth", _bw(device), _with_device(x, "B", device)))
    cases += [("mean prefix hit", f"{h:.0%}", _hit(x, h)) for h in hits]
    own = {f"{b.name} price": f"{b.price:g}", f"{b.name} memory bandwidth": _bw(b)}
    own["mean prefix hit"] = f"{own_hit:.0%}"
    rows = []
    for assumption, value, case in cases:
        gain = _gains(case, scenario.plan.target_rps)
        rows.append(
            {
                "assumption": assumption,
                "value": value,
                "scenario's": assumption.startswith("none") or own.get(assumption) == value,
                "pdd_bcr_vs_same_site": gain.get("pdd"),
                "cross_site_bcr_vs_same_site": gain.get("cross_site_pd"),
                "reaches_paper": _at_paper(gain.get("pdd")),
            }
        )
    reaching = []
    for price in prices:
        found = None
        top = max(reaching_hits)  # not even there: none lower (the gain grows with the hit)
        if _reaches(_hit(_priced(x, price), top), scenario.plan.target_rps) is not None:
            for hit in sorted(reaching_hits):
                gain = _reaches(_hit(_priced(x, price), hit), scenario.plan.target_rps)
                if gain is not None:
                    found = (hit, gain)
                    break
        reaching.append(
            {
                f"{b.name} price": price,
                "lowest mean hit reaching +37.5%": None if found is None else found[0],
                "pdd_bcr_vs_same_site": None if found is None else found[1],
            }
        )
    return {"one_at_a_time": rows, "reaching_paper": reaching}


def _reaches(x: planner.Inputs, rps: float) -> float | None:
    """pdd's BCR gain if it reaches PDD.md's +37.5%, else None."""
    gain = _gains(x, rps).get("pdd")
    return gain if _at_paper(gain) else None


def _at_paper(gain: float | None) -> bool:
    return gain is not None and gain >= PAPER_BCR_GAIN


def _gains(x: planner.Inputs, rps: float) -> dict[str, float | None]:
    return {r["design"]: r["bcr_vs_baseline"] for r in planner.rows(planner.plan_all(x), rps)}


def _hits(requests) -> np.ndarray:
    """Each request's prefix hit (a request without input: none)."""
    return np.array([r.cached / r.n_in if r.n_in else 0.0 for r in requests])


def _mean_hit(requests) -> float:
    hits = _hits(requests)
    return float(hits.mean()) if len(hits) else 0.0


def _bw(device: planner.Device) -> str:
    return f"{device.chip.memory_bandwidth_tbps:g} TB/s"


def _with_device(x: planner.Inputs, site: str, device: planner.Device) -> planner.Inputs:
    return dataclasses.replace(x, devices={**x.devices, site: device})


def _priced(x: planner.Inputs, price: float) -> planner.Inputs:
    return _with_device(x, "B", dataclasses.replace(x.devices["B"], price=price))


def _hit(x: planner.Inputs, hit: float) -> planner.Inputs:
    return dataclasses.replace(x, requests=with_mean_hit(x.requests, hit))


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
    """plan.json, sensitivity.json and bathtub.json for a run (the scenario in target
    time). A scenario the planner cannot size (no chips for both sites) gets none."""
    trace = Trace.load(trace_path)
    try:
        plan, tub = plan_rows(scenario, trace), bathtub_rows(scenario, trace)
        table = sensitivity(scenario, trace)
    except ValueError:
        return
    (run_dir / PLAN_FILE).write_text(json.dumps(plan, indent=2, default=_plain))
    (run_dir / SENSITIVITY_FILE).write_text(json.dumps(table, indent=2, default=_plain))
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


def rows_table(rows: list[dict], title: str):
    """Plain rows (one dict each) as a rich table; numbers to three decimals."""
    from rich.table import Table

    out = Table(title=title)
    for col in rows[0] if rows else ():
        out.add_column(col)
    for row in rows:
        out.add_row(*(_cell(v) for v in row.values()))
    return out


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
