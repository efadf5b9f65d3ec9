"""Render a run's tables and figures into one self-contained HTML file (jinja2)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from reports import plots
from reports.run_data import RunData, load_run
from reports.tables import all_tables

TEMPLATES = Path(__file__).parent / "templates"
EMPTY = {
    "relay_share": "No relay-decode system in this run: no eager tokens or handoffs to show.",
    "wan_bytes": "No KV crossed the WAN in this run.",
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
    html_tables["link_check"] = _html(pd.DataFrame(link_rows), "link_check")
    figures = {
        "ttft_cdf": plots.ttft_cdf(run), "latency": plots.latency_boxes(run),
        "wan_bytes": plots.wan_bytes_scatter(run),
        "utilisation": plots.utilisation(tables["wan_utilisation"]),
        "hit_bins": plots.hit_bins(tables["hit_distribution"]),
    }  # fmt: skip
    first = next(iter(run.systems.values()), None)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    template = env.get_template("report.html.j2")
    return template.render(
        scenario=run.scenario, run_dir=str(run.path), systems=list(run.systems),
        backend=(first.manifest.get("network", {}).get("backend") if first else None) or "none",
        commit=(first.manifest.get("git_commit") if first else None) or "unknown",
        tables={k: Markup(v) for k, v in html_tables.items()}, plots=figures,
        sla=run.scenario["sla"], prices=run.scenario["cost"]["table"],
        site_accelerators=run.scenario["cost"]["site_accelerators"],
    )  # fmt: skip


def write_report(run_dir: Path) -> Path:
    run = load_run(run_dir)
    out = Path(run_dir) / "report.html"
    out.write_text(build(run))
    return out
