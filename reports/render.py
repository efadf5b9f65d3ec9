"""Render a run's tables and figures into one self-contained HTML file (jinja2)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from protocol.records import CUT_AT_SHUTDOWN, write_atomic
from reports import hetero, itl, plots, summary, ttft
from reports.harness import harness
from reports.run_data import RunData, load_run
from reports.sweeps import confidence, knee
from reports.tables import all_tables, sweep_table
from reports.targets import targets

TEMPLATES = Path(__file__).parent / "templates"
SEED_FIELD = "workload.generator.seed"  # a sweep over it alone: repeated runs (--seeds)
EMPTY = {
    "relay_share": "No relay-decode system in this run: no eager tokens or handoffs to show.",
    "handoffs": "No handoffs in this run.",
    "wan_bytes": "No KV crossed the WAN in this run.",
    "pacing": "No server paced its passes (no emulation in this scenario).",
    "plan": "No trace in the run directory to plan for.",
    "sensitivity": "No sensitivity table in this run (runs before it, or nothing to plan).",
    "bathtub": "No completed requests to measure.",
    "itl_while_kv_lands": "No streamed tokens to measure.",
}


def _html(frame: pd.DataFrame, key: str) -> str:
    if frame.empty:
        return f'<p class="note">{EMPTY.get(key, "Nothing to show.")}</p>'
    return frame.to_html(
        index=False, float_format=lambda x: f"{x:.4g}", na_rep="–", border=0, escape=True
    )


def build(run: RunData) -> str:
    tables = all_tables(run)
    lat = tables["latency"]
    ttft_cols = ["system", "requests", "errors"] + [c for c in lat if c.startswith("ttft")]
    rest_cols = ["system"] + [c for c in lat if c.startswith(("itl", "e2e"))]
    link_rows = [dict(system=n, **row) for n, s in run.systems.items() for row in s.link_check]
    html_tables = {k: _html(v, k) for k, v in tables.items()}
    html_tables["latency_ttft"] = _html(lat[ttft_cols], "latency")
    html_tables["latency_rest"] = _html(lat[rest_cols], "latency")
    html_tables["itl_while_kv_lands"] = _html(itl.while_kv_lands(run), "itl_while_kv_lands")
    html_tables["link_check"] = _html(pd.DataFrame(link_rows), "link_check")
    parts = ttft.breakdown(run)
    html_tables["ttft_parts"] = _html(parts, "ttft_parts")
    html_tables["prediction_error"] = _html(ttft.prediction_error(run), "prediction_error")
    html_tables["regret"] = _html(ttft.regret(run), "regret")
    html_tables["targets"] = _html(targets(run), "targets")
    figures = {
        "ttft_cdf": plots.ttft_cdf(run),
        "itl_e2e_cdfs": plots.itl_e2e_cdfs(run),
        "over_time": plots.latency_over_time(run),
        "ttft_vs_uncached": plots.ttft_vs_uncached(run),
        "latency": plots.latency_boxes(run),
        "wan_bytes": plots.wan_bytes_scatter(run),
        "utilisation": plots.utilisation(tables["wan_utilisation"]),
        "hit_bins": plots.hit_bins(tables["hit_distribution"]),
        "ttft_parts": plots.ttft_parts(parts),
    }
    html_tables["pacing"] = _html(hetero.pacing(run), "pacing")
    html_tables["cpu_share"] = _html(hetero.cpu_shares(run), "cpu_share")
    html_tables["harness"] = _html(harness(run), "harness")
    faithful = hetero.faithful(run)
    html_tables["plan"] = _html(hetero.plan(run), "plan")
    for key, frame in hetero.sensitivity(run).items():
        html_tables[f"sensitivity_{key}"] = _html(frame, "sensitivity")
    if run.emulation:
        figures["bathtub"] = plots.bathtub(hetero.bathtub(run))
    first = next(iter(run.systems.values()), None)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    template = env.get_template("report.html.j2")
    return template.render(
        scenario=run.scenario,
        run_dir=str(run.path),
        systems=list(run.systems),
        backend=(first.manifest.get("network", {}).get("backend") if first else None) or "none",
        commit=(first.manifest.get("git_commit") if first else None) or "unknown",
        tables={k: Markup(v) for k, v in html_tables.items()},
        plots=figures,
        sla=run.scenario["sla"],
        prices=run.scenario["cost"]["table"],
        site_accelerators=run.scenario["cost"]["site_accelerators"],
        emulation=run.emulation,
        target=run.target_scenario,
        unfaithful=[name for name, ok in faithful.items() if not ok],
        cut_short=cut_short(run),
        left_out=run.left_out,
    )


def cut_short(run: RunData) -> dict[str, int]:
    """Per system, the records the router wrote at its shutdown before joining their KV
    transfer (their TTFT parts are missing); systems with none are left out."""
    counts = {}
    for name, s in run.systems.items():
        fallback = s.records.get("fallback", pd.Series(dtype=object)).fillna("")
        if n := int(fallback.str.contains(CUT_AT_SHUTDOWN, regex=False).sum()):
            counts[name] = n
    return counts


def write_report(run_dir: Path) -> Path:
    """report.html, with summary.json and summary.csv beside it."""
    run = load_run(run_dir)
    out = Path(run_dir) / "report.html"
    write_atomic(out, build(run))
    summary.write(run)
    return out


def write_sweep_report(run_dir: Path) -> Path:
    """sweep.html over a sweep's points (each point keeps its own report.html)."""
    run_dir = Path(run_dir)
    sweep = json.loads((run_dir / "sweep.json").read_text())
    points = {
        p: load_run(run_dir / p)
        for p in sweep["points"]
        if (run_dir / p / "scenario.json").exists()
    }
    frame = sweep_table(points, sweep["sweep"])
    bathtub_table, bathtub_plot = "", None
    if any(k.endswith("fixed_hit") for k in sweep["sweep"]) and points:
        measured = hetero.measured_bathtub(points)
        model = hetero.bathtub(next(iter(points.values())))
        bathtub_table = _html(measured, "bathtub")
        bathtub_plot = plots.bathtub(model, measured) if not model.empty else None
    seeds = list(sweep["sweep"]) == [SEED_FIELD] and not frame.empty
    confidence_table = _html(confidence(frame), "confidence") if seeds else ""
    by_rate = any(k.endswith("rate_rps") for k in sweep["sweep"]) and not frame.empty
    knee_table = _html(knee(frame), "knee") if by_rate else ""
    keys = [k.rsplit(".", 1)[-1] for k in sweep["sweep"]]
    x, facet = keys[0], (keys[1] if len(keys) > 1 else None)
    figures = (
        {
            y: plots.sweep_lines(frame, x, facet, y, title)
            for y, title in (
                ("ttft_p90_s", "TTFT P90 (s)"),
                ("ttft_p99_s", "TTFT P99 (s)"),
                ("sla_goodput_rps", "SLA goodput (req/s)"),
                ("bcr", "BCR"),
            )
        }
        if not frame.empty
        else {}
    )
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    html = env.get_template("sweep.html.j2").render(
        scenario=json.loads((run_dir / "scenario.json").read_text()),
        run_dir=str(run_dir),
        sweep=sweep,
        missing=[p for p in sweep["points"] if p not in points],
        table=Markup(_html(frame, "sweep")),
        plots=figures,
        bathtub_table=Markup(bathtub_table),
        bathtub_plot=bathtub_plot,
        confidence=Markup(confidence_table),
        knee=Markup(knee_table),
    )
    out = run_dir / "sweep.html"
    write_atomic(out, html)
    return out


def write_reports(run_dir: Path) -> Path:
    """Every report of a run directory, from its stored records alone: report.html, or
    for a sweep each point's report.html and sweep.html. Returns the top page."""
    run_dir = Path(run_dir)
    if not (run_dir / "sweep.json").exists():
        return write_report(run_dir)
    for point in json.loads((run_dir / "sweep.json").read_text())["points"]:
        if (run_dir / point / "scenario.json").exists():
            write_report(run_dir / point)
    return write_sweep_report(run_dir)
