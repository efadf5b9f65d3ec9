"""``testbed reproduce`` up to the run itself (a stored run built here from hand-made
records stands in for a bench's): what it reads, what stops it before anything runs,
and the verdict figure by figure."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from reports import summary
from reports.run_data import load_run
from testbed.bench.reproduce import load_stored, same_trace, verdicts
from testbed.cli import app
from testbed.scenario import Scenario
from tests.reports.test_sweep_report import write_point


def stored_run(path, ttft: float, scenario: Scenario | None = None):
    scenario = scenario or Scenario.load("default")
    write_point(path, scenario, {"same_site_pd": ttft, "pdd": ttft})
    scenario.workload.materialize(path)  # its trace.jsonl, as a bench keeps it
    for system in ("same_site_pd", "pdd"):
        manifest = {"versions": {"sglang": "0.0.1-other"}}
        (path / system / "manifest.json").write_text(json.dumps(manifest))
    summary.write(load_run(path))
    return path


def test_the_stored_scenario_seeds_and_systems_are_what_reproduce_runs(tmp_path):
    stored = load_stored(stored_run(tmp_path / "run", 0.2))
    assert stored.systems == ["same_site_pd", "pdd"] and stored.scenario.name == "default"
    assert stored.versions == {"sglang": "0.0.1-other"}
    assert same_trace(stored)  # the generator's seeds give the same trace again
    (tmp_path / "run" / "trace.jsonl").write_text("{}\n")
    assert not same_trace(stored)


def test_figures_within_the_tolerance_are_reproduced_and_more_errors_are_not(tmp_path):
    a = stored_run(tmp_path / "a", 0.20)
    b = stored_run(tmp_path / "b", 0.22)
    rows = verdicts(a, b, tolerance=0.25)
    ttft = next(r for r in rows if r["system"] == "pdd" and r["figure"] == "ttft_p50_s")
    assert ttft["change"] == pytest.approx(0.1) and ttft["reproduced_ok"]
    assert not next(r for r in verdicts(a, b, tolerance=0.05) if r["figure"] == "ttft_p50_s")[
        "reproduced_ok"
    ]
    errors = next(r for r in rows if r["figure"] == "errors")
    assert errors["reproduced_ok"]


def test_reproduce_refuses_other_software_before_running_anything(tmp_path):
    run = stored_run(tmp_path / "run", 0.2)
    result = CliRunner().invoke(app, ["reproduce", str(run), "--out", str(tmp_path / "new")])
    assert result.exit_code == 2 and "sglang: stored 0.0.1-other" in result.output
    assert not (tmp_path / "new").exists()
    result = CliRunner().invoke(app, ["reproduce", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a bench run directory" in result.output
