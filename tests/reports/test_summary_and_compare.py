"""Results as data, from hand-made records (standing in for a bench's): summary.json
and summary.csv carry every system's figures and error kinds; ``testbed compare``
puts two runs side by side with the change."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from reports import summary
from reports.compare import compare
from reports.run_data import load_run
from testbed.cli import app
from testbed.scenario import Scenario
from tests.reports.test_sweep_report import write_point


def test_summary_files_hold_every_system_with_percentiles_and_error_kinds(tmp_path):
    run = tmp_path / "run"
    write_point(run, Scenario(name="s"), {"colocated": 0.2, "same_site_pd": 0.4})
    with open(run / "colocated" / "records.jsonl", "a") as f:  # two failures of two kinds
        for i, status in enumerate(("rejected", "upstream_error")):
            f.write(
                json.dumps(
                    {
                        "request_id": f"bad{i}",
                        "system": "colocated",
                        "endpoint": "/generate",
                        "arrival": 20.0,
                        "finish": 20.1,
                        "status": status,
                        "error": "x",
                    }
                )
                + "\n"
            )
    json_path, csv_path = summary.write(load_run(run))
    doc = json.loads(json_path.read_text())
    assert doc["schema_version"] == 1
    rows = {r["system"]: r for r in doc["systems"]}
    col = rows["colocated"]
    assert col["requests"] == 12 and col["ok"] == 10
    assert col["errors"] == {"rejected": 1, "upstream_error": 1}
    assert col["ttft_p50_s"] == pytest.approx(0.2) and col["ttft_std_s"] == pytest.approx(0)
    assert col["itl_p99_s"] == pytest.approx(0.05) and col["tpot_mean_s"] == pytest.approx(0.05)
    assert rows["same_site_pd"]["ttft_p90_s"] == pytest.approx(0.4)
    for key in ("sla_goodput_rps", "bcr", "requests_per_s", "output_tokens_per_s", "wan_kv_bytes"):
        assert key in col
    with open(csv_path) as f:
        table = {r["system"]: r for r in csv.DictReader(f)}
    assert table["colocated"]["errors_rejected"] == "1"
    assert table["same_site_pd"]["errors_rejected"] == "0"
    assert float(table["same_site_pd"]["ttft_p50_s"]) == pytest.approx(0.4)


def test_summary_json_validates_against_its_schema_and_matches_the_html_tables(tmp_path):
    import io

    import jsonschema
    import pandas as pd

    from reports.render import write_report

    # The shipped schema is the model's (regenerate: reports.summary.json_schema()).
    shipped = json.loads(summary.SCHEMA_FILE.read_text())
    assert shipped == summary.json_schema()
    run = tmp_path / "run"
    write_point(run, Scenario(name="s"), {"colocated": 0.2, "pdd": 0.35})
    html = write_report(run).read_text()
    doc = json.loads((run / "summary.json").read_text())
    jsonschema.validate(doc, shipped)
    with pytest.raises(jsonschema.ValidationError):  # the schema does say something
        jsonschema.validate({**doc, "systems": [{"system": "x"}]}, shipped)
    tables = pd.read_html(io.StringIO(html))
    ttft = next(t for t in tables if "ttft_p50_s" in t.columns).set_index("system")
    money = next(t for t in tables if "sla_goodput_rps" in t.columns).set_index("system")
    for row in doc["systems"]:
        name = row["system"]
        assert ttft.loc[name, "requests"] == row["requests"]
        for col in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"):
            assert float(ttft.loc[name, col]) == pytest.approx(row[col], rel=1e-3), col
        for col in ("sla_goodput_rps", "bcr"):
            assert float(money.loc[name, col]) == pytest.approx(row[col], rel=1e-3), col


def test_compare_gives_each_runs_value_and_the_change(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_point(a, Scenario(name="s"), {"pdd": 0.2})
    write_point(b, Scenario(name="s"), {"pdd": 0.3})
    frame = compare([a, b])
    row = frame[(frame.system == "pdd") & (frame.metric == "ttft_p50_s")].iloc[0]
    assert row["a"] == pytest.approx(0.2) and row["b"] == pytest.approx(0.3)
    assert row["change b"] == pytest.approx(0.5)
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "c.html")])
    assert result.exit_code == 0 and "+50.0%" in result.output
    assert "ttft_p50_s" in (tmp_path / "c.html").read_text()
    result = CliRunner().invoke(app, ["compare", str(a), str(tmp_path / "missing")])
    assert result.exit_code == 2 and "error" in result.output


def test_repeated_seeds_give_a_mean_and_95_percent_interval(tmp_path):
    from reports.render import write_reports
    from reports.sweeps import confidence
    from reports.tables import sweep_table
    from testbed.cli import with_seeds

    scenario = with_seeds(Scenario.load("default"), 3)
    labels = [label for label, _ in scenario.points()]
    (tmp_path / "scenario.json").write_text(scenario.model_dump_json())
    sweep = {"sweep": scenario.sweep, "points": labels}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    points = [p for _, p in scenario.points()]
    for label, point, ttft in zip(labels, points, (0.2, 0.3, 0.4), strict=True):
        write_point(tmp_path / label, point, {"pdd": ttft})
    frame = sweep_table({p: load_run(tmp_path / p) for p in labels}, scenario.sweep)
    row = confidence(frame).iloc[0]
    assert row["runs"] == 3 and row["ttft_p50_s_mean"] == pytest.approx(0.3)
    # t(0.975, 2) = 4.303; sd = 0.1; half width = 4.303 * 0.1 / sqrt(3)
    assert row["ttft_p50_s_ci95"] == pytest.approx(4.303 * 0.1 / 3**0.5, rel=1e-3)
    page = write_reports(tmp_path).read_text()
    assert "95% confidence interval" in page
    with pytest.raises(Exception, match="sweep already"):
        with_seeds(scenario, 2)


def test_the_knee_is_the_highest_rate_still_served_within_the_sla():
    import pandas as pd

    from reports.sweeps import knee

    frame = pd.DataFrame(
        {
            "system": ["pdd"] * 4 + ["cross_site_pd"] * 4,
            "rate_rps": [1, 2, 4, 8] * 2,
            "sla_goodput_rps": [1.0, 1.95, 3.7, 4.1, 0.95, 1.5, 1.6, 1.2],
        }
    )
    rows = knee(frame).set_index("system")
    assert rows.loc["pdd", "knee_rps"] == 4 and rows.loc["pdd", "max_goodput_rps"] == 4.1
    assert rows.loc["cross_site_pd", "knee_rps"] == 1


def test_the_report_names_the_records_the_router_cut_short_at_its_shutdown(tmp_path):
    """A record the router wrote at its shutdown before joining its KV transfer (it
    waited for prefill's answer) lacks its TTFT parts: the report says which systems
    have such records and how many, above everything else."""
    from protocol.records import CUT_AT_SHUTDOWN
    from reports.render import write_report

    run = tmp_path / "run"
    write_point(run, Scenario(name="s"), {"colocated": 0.2, "pdd": 0.35})
    assert "Records cut short" not in write_report(run).read_text()
    path = run / "pdd" / "records.jsonl"
    first, *rest = path.read_text().splitlines()
    cut = {**json.loads(first), "fallback": f"relay decode finished first; {CUT_AT_SHUTDOWN}"}
    path.write_text("\n".join([json.dumps(cut), *rest]) + "\n")
    assert "Records cut short: pdd 1.</b>" in write_report(run).read_text()


def test_the_report_names_the_scenarios_systems_it_has_no_results_for(tmp_path):
    """A system that failed (its INCOMPLETE says why), was cut before its COMPLETE, or
    never ran is named with the reason above everything else and in summary.json: it
    was left out silently, and every comparison with it just went missing."""
    from reports.render import write_report

    run = tmp_path / "run"
    systems = {"colocated": 0.2, "same_site_pd": 0.3, "cross_site_pd": 0.5, "pdd": 0.35}
    write_point(run, Scenario(name="s"), systems)
    assert "Left out" not in write_report(run).read_text()
    (run / "cross_site_pd" / "INCOMPLETE").write_text("DeploymentDied: decode-md1 exited 1\n")
    (run / "pdd" / "COMPLETE").unlink()
    scenario = json.loads((run / "scenario.json").read_text())
    scenario["systems"].append("pdd_threshold")  # its turn never came
    (run / "scenario.json").write_text(json.dumps(scenario))
    page = write_report(run).read_text()
    assert "Left out of this report: cross_site_pd, pdd, pdd_threshold</b>" in page
    assert "decode-md1 exited 1" in page and "no COMPLETE marker" in page
    assert "did not run" in page
    left = json.loads((run / "summary.json").read_text())["left_out"]
    assert set(left) == {"cross_site_pd", "pdd", "pdd_threshold"}
    assert [row["system"] for row in json.loads((run / "summary.json").read_text())["systems"]] == [
        "colocated",
        "same_site_pd",
    ]


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("scenario.json", "nope", "scenario.json: not the JSON a run writes"),
        ("scenario.json", "[1]", "scenario.json: not the JSON a run writes (an object expected)"),
        ("pdd/cost.json", "[1,2", "cost.json: not the JSON a run writes"),
        ("pdd/manifest.json", "\xff", "manifest.json: not the JSON a run writes"),
        ("pdd/cpu.json", "{}", "cpu.json: not the JSON a run writes (an array expected)"),
        ("pdd/records.parquet", "garbage", "records.parquet: not a readable Parquet file"),
    ],
)
def test_a_stored_runs_damaged_file_is_named_and_no_report_is_written(
    tmp_path, name, content, said
):
    """A reviewer's copy of a run with a file cut short or overwritten: `testbed report`
    says which and exits 2 (it printed a traceback)."""
    run = tmp_path / "run"
    write_point(run, Scenario(name="s"), {"same_site_pd": 0.3, "pdd": 0.35})
    (run / name).write_text(content, encoding="latin-1")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2
    assert said.replace(" ", "") in "".join(result.output.split())  # the console wraps
    assert not (run / "report.html").exists()
