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


def repeated_run(path, ttfts: list[float]):
    """A stored ``bench --seeds N`` run: one point per seed, each a complete run."""
    from testbed.cli import with_seeds

    scenario = with_seeds(Scenario.load("default"), len(ttfts))
    path.mkdir(parents=True)
    points = scenario.points()
    (path / "scenario.json").write_text(scenario.model_dump_json())
    sweep = {"sweep": scenario.sweep, "points": [label for label, _ in points]}
    (path / "sweep.json").write_text(json.dumps(sweep))
    for (label, point), ttft in zip(points, ttfts, strict=True):
        stored_run(path / label, ttft, point)
    return path, sweep["points"]


def test_a_repeated_run_is_judged_by_its_95_percent_intervals(tmp_path):
    from testbed.bench.reproduce import interval_verdicts, seed_points

    a, points = repeated_run(tmp_path / "a", [0.20, 0.22, 0.24])
    assert seed_points(a) == points and len(points) == 3
    near, _ = repeated_run(tmp_path / "near", [0.23, 0.21, 0.25])
    far, _ = repeated_run(tmp_path / "far", [0.40, 0.41, 0.42])

    def ttft(rows):
        return next(r for r in rows if r["system"] == "pdd" and r["figure"] == "ttft_p50_s")

    close = ttft(interval_verdicts(a, near, points))
    assert close["reproduced_ok"] and close["stored"] == pytest.approx(0.22)
    assert close["stored_ci95"] == pytest.approx(4.303 * 0.02 / 3**0.5, rel=1e-3)  # t(2)
    moved = ttft(interval_verdicts(a, far, points))
    assert not moved["reproduced_ok"] and moved["reproduced"] == pytest.approx(0.41)


def test_reproduce_refuses_a_sweep_over_anything_but_the_seed(tmp_path):
    from testbed.bench.reproduce import NotReproducible, seed_points

    run, _ = repeated_run(tmp_path / "seeds", [0.2, 0.2])
    (run / "sweep.json").write_text(json.dumps({"sweep": {"network.wan.rate_mbit": [25]}}))
    with pytest.raises(NotReproducible, match="reproduce one of its points"):
        seed_points(run)


def test_reproduce_checks_every_seed_before_running_anything(tmp_path):
    run, points = repeated_run(tmp_path / "seeds", [0.2, 0.2])
    (run / points[1] / "trace.jsonl").write_text("{}\n")  # the second seed's trace differs
    args = ["reproduce", str(run), "--out", str(tmp_path / "new"), "--allow-version-drift"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and points[1] in result.output
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda d: d.pop("systems"), "names no systems"),
        (lambda d: d["network"]["wan"].update(rate_mbit="fast"), "network.wan.rate_mbit"),
    ],
)
def test_a_damaged_stored_scenario_is_named_before_running_anything(tmp_path, damage, said):
    run = tmp_path / "run"
    write_point(run, Scenario(name="s"), {"same_site_pd": 0.3})
    data = json.loads((run / "scenario.json").read_text())
    damage(data)
    (run / "scenario.json").write_text(json.dumps(data))
    args = ["reproduce", str(run), "--out", str(tmp_path / "new"), "--allow-version-drift"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and said in " ".join(result.output.split())
    assert "scenario.json" in result.output and not (tmp_path / "new").exists()
